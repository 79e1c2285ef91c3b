# Sourced by gpu/nspawn/device_run.sh and device_pair.sh: one timed step of a device call.
# step NAME LIMIT_S CMD...: runs CMD under a time limit, its output in $OUT/NAME.log, and appends
# "NAME rc=RC SECONDS s" to $OUT/steps.txt (and prints it); returns CMD's status.
step() {
    local name=$1 limit=$2; shift 2
    local t0; t0=$(date +%s.%N)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $(python3 -c "import sys;print(f'{float(sys.argv[2])-float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)") s" | tee -a "$OUT/steps.txt"
    return $rc
}
