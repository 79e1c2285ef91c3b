#!/usr/bin/env bash
# Two systemd hosts sharing the lent H200 (inventories/h200-nspawn-pair.py): pdkit's own deploy,
# roll under load, a broken canary restored byte for byte, doctor, bench and a tune campaign, all
# from the lent machine's shell over real SSH. docs/gpu.md ("Two hosts on one GPU") has the calls.
#
#   bash gpu/nspawn/device_pair.sh PHASE...      phases, in order: up converge check roll tune fault down
#
# fault: each prefill of $FAULT_VICTIMS (pdkit-b) killed with SIGKILL under C=8 streaming load
# (gpu/nspawn/outage_client.py, --timeout 120: a hang), the engines' failure counters and the
# router's before and after, the time to /health 200, the journals from 30 s before the kill
# (gpu/nspawn/fault.py; docs/gpu.md, "Prefill kill with the fault budget").
# PDKIT_NSPAWN_XFER_PROBE=0 skips up's xfer-probe (the engines then use TCP with CUDA copies).
#
# Each phase's steps are timed into $OUT/steps.txt, their output in $OUT/<step>.log. Run after
# calls 1 and 2 (host.py unpack's tarballs stashed in /root/stash, control venv in /root/pdkit-venv).
# PDKIT_NSPAWN_REHEARSAL=1: the same on a machine without a GPU (nspawn-pair-rehearsal.py, the sim).
set -u
OUT=${OUT:-/tmp/pdkit-pair-out}
mkdir -p "$OUT"
P=${PDKIT_CONTROL_VENV:-/root/pdkit-venv}/bin
HOSTPY="python3 gpu/nspawn/host.py"
STASH=${PDKIT_NSPAWN_STASH:-/root/stash}
export PDKIT_OFFLINE=${PDKIT_OFFLINE:-1} PIP_NO_INDEX=${PIP_NO_INDEX:-1} PYTHONUNBUFFERED=1
if [ "${PDKIT_NSPAWN_REHEARSAL:-0}" = 1 ]; then
    INV=inventories/nspawn-pair-rehearsal.py
    UP_FLAGS=(--no-gpu)
    # a change the canary cannot start with: the sim refuses this value at its first start
    BROKEN_BODY='_d["pdkit_node"]["engines"][1]["env"]["PDKIT_SIM_TRANSFER_FAIL_RATE"] = "2"'
    CAMPAIGN=rehearsal
else
    INV=inventories/h200-nspawn-pair.py
    UP_FLAGS=(--engine-payload gpu-payload)
    # FlashAttention 3 is trimmed from the carried sgl_kernel: the decode fails at its first start
    BROKEN_BODY='_d["pdkit_node"]["engines"][1].setdefault("tuning", {})["attention_backend"] = "fa3"'
    CAMPAIGN=docs/tune/h200.yaml
fi
ROUTER=http://10.214.0.2:8000
CANARY=pdkit-b

. "$(dirname "${BASH_SOURCE[0]}")/step.sh"  # step NAME LIMIT_S CMD...

card() {  # the GPU card the inventory took on this machine (gpu/card.py: PDKIT_GPU_CARD, else nvidia-smi, else its H200)
    "$P/python" -c "from pdkit.inventory.loader import load; g = load('$INV').gpu_hosts[0].node.gpus; print(f'card: {g.count} x {g.model}, {g.memory_gib} GiB, cc {g.compute_capability} (gpu/card.py)')" | tee -a "$OUT/steps.txt"
}

derived() {  # derived NAME BODY: inventories/.pair-NAME.py = INV with BODY run on the canary's data (_d)
    local path=inventories/.pair-$1.py
    python3 - "$INV" "$2" "$CANARY" > "$path" <<'PY'
import sys
inv, body, canary = sys.argv[1:]
print(f"import copy, runpy\n_b = runpy.run_path({inv!r})\ngpu_nodes = copy.deepcopy(_b['gpu_nodes'])\n"
      f"_d = [d for n, d in gpu_nodes if n == {canary!r}][0]\n{body}\nall = _b['all']  # noqa: A001")
PY
    echo "$path"
}

