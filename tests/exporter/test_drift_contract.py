"""The drift check's flag -> /server_info key mapping, against SGLang's own parsers.

For every pinned SGLang release whose parser virtualenv exists (`bash .ci/contract-env.sh`),
every flag SGLang accepts must map to the argparse dest it really sets (the ServerArgs field
/server_info reports), or be listed as not comparable. When a pin moves and SGLang adds a flag
whose dest is not its own name, this names the entries to add to pdkit/agent/exporter/drift.py.
"""

from __future__ import annotations

import pytest

from pdkit.agent.exporter.drift import NEGATED, UNCOMPARABLE, flag_key
from pdkit.upstream.versions import SGLANG_RELEASES
from tests.conftest import require

pytestmark = pytest.mark.contract

contract = pytest.importorskip("pdkit.contract")
from pdkit.upstream import venvs  # noqa: E402


@pytest.mark.parametrize("version", sorted(SGLANG_RELEASES))
def test_every_sglang_flag_maps_to_its_server_info_key(version):
    require(venvs.sglang_python(version) is not None, f"no SGLang {version} parser venv: run `bash .ci/contract-env.sh`")
    options = contract.run_sglang_check(version, [], describe=True)["options"]
    assert len(options) > 300
    wrong = []
    for option in options:
        if option["action"] == "_HelpAction":
            continue
        for flag in option["flags"]:
            if not flag.startswith("--") or flag in UNCOMPARABLE:
                continue
            if option["action"] in ("_StoreConstAction", "DeprecatedStoreConstAction", "DeprecatedAction"):
                wrong.append(f'{flag}: {option["action"]}, add it to UNCOMPARABLE')
            elif option["action"] == "BooleanOptionalAction" and flag.startswith("--no-"):
                if NEGATED.get(flag) != option["dest"]:
                    wrong.append(f'NEGATED["{flag}"] = "{option["dest"]}"')
            elif flag_key(flag) != option["dest"]:
                wrong.append(f'FLAG_DEST["{flag}"] = "{option["dest"]}"')
    assert not wrong, f"SGLang {version}: " + "; ".join(wrong)
