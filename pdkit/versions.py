"""The pinned versions moved to pdkit/upstream/versions.py (issue 48); the NCCL apt pin written on a node,
kept byte-identical since, still cites `pdkit/versions.py`. Nothing imports this module."""
