#!/usr/bin/env bash
# Build the contract virtualenvs: one per pinned parser that pdkit's generated command
# lines are checked against (pdkit/contract, tests/test_contract_parsers.py).
#
#   ${PDKIT_CONTRACT_HOME:-$HOME/.cache/pdkit/contract}/
#     sglang-0.5.17/  sglang-0.5.23/    Python 3.11, CPU torch 2.13.0 (local wheel),
#                                       sglang --no-deps + only what
#                                       sglang.srt.server_args needs to import,
#                                       and prometheus-client for the metric
#                                       collectors (pdkit/contract/sglang_metrics.py)
#     smg-1.13.0/  sglang-router-0.3.2/ the router packages (they cannot share an env:
#                                       both install an `smg` command)
#
# Every env is installed from the exact closure listed below with --no-deps (no
# resolver run, the same files on every machine), smoke-tested with the checker that
# will use it, and marked complete by a file written last. A complete, unchanged env is
# skipped; when all are, the script returns at once. Change a list (or LAYOUT) and the
# env is rebuilt on the next run.
#
# Knobs: PDKIT_CONTRACT_HOME, PDKIT_CONTRACT_PYTHON (a Python 3.11), PIP_CACHE_DIR
# (pip's cache, shared by all envs; default ~/.cache/pip).
set -euo pipefail

LAYOUT=1 # bump to rebuild every env
HOME_DIR="${PDKIT_CONTRACT_HOME:-$HOME/.cache/pdkit/contract}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MARKER=.contract-env-ok
ENVS=(sglang-0.5.17 sglang-0.5.23 smg-1.13.0 sglang-router-0.3.2)

log() { echo "contract-env: $*"; }
die() {
    echo "contract-env: ERROR: $*" >&2
    exit 1
}

# The closure of each env, exact pins. torch 2.13.0+cpu is the CPU build that pip's
# find-links directory on these machines holds (PyPI only has the CUDA build).
requirements() {
    case "$1" in
    sglang-0.5.17)
        # 0.5.17 imports torchvision (decode_jpeg), transformers, xgrammar, openai ...
        # at module level on the way to server_args.
        cat <<'EOF'
torch==2.13.0+cpu
sglang==0.5.17
torchvision==0.28.0
xgrammar==0.2.1
apache-tvm-ffi==0.1.11
transformers==5.12.1
openai==2.6.1
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
asttokens==3.0.2
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
click==8.5.1
dill==0.4.1
distro==1.9.0
executing==2.3.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpx==0.28.1
huggingface_hub==1.33.0
idna==3.20
ipython==9.18.1
ipython_pygments_lexers==1.1.1
jedi==0.20.1
Jinja2==3.1.6
jiter==0.19.0
markdown-it-py==4.3.0
MarkupSafe==3.0.4
matplotlib-inline==0.2.2
mdurl==0.1.2
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
numpy==2.4.6
orjson==3.13.0
packaging==26.4
parso==0.8.7
partial-json-parser==0.2.1.1.post7
pexpect==4.9.0
pillow==13.0.0
prometheus-client==0.26.0
prompt_toolkit==3.0.53
propcache==0.5.4
psutil==7.2.2
ptyprocess==0.7.0
pure_eval==0.2.4
pybase64==1.5.1
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
pyzmq==27.3.0
regex==2026.11.19
requests==2.34.2
rich==15.0.0
safetensors==0.8.0
sentencepiece==0.2.3
shellingham==1.5.4
sniffio==1.3.1
stack-data==0.6.3
starlette==1.10.0
sympy==1.14.0
tokenizers==0.22.2
tqdm==4.70.1
traitlets==5.16.1
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
wcwidth==0.9.4
yarl==1.25.1
EOF
        ;;
    sglang-0.5.23)
        # 0.5.23's server_args import is much lighter: no transformers, no torchvision.
        # PyYAML is only for checking argvs that use --config.
        cat <<'EOF'
