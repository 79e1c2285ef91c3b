"""Every Python package a node installs, fetched and locked on the control machine: the wheelhouse, the
engine locks (locks/), platform tags, install shards and the bundle server."""
