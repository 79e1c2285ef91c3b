"""Inside a pyinfra run or over SSH to the nodes: the deploy's glue, host facts and the probes they run
(programs kept as .py files and sent as text), preflight, router sync, silences, GPU health before a
drain, systemd-nspawn hosts. Standard library only here: gpu/nspawn/host.py imports nspawn_common on a
bare python3 and this file runs first."""