torch==2.13.0+cpu
sglang==0.5.23
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-types==0.8.0
anyio==4.16.0
asttokens==3.0.2
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
executing==2.3.0
filelock==4.3.1
frozenlist==1.8.0
fsspec==2026.9.0
idna==3.20
ipython==9.18.1
ipython_pygments_lexers==1.1.1
jedi==0.20.1
Jinja2==3.1.6
MarkupSafe==3.0.4
matplotlib-inline==0.2.2
mpmath==1.3.0
msgspec==0.23.0
multidict==7.2.1
networkx==3.6.1
numpy==2.4.6
orjson==3.13.0
packaging==26.4
parso==0.8.7
pexpect==4.9.0
pillow==13.0.0
prometheus-client==0.26.0
prompt_toolkit==3.0.53
propcache==0.5.4
psutil==7.2.2
ptyprocess==0.7.0
pure_eval==0.2.4
pybase64==1.5.1
pydantic==2.14.4
pydantic_core==2.50.5
Pygments==2.21.0
PyYAML==6.0.4
pyzmq==27.3.0
requests==2.34.2
stack-data==0.6.3
starlette==1.10.0
sympy==1.14.0
tqdm==4.70.1
traitlets==5.16.1
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
wcwidth==0.9.4
yarl==1.25.1
EOF
        ;;
    smg-1.13.0)
        cat <<'EOF'
smg==1.13.0
grpcio==1.85.3
grpcio-health-checking==1.85.1
protobuf==7.36.2
PyYAML==6.0.4
setproctitle==1.3.8
typing_extensions==4.16.0
EOF
        ;;
    sglang-router-0.3.2)
        cat <<'EOF'
sglang-router==0.3.2
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
click==8.5.1
fastapi==0.165.0
frozenlist==1.8.0
h11==0.16.0
idna==3.20
multidict==7.2.1
opentelemetry-api==1.45.2
orjson==3.13.0
propcache==0.5.4
pydantic==2.14.4
pydantic_core==2.50.5
setproctitle==1.3.8
starlette==1.10.0
typing-inspection==0.4.5
typing_extensions==4.16.0
uvicorn==0.54.0
yarl==1.25.1
EOF
        ;;
    *) die "unknown env $1" ;;
    esac
}

# One request per env, run through the checker that will use it: the env is complete
# only once its parser answers.
smoke() {
    local name=$1 py=$2 request checker
    case "$name" in # sglang-router-* before sglang-*
    sglang-router-*)
        checker="$REPO_ROOT/pdkit/contract/router_argcheck.py"
        request='{"package": "sglang-router", "argvs": [["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998", "--decode", "http://127.0.0.1:30001"], ["--no-such-flag"]]}'
        ;;
    sglang-*)
        checker="$REPO_ROOT/pdkit/contract/sglang_argcheck.py"
        request='{"argvs": [["--model-path", "/models/m", "--tp-size", "2", "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"], ["--disaggregation-transfer-backend", "nixel"]]}'
        ;;
    smg-*)
        checker="$REPO_ROOT/pdkit/contract/router_argcheck.py"
        request='{"package": "smg", "argvs": [["launch", "--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998", "--decode", "http://127.0.0.1:30001"], ["launch", "--no-such-flag"]]}'
        ;;
    esac
    local want_version=${name##*-} reply
    if ! reply=$(HF_HUB_OFFLINE=1 "$py" "$checker" <<<"$request" 2>"$HOME_DIR/$name.smoke.log"); then
        tail -n 30 "$HOME_DIR/$name.smoke.log" >&2
        die "$name: smoke check failed (reply: ${reply:0:400})"
    fi
    if ! "$py" -c '
import json, sys
reply, version = json.loads(sys.argv[1]), sys.argv[2]
r = reply.get("results") or []
ok = reply.get("version") == version and len(r) == 2 and r[0]["ok"] and not r[1]["ok"]
sys.exit(0 if ok else 1)
' "$reply" "$want_version"; then
        die "$name: smoke check gave an unexpected answer: ${reply:0:800}"
    fi
    rm -f "$HOME_DIR/$name.smoke.log"
    case "$name" in
    sglang-router-* | smg-*) ;;
    sglang-*) # the metric catalogue's generator must construct SGLang's collectors here
        if ! HF_HUB_OFFLINE=1 "$py" "$REPO_ROOT/pdkit/contract/sglang_metrics.py" >"$HOME_DIR/$name.metrics.json" \
            2>"$HOME_DIR/$name.smoke.log"; then
            tail -n 30 "$HOME_DIR/$name.smoke.log" >&2
            die "$name: sglang_metrics.py failed"
        fi
        rm -f "$HOME_DIR/$name.smoke.log" "$HOME_DIR/$name.metrics.json"
        ;;
    esac
}

find_python() {
    local c
    for c in "${PDKIT_CONTRACT_PYTHON:-}" python3.11 "$HOME"/.pyenv/versions/3.11*/bin/python3.11 /usr/local/bin/python3.11 /usr/bin/python3.11; do
        [[ -n "$c" ]] || continue
        command -v "$c" >/dev/null 2>&1 || continue
        if "$c" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' >/dev/null 2>&1; then
            "$c" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    return 1
}

