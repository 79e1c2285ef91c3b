"""`pdkit stage` (issue 47 items 5 and 6): model weights staged on the nodes, verified against SGLang's
SHA-256 manifest, switched atomically. The node's side (layout, manifest, the switch) is
pdkit/agent/weightstore.py, recorded per release by pdkit/agent/releases.py. docs/weights.md."""
