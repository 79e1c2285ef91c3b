"""Run every custom fact's command on THIS machine and write {fact: {command, output}} as JSON.

For capturing real outputs on a GPU machine (the lent H200): `python3 -m tests.node.capture_facts OUT.json`.
"""

import json
import subprocess
import sys

from roles.node_facts import NODE_FACTS


def main(path: str) -> None:
    captured = {}
    for name, cls in NODE_FACTS.items():
        command = cls().command()
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        captured[cls.__name__] = {"command": command, "rc": proc.returncode, "output": proc.stdout.splitlines(), "stderr": proc.stderr.splitlines()}
    with open(path, "w") as f:
        json.dump(captured, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