model() { "$P/python" -c "from pdkit.inventory.loader import load; print(load('$INV').cluster.model.name)"; }

load_start() {  # load_start NAME: C=$LOAD_CONCURRENCY (8) streaming chats through the router until load_stop
    rm -f "$OUT/load-$1.stop"
    python3 -m tests.lab.loadclient --url "$ROUTER" --model "$(model)" --concurrency ${LOAD_CONCURRENCY:-8} --max-tokens 32 \
        --out "$OUT/load-$1.json" --stop-file "$OUT/load-$1.stop" --max-seconds 1200 \
        --failure-log "$OUT/load-$1.failures.jsonl" > "$OUT/load-$1.log" 2>&1 &
    echo $! > "$OUT/load-$1.pid"
    sleep 5
}

load_stop() {  # load_stop NAME: stop it and print its counts
    touch "$OUT/load-$1.stop"
    wait "$(cat "$OUT/load-$1.pid")" 2>/dev/null
    python3 -m tests.lab.loadclient --summary "$OUT/load-$1.json" | tee -a "$OUT/steps.txt"
    failed_journal "$1"
}

failed_journal() {  # failed_journal NAME: every engine journal line, on both hosts, naming a failed request's rid
    local rids m
    [ -s "$OUT/load-$1.failures.jsonl" ] || return 0
    # rids are hex (or chatcmpl-hex on the sim): safe inside the quoted grep pattern
    rids=$(python3 -c "import json,sys; print('|'.join(sorted({r['rid'] for r in map(json.loads, open(sys.argv[1])) if r.get('rid')})[:50]))" "$OUT/load-$1.failures.jsonl")
    [ -n "$rids" ] || return 0
    for m in pdkit-a "$CANARY"; do
        $HOSTPY --machine "$m" exec --timeout 60 -- "journalctl -u 'pdkit-engine-*' --no-pager -o short-iso | grep -E '$rids'" \
            > "$OUT/load-$1.failed-$m.log" 2>&1
    done
}

sums() {  # sums HOST: sha256 of every file pdkit's plan lays down there (units, env files, release.json)
    local files
    files=$("$P/python" -c "from pdkit.inventory.loader import load; from pdkit.render.plan import plan_cluster; print(' '.join(f.path for f in plan_cluster(load('$INV'))['$1'].files))")
    $HOSTPY --machine "$1" exec -- "sha256sum $files"
}

phase_up() {
    local i=2
    for m in pdkit-a pdkit-b; do
        [ -x /var/lib/machines/$m/usr/bin/systemd-nspawn ] || step unpack-$m 120 $HOSTPY --machine $m unpack --artefacts "$STASH" gpu-payload-nspawn/rootfs gpu-payload-nspawn/monitoring gpu-payload-nspawn/cxx || return 1
        step up-$m 180 $HOSTPY --machine $m up --address 10.214.0.$i/24 --no-probe "${UP_FLAGS[@]}" || { tail -30 "$OUT/up-$m.log"; return 1; }
        i=3
    done
    if [ "${PDKIT_NSPAWN_REHEARSAL:-0}" != 1 ] && [ "${PDKIT_NSPAWN_XFER_PROBE:-1}" = 1 ]; then
        step xfer-probe 240 $HOSTPY --machine pdkit-a xfer-probe --peer pdkit-b
        cp /var/lib/pdkit-nspawn/ucx_tls.json "$OUT/" 2>/dev/null
        grep "xfer" "$OUT/xfer-probe.log" | cut -c1-400
    fi
}

phase_converge() {
    card
    # --serial: pdkit-a's engines size their memory before pdkit-b's start (one GPU, four engines)
    step deploy1 ${CONVERGE_LIMIT_S:-470} "$P/pyinfra" -y --serial "$INV" deploy/pd.py || { tail -40 "$OUT/deploy1.log"; return 1; }
    grep -E "pdkit: |Errors|changed" "$OUT/deploy1.log" | tail -8
}

