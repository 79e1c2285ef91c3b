"""Data every host of every pdkit inventory gets (pyinfra merges it under each inventory's own).

Keep cluster settings out of here: this directory is shared by every inventory file beside it,
and pyinfra lets group_data win over a group's data given in the inventory file itself.
"""

# Refuse unknown SSH host keys instead of trusting them on first use: add hosts to
# known_hosts out of band (the lab writes its own file from the containers' key files).
ssh_strict_host_key_checking = "yes"
