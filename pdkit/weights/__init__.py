"""Model weights on the nodes (issue 47 items 5 and 6): staged, verified against SGLang's SHA-256
manifest, switched atomically (`store`: the node's side, `stage`: `pdkit stage`); recorded per release
by pdkit/releases.py. docs/weights.md."""
