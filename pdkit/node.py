"""The NVIDIA stack as data moved to pdkit/render/node.py (issue 48); the apt source it writes on a node,
kept byte-identical since, still cites `pdkit/node.py`. Nothing imports this module."""