phase_check() {
    step deploy2 120 "$P/pyinfra" -y "$INV" deploy/pd.py
    grep -E "changed|No changes" "$OUT/deploy2.log" | tail -4
    step doctor 90 "$P/pdkit" doctor "$INV"
    tail -30 "$OUT/doctor.log"
    step bench 180 "$P/pdkit" bench "$INV" --concurrency 1,16,64 --requests ${BENCH_REQUESTS:-64} --input-len 256 --output-len 128 --no-plot --label h200-nspawn-pair --out "$OUT/bench"
    tail -12 "$OUT/bench.log"
}

phase_roll() {
    local gbs broken
    gbs=$(derived gbs96 '_c = copy.deepcopy(_b["all"][1]["pdkit_cluster"]); _c["tuning"]["decode"]["cuda_graph_max_bs"] = 96
_b["all"] = (_b["all"][0], {"pdkit_cluster": _c})')
    load_start roll
    step roll 420 "$P/pdkit" roll "$gbs" --drain-timeout 20 --report "$OUT/roll-report.json"
    tail -25 "$OUT/roll.log"
    sums "$CANARY" > "$OUT/sums-before-broken.txt"
    broken=$(derived broken "_c = _b['all'][1]['pdkit_cluster']; _c['tuning']['decode']['cuda_graph_max_bs'] = 96
_b['all'] = (_b['all'][0], {'pdkit_cluster': _c})
$BROKEN_BODY")
    step roll-broken 420 "$P/pdkit" roll "$broken" --canary "$CANARY" --drain-timeout 20
    tail -25 "$OUT/roll-broken.log"
    sums "$CANARY" > "$OUT/sums-after-broken.txt"
    if cmp -s "$OUT/sums-before-broken.txt" "$OUT/sums-after-broken.txt"; then
        echo "broken canary: every file on $CANARY byte for byte as before ($(wc -l < "$OUT/sums-before-broken.txt") planned files, release.json included)" | tee -a "$OUT/steps.txt"
    else
        echo "broken canary: FILES DIFFER on $CANARY" | tee -a "$OUT/steps.txt"; diff "$OUT/sums-before-broken.txt" "$OUT/sums-after-broken.txt"
    fi
    load_stop roll
}

phase_tune() {
    if [ "$CAMPAIGN" = rehearsal ]; then  # the device's campaign, its results kept out of docs/
        CAMPAIGN=$OUT/campaign-rehearsal.yaml
        "$P/python" -c "import sys, yaml; c = yaml.safe_load(open('docs/tune/h200.yaml')); c.update(name='nspawn-rehearsal', inventory=sys.argv[1], out_dir=sys.argv[2] + '/tune', state_dir=sys.argv[2] + '/tune-state'); yaml.safe_dump(c, open(sys.argv[3], 'w'))" "$INV" "$OUT" "$CAMPAIGN"
    fi
    step tune-dry 60 "$P/pdkit" tune "$INV" "$CAMPAIGN" --dry
    tail -20 "$OUT/tune-dry.log"
    # ${TUNE_FLAGS:-}: --resume for a campaign a call's limit cut short
    step tune 560 "$P/pdkit" tune "$INV" "$CAMPAIGN" ${TUNE_FLAGS:-}
    tail -40 "$OUT/tune.log"
    cp -r docs/tune "$OUT/tune-out" 2>/dev/null
}

declare -A ADDR=([pdkit-a]=10.214.0.2 [pdkit-b]=10.214.0.3)  # inventories/h200-nspawn-pair.py's ADDRESSES
FAULT=(python3 gpu/nspawn/fault.py)

fault_metrics() {  # fault_metrics FILE: every engine's failure counters and the router's breaker lines (whole texts: FILE-N.prom)
    "${FAULT[@]}" metrics --raw "${1%.txt}" http://${ADDR[pdkit-a]}:30000/metrics http://${ADDR[pdkit-a]}:30001/metrics \
        http://${ADDR[pdkit-b]}:30000/metrics http://${ADDR[pdkit-b]}:30001/metrics http://${ADDR[pdkit-a]}:29000/metrics > "$1" 2>&1
}

fault_one() {  # fault_one MACHINE: kill its prefill under load; the outcomes, counters and journals
    local m=$1 tag=fault-$1 t_kill t_back since
    fault_metrics "$OUT/$tag-metrics-before.txt"
    rm -f "$OUT/load-$tag.stop"
    python3 gpu/nspawn/outage_client.py --url "$ROUTER" --model "$(model)" --concurrency ${LOAD_CONCURRENCY:-8} --max-tokens 32 \
        --timeout ${FAULT_CLIENT_TIMEOUT_S:-120} --out "$OUT/load-$tag.json" --stop-file "$OUT/load-$tag.stop" --max-seconds 900 > "$OUT/load-$tag.log" 2>&1 &
    local pid=$!
    sleep ${FAULT_LEAD_S:-20}
    t_kill=$(date +%s.%N)
    step kill-$m 30 $HOSTPY --machine "$m" exec -- systemctl kill -s KILL pdkit-engine-prefill.service
    step back-$m ${FAULT_BACK_LIMIT_S:-240} "${FAULT[@]}" wait-health "http://${ADDR[$m]}:30000/health" --since "$t_kill" --limit ${FAULT_BACK_LIMIT_S:-240}
    t_back=$(awk '/ 200 after /{print $1}' "$OUT/back-$m.log")
    cat "$OUT/back-$m.log" | tee -a "$OUT/steps.txt"
    sleep ${FAULT_TAIL_S:-20}  # the router's health checks take the prefill back (2 x 5 s), then answers through it
    touch "$OUT/load-$tag.stop"
    wait $pid
    fault_metrics "$OUT/$tag-metrics-after.txt"
    since=$(( ${t_kill%.*} - 30 ))
    for h in pdkit-a pdkit-b; do
        $HOSTPY --machine $h exec --timeout 60 -- "journalctl -u pdkit-engine-decode -u pdkit-engine-prefill -u pdkit-router --since @$since --no-pager -o short-iso-precise" \
            > "$OUT/$tag-journal-$h.log" 2>&1
        grep -E "SIGTERM|Draining|Gracefully exiting|Lost connection|timed out|Timeout|timeout|Abort|abort|Failed|failed|Error|error|Traceback|Started|Stopped|fired up" "$OUT/$tag-journal-$h.log" \
            | grep -vE "Decode batch|Prefill batch" > "$OUT/$tag-journal-$h.grep" 2>&1
    done
    "${FAULT[@]}" report "$OUT/load-$tag.json" --kill "$t_kill" ${t_back:+--back "$t_back"} --budget-s 20 --json "$OUT/$tag-report.json" \
        > "$OUT/$tag-report.txt"
    head -1 "$OUT/$tag-report.txt" | tee -a "$OUT/steps.txt"
    [ -n "$t_back" ]
}

phase_fault() {
    local m ok=0
    for h in pdkit-a pdkit-b; do  # what the fault budget rendered
        $HOSTPY --machine $h exec -- "grep -H SGLANG_DISAGG /etc/pdkit/engines/*.env; systemctl show -p ExecStart pdkit-router.service 2>/dev/null | tr ' ' '\n' | grep -A1 -E 'timeout|retry|health'; systemctl show -p Id -p KillMode -p TimeoutStopUSec -p PartOf pdkit-engine-prefill.service pdkit-engine-decode.service"
    done > "$OUT/fault-rendered.txt" 2>&1
    for m in ${FAULT_VICTIMS:-pdkit-b}; do fault_one "$m" || ok=1; done
    return $ok
}

phase_down() {
    for m in pdkit-b pdkit-a; do step down-$m 60 $HOSTPY --machine $m down; done
}

for phase in "$@"; do
    echo "== phase $phase ($(date -u +%H:%M:%S))" | tee -a "$OUT/steps.txt"
    "phase_$phase" || { echo "phase $phase FAILED" | tee -a "$OUT/steps.txt"; cat "$OUT/steps.txt"; exit 1; }
done
cat "$OUT/steps.txt"
