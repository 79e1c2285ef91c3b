#!/usr/bin/env bash
# The users' own shape on the lent H200: ONE node, PD across its halves (inventories/h200-nspawn.py:
# a prefill and a decode sharing GPU 0 behind one router, all on one systemd container host).
# pdkit's own deploy, doctor, bench, a roll that must be refused without --allow-downtime and then
# done with it under load (the outage measured), a broken change restored byte for byte, a rollback
# with downtime, and a tune campaign; all from the lent machine's shell over real SSH.
# docs/gpu.md ("One node, PD across its halves") has the calls.
#
#   bash gpu/nspawn/device_one.sh PHASE...      phases, in order: up converge restart check roll restore tune down
#
# Each step is timed into $OUT/steps.txt, its output in $OUT/<step>.log. On the device: after the
# calls that stash host.py unpack's tarballs in $PDKIT_NSPAWN_STASH (/root/stash) and make the
# control venv ($PDKIT_CONTROL_VENV, /root/pdkit-venv); the engine payload is $PDKIT_ENGINE_PAYLOAD
# (gpu-payload). PDKIT_NSPAWN_REHEARSAL=1: the same on a machine without a GPU
# (inventories/nspawn-rehearsal.py, the sim engine; the container and every client command in
# the network namespace pdkn-h200, as on the device they share the machine's network).
#
# MIRROR=DIR (on the device: MIRROR=$OUT): every 20 s, and at the end, $OUT and the campaign's
# records are packed into DIR/one-<first phase>.tar.xz, so a call cut at its time limit still
# brings back what it did (on 2026-12-02 the tune call was cut and only a later call recovered it).
# After each phase the engines' own log lines (KV pool size, free memory at start, readiness,
# errors) are kept in $OUT/engines-PHASE.log.
set -u
OUT=${OUT:-/tmp/pdkit-one-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
P=${PDKIT_CONTROL_VENV:-/root/pdkit-venv}/bin
HOSTPY="python3 $HERE/host.py"
STASH=${PDKIT_NSPAWN_STASH:-/root/stash}
MACHINE=pdkit-h200
export PDKIT_OFFLINE=${PDKIT_OFFLINE:-1} PIP_NO_INDEX=${PIP_NO_INDEX:-1} PYTHONUNBUFFERED=1
if [ "${PDKIT_NSPAWN_REHEARSAL:-0}" = 1 ]; then
    INV=inventories/nspawn-rehearsal.py
    NETNS=pdkn-h200
    UP_FLAGS=(--no-gpu --netns "$NETNS" --no-probe)
    RUN=(nsenter "--net=/run/netns/$NETNS")  # the control side in the container's network
    # a change the node cannot start with: the sim refuses this value at its first start
    BROKEN_BODY='_node["engines"][1].setdefault("env", {})["PDKIT_SIM_TRANSFER_FAIL_RATE"] = "2"'
    CAMPAIGN=rehearsal
    # the sim streams at its formula's pace on a shared CPU: 64 requests at C=1 outran 180 s
    BENCH_REQUESTS=${BENCH_REQUESTS:-16}
else
    INV=inventories/h200-nspawn.py
    UP_FLAGS=(--engine-payload "${PDKIT_ENGINE_PAYLOAD:-gpu-payload}")
    # the probe (GPU, imports, a Triton kernel under the engine units' policy) passed on 2026-12-01;
    # 30 s of device time: PDKIT_NSPAWN_PROBE=1 runs it again
    [ "${PDKIT_NSPAWN_PROBE:-0}" = 1 ] || UP_FLAGS+=(--no-probe)
    RUN=()
    # FlashAttention 3 is trimmed from the carried sgl_kernel: the decode fails at its first start
    BROKEN_BODY='_node["engines"][1].setdefault("tuning", {})["attention_backend"] = "fa3"'
    # PDKIT_CAMPAIGN: another campaign for the tune phase (docs/tune/h200-agentic.yaml)
    CAMPAIGN=${PDKIT_CAMPAIGN:-docs/tune/h200-one-node.yaml}
fi
LOAD_C=${LOAD_CONCURRENCY:-8}

. "$HERE/step.sh"  # step NAME LIMIT_S CMD...

card() {  # the GPU card the inventory took on this machine (gpu/card.py: PDKIT_GPU_CARD, else nvidia-smi, else its H200)
    "$P/python" -c "from pdkit.inventory.loader import load; g = load('$INV').gpu_hosts[0].node.gpus; print(f'card: {g.count} x {g.model}, {g.memory_gib} GiB, cc {g.compute_capability} (gpu/card.py)')" | tee -a "$OUT/steps.txt"
}

derived() {  # derived NAME BODY: inventories/.one-NAME.py = INV with BODY run on the node's data (_node) and cluster (_c)
    local path=inventories/.one-$1.py
    python3 - "$INV" "$2" > "$path" <<'PY'
import sys
inv, body = sys.argv[1:]
print(f"import copy, runpy\n_b = runpy.run_path({inv!r})\ngpu_nodes = copy.deepcopy(_b['gpu_nodes'])\n"
      f"_node = gpu_nodes[0][1]['pdkit_node']\n_c = copy.deepcopy(_b['all'][1]['pdkit_cluster'])\n{body}\n"
      f"all = (_b['all'][0], {{'pdkit_cluster': _c}})  # noqa: A001")
PY
    echo "$path"
}

model() { "$P/python" -c "from pdkit.inventory.loader import load; print(load('$INV').cluster.model.name)"; }
router() { "$P/python" -c "
from pdkit.inventory.loader import load; from pdkit.render import flags
s = load('$INV'); h = s.router_hosts[0]; print(f'http://{flags.router_address(h)}:{h.router.port}')"; }

load_start() {  # load_start NAME: C=$LOAD_C streaming chats through the router, every request timed
    rm -f "$OUT/load-$1.stop"
    "${RUN[@]}" python3 "$HERE/outage_client.py" --url "$(router)" --model "$(model)" --concurrency "$LOAD_C" --max-tokens 32 \
        --timeout 60 --out "$OUT/load-$1.json" --stop-file "$OUT/load-$1.stop" --max-seconds 900 > "$OUT/load-$1.log" 2>&1 &
    echo $! > "$OUT/load-$1.pid"
    sleep 5
}

load_stop() {  # load_stop NAME: stop it and print its figures
    sleep 5  # answers after the node is back
    touch "$OUT/load-$1.stop"
    wait "$(cat "$OUT/load-$1.pid")" 2>/dev/null
    python3 "$HERE/outage_client.py" --summary "$OUT/load-$1.json" | tee -a "$OUT/steps.txt"
    failed_journal "$1"
}

failed_journal() {  # failed_journal NAME: the engines' journal lines naming a failed stream's rid (not the 503s: no rid)
    local rids
    rids=$(python3 -c "import json,sys; print('|'.join(sorted({r[4]['rid'] for r in json.load(open(sys.argv[1]))['requests'] if len(r) > 4 and r[4].get('rid')})[:50]))" "$OUT/load-$1.json")
    [ -n "$rids" ] || return 0
    $HOSTPY --machine "$MACHINE" exec --timeout 60 -- "journalctl -u 'pdkit-engine-*' --no-pager -o short-iso | grep -E '$rids'" \
        > "$OUT/load-$1.failed-journal.log" 2>&1
}

sums() {  # sums: sha256 of every file pdkit's plan lays down on the node (units, env files, release.json)
    local files
    files=$("$P/python" -c "from pdkit.inventory.loader import load; from pdkit.render.plan import plan_cluster; print(' '.join(f.path for f in plan_cluster(load('$INV'))['$MACHINE'].files))")
    $HOSTPY --machine "$MACHINE" exec -- "sha256sum $files"
}

same_sums() {  # same_SUMS A B WHAT: compare two sums files, say so in steps.txt
    if cmp -s "$OUT/$1" "$OUT/$2"; then
        echo "$3: every planned file on $MACHINE byte for byte as before ($(wc -l < "$OUT/$1") files, release.json included)" | tee -a "$OUT/steps.txt"
    else
        echo "$3: FILES DIFFER on $MACHINE" | tee -a "$OUT/steps.txt"; diff "$OUT/$1" "$OUT/$2" | tee -a "$OUT/steps.txt"
        return 1
    fi
}

expect_rc() {  # expect_rc WANT STEP: the step's rc (last line of steps.txt) must be WANT
    local rc
    rc=$(grep "^$2 rc=" "$OUT/steps.txt" | tail -1 | sed 's/.* rc=\([0-9]*\) .*/\1/')
    if [ "$rc" = "$1" ]; then echo "$2: exit $rc as expected" | tee -a "$OUT/steps.txt"
    else echo "$2: exit $rc, EXPECTED $1" | tee -a "$OUT/steps.txt"; return 1; fi
}

phase_up() {
    [ -x /var/lib/machines/$MACHINE/usr/bin/systemd-nspawn ] || step unpack 120 $HOSTPY --machine $MACHINE unpack --artefacts "$STASH" gpu-payload-nspawn/rootfs gpu-payload-nspawn/monitoring gpu-payload-nspawn/cxx || return 1
    # PDKIT_GPU_WEIGHTS=safetensors (inventories/h200.py): real-format weights in the payload's model
    # directory, which `up` copies into the host (the image's python3 has numpy)
    if [ "${PDKIT_GPU_WEIGHTS:-dummy}" = safetensors ] && [ "${PDKIT_NSPAWN_REHEARSAL:-0}" != 1 ]; then
        step weights 180 python3 gpu/make_weights.py "${PDKIT_ENGINE_PAYLOAD:-gpu-payload}/model" || { tail -5 "$OUT/weights.log"; return 1; }
        tail -1 "$OUT/weights.log"
    fi
    step up 240 $HOSTPY --machine $MACHINE up "${UP_FLAGS[@]}" || { tail -30 "$OUT/up.log"; return 1; }
    grep -E "ssh answered|libraries:|probe (nvidia_smi|gpu_under)" "$OUT/up.log" | cut -c1-300
}

phase_converge() {
    card
    step deploy1 ${CONVERGE_LIMIT_S:-420} "${RUN[@]}" "$P/pyinfra" -y "$INV" deploy/pd.py || { tail -40 "$OUT/deploy1.log"; return 1; }
    grep -E "pdkit: |Errors|changed" "$OUT/deploy1.log" | tail -8
}

phase_restart() {  # where a warm restart goes: imports and restarts with and without bytecode (gpu/nspawn/restart_cost.py)
    step restart-cost ${RESTART_LIMIT_S:-420} "${RUN[@]}" "$P/python" gpu/nspawn/restart_cost.py "$INV" --out "$OUT/restart" ${RESTART_FLAGS:-}
    tail -12 "$OUT/restart-cost.log"
    engines_log restart
}

phase_check() {
    step deploy2 120 "${RUN[@]}" "$P/pyinfra" -y "$INV" deploy/pd.py
    grep -E "changed|No changes" "$OUT/deploy2.log" | tail -4
    step chat 60 "${RUN[@]}" "$P/pdkit" chat "$INV"
    step doctor 90 "${RUN[@]}" "$P/pdkit" doctor "$INV"
    tail -30 "$OUT/doctor.log"
    step bench 180 "${RUN[@]}" "$P/pdkit" bench "$INV" --concurrency 1,16,64 --requests ${BENCH_REQUESTS:-64} --input-len 256 --output-len 128 --no-plot --label h200-one-node --out "$OUT/bench"
    tail -12 "$OUT/bench.log"
}

rotate_journal() {  # rotate_journal NAME: rotate the node's journal away, as a busy box's journald does
    # Issue 42: on the last one-node run the rollback's engine gate waited for the readiness line of a prefill that
    # had not been restarted and whose line journald had rotated away (32 MB cap, router request logs),
    # and the box served nothing for 252 s. The gate now decides from the engines' endpoints; this makes
    # every roll step below run with the engines' start lines gone. Their lines are kept first.
    engines_log "$1-before-rotate"
    step "rotate-$1" 60 $HOSTPY --machine "$MACHINE" exec --timeout 50 -- \
        "journalctl --rotate && journalctl --vacuum-time=1s && echo engine readiness lines left: \$(journalctl -u 'pdkit-engine-*' --no-pager 2>/dev/null | grep -c 'fired up and ready')"
    tail -2 "$OUT/rotate-$1.log" | tee -a "$OUT/steps.txt"
}

phase_roll() {
    local gbs ok=0
    gbs=$(derived gbs96 '_c["tuning"].setdefault("decode", {})["cuda_graph_max_bs"] = 96')
    sums > "$OUT/sums-0-inventory.txt"
    rotate_journal roll  # 0. the engines' start lines gone before the first roll (issue 42)
    # 1. without the option: refused before any change (exit 2), naming the router and the outage
    step roll-refused 120 "${RUN[@]}" "$P/pdkit" roll "$gbs" --drain-timeout 20
    expect_rc 2 roll-refused || ok=1
    tail -12 "$OUT/roll-refused.log"
    sums > "$OUT/sums-1-after-refusal.txt"
    same_sums sums-0-inventory.txt sums-1-after-refusal.txt "refused roll" || ok=1
    # 2. with it, under load: the outage, measured by the client and by the roll's report
    load_start roll
    step roll 480 "${RUN[@]}" "$P/pdkit" roll "$gbs" --allow-downtime --drain-timeout 20 --report "$OUT/roll-report.json"
    expect_rc 0 roll || ok=1
    load_stop roll
    tail -20 "$OUT/roll.log"
    return $ok
}

phase_restore() {  # after roll (its own call: with shared-GPU group restarts the two no longer fit one 600 s call)
    local broken ok=0
    # 3. a broken change with the option, under load: the apply gate fails, the node goes back
    sums > "$OUT/sums-2-before-broken.txt"
    broken=$(derived broken "_c['tuning'].setdefault('decode', {})['cuda_graph_max_bs'] = 96
$BROKEN_BODY")
    load_start broken
    step roll-broken 480 "${RUN[@]}" "$P/pdkit" roll "$broken" --allow-downtime --drain-timeout 20 --report "$OUT/roll-broken-report.json"
    load_stop broken
    tail -25 "$OUT/roll-broken.log"
    sums > "$OUT/sums-3-after-broken.txt"
    same_sums sums-2-before-broken.txt sums-3-after-broken.txt "broken change" || ok=1
    # 4. back onto the inventory's release: rollback, refused without the option, then with it, under load
    step releases 60 "${RUN[@]}" "$P/pdkit" releases "$INV" "$MACHINE"
    cat "$OUT/releases.log"
    step rollback-refused 60 "${RUN[@]}" "$P/pdkit" rollback "$INV" "$MACHINE" --drain-timeout 20
    expect_rc 2 rollback-refused || ok=1
    rotate_journal rollback  # the roll's and the restore's engine start lines gone too (issue 42's failed step)
    load_start rollback
    step rollback 480 "${RUN[@]}" "$P/pdkit" rollback "$INV" "$MACHINE" --allow-downtime --drain-timeout 20
    expect_rc 0 rollback || ok=1
    load_stop rollback
    tail -12 "$OUT/rollback.log"
    sums > "$OUT/sums-4-after-rollback.txt"
    same_sums sums-0-inventory.txt sums-4-after-rollback.txt "rollback onto the inventory" || ok=1
    rm -f inventories/.one-*.py
    return $ok
}

phase_tune() {
    if [ "$CAMPAIGN" = rehearsal ]; then  # the device's campaign on the sim, its results kept out of docs/
        CAMPAIGN=$OUT/campaign-rehearsal.yaml
        "$P/python" -c "import sys, yaml; c = yaml.safe_load(open('docs/tune/h200-one-node.yaml')); c.update(name='one-node-rehearsal', inventory=sys.argv[1], out_dir=sys.argv[2] + '/tune', state_dir=sys.argv[2] + '/tune-state'); yaml.safe_dump(c, open(sys.argv[3], 'w'), sort_keys=False)" "$INV" "$OUT" "$CAMPAIGN"
    fi
    step tune-dry 60 "${RUN[@]}" "$P/pdkit" tune "$INV" "$CAMPAIGN" --dry
    tail -40 "$OUT/tune-dry.log"
    # ${TUNE_FLAGS:-}: --resume for a campaign a call's limit cut short; TERM at the limit stops it
    # after the candidate in progress (records and report up to date)
    step tune ${TUNE_LIMIT_S:-540} "${RUN[@]}" "$P/pdkit" tune "$INV" "$CAMPAIGN" ${TUNE_FLAGS:-}
    tail -40 "$OUT/tune.log"
    # the records and the table, wherever the campaign keeps them (out_dir)
    local out_dir
    out_dir=$("$P/python" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('out_dir') or 'docs/tune')" "$CAMPAIGN")
    mkdir -p "$OUT/tune-out"
    cp "$out_dir"/*.md "$out_dir"/*.jsonl "$out_dir"/*.png "$OUT/tune-out/" 2>/dev/null
}

engines_log() {  # engines_log NAME: the engines' journal lines that say how they started (or why not)
    $HOSTPY --machine "$MACHINE" exec --timeout 60 -- "journalctl -u 'pdkit-engine-*' --no-pager -o short-iso -n 20000 | grep -E 'KV Cache is allocated|max_total_num_tokens|avail mem|Load weight end|Capture cuda graph|fired up and ready|Error|error|Traceback|Killed|out of memory|Started|Stopped|Failed|pdkit.agent.gpumem'" \
        > "$OUT/engines-$1.log" 2>&1
    # the engine gate's shape records and last verdicts (pdkit/agent/engineshape.py, issue 42 item 5)
    $HOSTPY --machine "$MACHINE" exec --timeout 30 -- "for f in /var/lib/pdkit-engines/shapes/*/*.json; do echo \"== \$f\"; cat \"\$f\"; echo; done" \
        > "$OUT/shapes-$1.log" 2>&1
    $HOSTPY --machine "$MACHINE" exec --timeout 30 -- "nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader" \
        >> "$OUT/engines-$1.log" 2>&1
}

mirror() {  # pack $OUT and the campaign's records into $MIRROR (one file per call)
    [ -n "${MIRROR:-}" ] || return 0
    local out_dir="docs/tune"
    tar -cJf "$MIRROR/.one-$TAG.tmp" -C "$OUT" . $(ls "$out_dir"/h200-one-node.* "$out_dir"/h200-agentic.* 2>/dev/null | sed "s|^|-C $PWD |") 2>/dev/null \
        && mv "$MIRROR/.one-$TAG.tmp" "$MIRROR/one-$TAG.tar.xz"
}

phase_down() {
    step down 60 $HOSTPY --machine $MACHINE down
}

TAG=${1:-none}
if [ -n "${MIRROR:-}" ]; then
    ( while sleep 20; do mirror; done ) &
    MIRROR_PID=$!
    trap 'kill $MIRROR_PID 2>/dev/null; mirror' EXIT
fi
for phase in "$@"; do
    echo "== phase $phase ($(date -u +%H:%M:%S))" | tee -a "$OUT/steps.txt"
    "phase_$phase"
    rc=$?
    [ "$phase" = down ] || engines_log "$phase"
    [ $rc = 0 ] || { echo "phase $phase FAILED" | tee -a "$OUT/steps.txt"; cat "$OUT/steps.txt"; exit 1; }
done
cat "$OUT/steps.txt"
