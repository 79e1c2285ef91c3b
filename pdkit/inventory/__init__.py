"""Inventory file -> validated spec, without touching a host: the loader, the field table its errors
quote, the one-screen summary `pdkit validate` prints."""