spec_hash() { # env name -> hash of everything that decides its contents
    { echo "layout=$LAYOUT python=$PY_ID"; requirements "$1"; } | sha256sum | cut -c1-16
}

env_complete() { # name hash
    [[ -x "$HOME_DIR/$1/bin/python" && -f "$HOME_DIR/$1/$MARKER" && "$(cat "$HOME_DIR/$1/$MARKER")" == "$2" ]]
}

build_env() {
    local name=$1 want=$2 venv="$HOME_DIR/$1" start=$SECONDS pip_log="$HOME_DIR/$1.pip.log"
    log "creating $name ..."
    rm -rf "$venv"
    "$PY" -m venv "$venv" || die "$name: python -m venv failed"
    requirements "$name" >"$venv/contract-requirements.txt"
    # Quiet on success; the whole pip log (less the noise about index locations that
    # do not exist on this machine) on failure.
    if ! "$venv/bin/python" -m pip install --no-deps --no-compile --disable-pip-version-check \
        -r "$venv/contract-requirements.txt" >"$pip_log" 2>&1; then
        grep -v -E "^WARNING: Location '.*' is ignored" "$pip_log" | tail -n 40 >&2 || true
        if grep -q "torch==2.13.0+cpu" "$pip_log"; then
            echo "contract-env: hint: torch 2.13.0+cpu comes from pip's find-links wheel directory (pip config list)" >&2
        fi
        die "$name: pip install failed (full log: $pip_log)"
    fi
    rm -f "$pip_log"
    smoke "$name" "$venv/bin/python"
    echo "$want" >"$venv/$MARKER" # last: the env is complete
    log "$name ready ($((SECONDS - start)) s)"
}

# The nixl-cu13 wheel the engines' locks pin (pdkit/upstream/versions.py NIXL_PACKAGE), not installed: the
# UCX it bundles is read by pdkit/contract/ucx_config.py (tests/test_contract_ucx.py). 56 MiB, once.
NIXL_WHEEL_DIR=nixl-cu13-1.5.1
fetch_nixl_wheel() {
    local dir="$HOME_DIR/$NIXL_WHEEL_DIR" start=$SECONDS
    if compgen -G "$dir/nixl_cu13-1.5.1-*.whl" >/dev/null; then
        log "$NIXL_WHEEL_DIR wheel present"
        return 0
    fi
    log "downloading the nixl-cu13 1.5.1 wheel ..."
    mkdir -p "$dir.tmp"
    "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check --quiet \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        -d "$dir.tmp" nixl-cu13==1.5.1 || die "pip download nixl-cu13==1.5.1 failed"
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    log "$NIXL_WHEEL_DIR wheel ready ($((SECONDS - start)) s)"
}

main() {
    local start=$SECONDS name want all_hash
    mkdir -p "$HOME_DIR"
    exec 9>"$HOME_DIR/.lock"
    flock 9 # one builder at a time per home

    PY=$(find_python) || die "no Python 3.11 with venv and ensurepip found: set PDKIT_CONTRACT_PYTHON"
    PY_ID="$PY $("$PY" -c 'import platform; print(platform.python_version())')"
    fetch_nixl_wheel

    all_hash=$(for name in "${ENVS[@]}"; do spec_hash "$name"; done | sha256sum | cut -c1-16)
    if [[ -f "$HOME_DIR/.complete" && "$(cat "$HOME_DIR/.complete")" == "$all_hash" ]]; then
        local intact=1
        for name in "${ENVS[@]}"; do env_complete "$name" "$(spec_hash "$name")" || intact=0; done
        if ((intact)); then
            log "all ${#ENVS[@]} envs up to date under $HOME_DIR"
            return 0
        fi
    fi
    rm -f "$HOME_DIR/.complete"

    log "building under $HOME_DIR with $PY_ID"
    for name in "${ENVS[@]}"; do
        want=$(spec_hash "$name")
        if env_complete "$name" "$want"; then
            log "$name up to date"
        else
            build_env "$name" "$want"
        fi
    done
    echo "$all_hash" >"$HOME_DIR/.complete"
    log "all ${#ENVS[@]} envs ready under $HOME_DIR ($((SECONDS - start)) s):" \
        "$(cd "$HOME_DIR" && du -sh "${ENVS[@]}" 2>/dev/null | awk '{printf "%s %s; ", $2, $1}')"
}

main "$@"
