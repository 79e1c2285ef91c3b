"""Spec -> text, pure: command lines and environments, the per-host plan, the NVIDIA stack, the control
machine's URLs, the units' exposure targets, which router loses which workers while hosts are down."""
