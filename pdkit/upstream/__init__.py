"""What the pinned SGLang, router and UCX releases are, as data: versions, parser and metric tables,
start-up checks, UCX settings, the contract venvs. Standard library only; runs anywhere, the nodes
included (rank 0 of tests/test_layering.py's RANKS: imports nothing else of pdkit)."""
