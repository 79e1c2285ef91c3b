"""The KV hand-off cost model moved to pdkit/spec/kvcost.py (issue 48); the KV rate alert's description and two
dashboard panels, rendered byte-identical since, still cite `pdkit.kvcost`. Nothing imports this module."""
