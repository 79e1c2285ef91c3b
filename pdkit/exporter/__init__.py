"""`python -m pdkit.exporter`: the path pdkit-exporter's unit names (pdkit/exporter/__main__.py runs
pdkit/agent/exporter/). Nothing imports this package."""
