#!/usr/bin/env bash
# Runs the fault suite (tests/faults.rs, issue 5) on the GPU machine, from prebuilt binaries.
#
# Usage: bash ci/faults-run.sh BINDIR LOGDIR
#
#   BINDIR  holds `faults`, the test binary, built on the build machine against the NCCL of the GPU
#           machine (2.28.9 there), e.g.
#             ci/setup 2.28.9
#             NCCL_HOME=$PWD/.deps/nccl-2.28.9/nvidia/nccl CARGO_TARGET_DIR=target/gpu-2.28.9 \
#                 cargo test --release --test faults --no-run
#           and copied to BINDIR/faults.
#   LOGDIR  gets one log per run (LOGDIR/<n>-<test>.log) and summary.txt.
#
# LD_LIBRARY_PATH must already point at that NCCL on the GPU machine (it overrides the binary's
# build-machine RUNPATH). NCCL_NVLS_ENABLE=0 is exported here for every process (NVLink multicast is
# forbidden on the GPU host); the tests refuse to run without it.
#
# Each run has a limit of `timeout 120` (less when the whole run's budget runs short: the script stays
# under 6 minutes). The peer-kill test runs 10 times in a row with the default transport, then once with
# the network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1). Within one host NCCL does not notice a
# dead peer over P2P/SHM, so each such run lasts the watchdog's whole deadline: the repetitions use
# FAULTS_KILL_WATCHDOG_S (default 10 s) instead of the test's default 30 s to fit the budget.
#
# Prints a table last (test, result, measured bound / seconds) and the line "N passed, M failed".
# Exit status: 0 when everything passed, 1 otherwise, 2 on bad usage.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

bindir=${1:-}
logdir=${2:-}
if [ -z "$bindir" ] || [ -z "$logdir" ]; then
    echo "usage: $0 BINDIR LOGDIR" >&2
    exit 2
fi
bin=$(cd "$bindir" && pwd)/faults
[ -x "$bin" ] || { echo "$bin: no such executable (build it with cargo test --release --test faults --no-run)" >&2; exit 2; }
mkdir -p "$logdir" || exit 2
logdir=$(cd "$logdir" && pwd)
[ -n "${LD_LIBRARY_PATH:-}" ] || echo "warning: LD_LIBRARY_PATH is empty: the binary loads libnccl through its build-machine RUNPATH, if that exists here" >&2

budget=${FAULTS_BUDGET_S:-345}     # the whole run stays under 6 minutes
per_test=${FAULTS_TEST_TIMEOUT_S:-120}
kill_watchdog=${FAULTS_KILL_WATCHDOG_S:-10}
reps=${FAULTS_KILL_REPS:-10}
t0=$(date +%s)

names=(); results=(); bounds=(); secs_list=()
n=0

# run_test LABEL TEST [VAR=VALUE ...]: runs one test in its own process; records PASS/FAIL, the bound.
run_test() {
    local label=$1 test=$2; shift 2
    n=$((n + 1))
    local log
    log=$logdir/$(printf '%02d' "$n")-${test//::/.}.log
    local left=$((budget - ($(date +%s) - t0)))
    if [ "$left" -lt 15 ]; then
        names+=("$label"); results+=(FAIL); bounds+=("not run: the ${budget}s budget was spent"); secs_list+=(0)
        return
    fi
    local limit=$((left < per_test ? left : per_test))
    echo "running $label (limit ${limit}s) ..."
    local start end rc
    start=$(date +%s.%N)
    (
        echo ">>> $label: env $* $bin --exact $test --ignored --nocapture --test-threads=1"
        timeout -k 5 "$limit" env "$@" "$bin" --exact "$test" --ignored --nocapture --test-threads=1
        rc=$?
        echo "<<< exit status $rc"
        exit $rc
    ) > "$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    local bound
    bound=$(grep -a "FAULT-BOUND " "$log" | tail -1 | sed 's/.*FAULT-BOUND //' | cut -c1-150)
    if [ "$rc" = 0 ] && grep -q "test result: ok. 1 passed" "$log"; then
        results+=(PASS)
    else
        results+=(FAIL)
        case $rc in
            124|137) bound="TIMEOUT after ${limit}s; $bound" ;;
            0) bound="ran no test; $bound" ;;
            *) bound="exit $rc: $(grep -a -m1 -E "panicked at" -A1 "$log" | tr '\n' ' ' | cut -c1-160)" ;;
        esac
    fi
    names+=("$label"); bounds+=("${bound:--}"); secs_list+=("$secs")
}

echo "fault suite: $bin"
echo "$("$bin" --exact nccl_library_in_use --nocapture 2>&1 | grep -a -m1 'NCCL headers' || echo "libnccl: ncclGetVersion failed (see the CPU tests' log)")"
{
    nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1
    env | grep -E '^(NCCL|CUDA|LD_LIBRARY)' | sort
} > "$logdir/machine.txt"

# The CPU tests of the binary (on a GPU host some of them check other things than in CI).
n=$((n + 1))
log=$logdir/$(printf '%02d' "$n")-cpu-tests.log
start=$(date +%s.%N)
timeout -k 5 60 "$bin" --test-threads=1 --nocapture > "$log" 2>&1
rc=$?
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
names+=("CPU tests (not ignored)")
if [ "$rc" = 0 ]; then results+=(PASS); bounds+=("$(grep -a -m1 'test result' "$log" | cut -c1-80)"); else results+=(FAIL); bounds+=("exit $rc"); fi
secs_list+=("$secs")

run_test "peer never arrives" peers::peer_never_arrives METRALE_FAULT_INIT_TIMEOUT_S="${FAULTS_INIT_TIMEOUT_S:-20}"
run_test "abort from another thread" peers::abort_from_another_thread_unsticks_a_collective
run_test "bad input on GPUs" bad_input::bad_input_on_gpus
run_test "bad input in child processes" bad_input::bad_input_that_may_crash_in_a_child_process
run_test "32 threads" leaks::many_threads_share_one_driver_and_helpers_work
run_test "no leak: streams, events, nccl mem" leaks::no_leak_streams_events_nccl_memory
for i in $(seq 1 "$reps"); do
    run_test "peer killed $i/$reps (P2P, watchdog ${kill_watchdog}s)" peers::peer_killed_mid_collective \
        METRALE_FAULT_WATCHDOG_S="$kill_watchdog"
done
run_test "peer killed (NET: P2P+SHM off, watchdog ${kill_watchdog}s)" peers::peer_killed_mid_collective \
    METRALE_FAULT_WATCHDOG_S="$kill_watchdog" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
run_test "no leak: 100 communicators" leaks::no_leak_communicators

# Any GPU test added to tests/faults.rs but not listed above, once (child entry points excluded).
known=" peers::peer_never_arrives peers::abort_from_another_thread_unsticks_a_collective bad_input::bad_input_on_gpus \
bad_input::bad_input_that_may_crash_in_a_child_process leaks::many_threads_share_one_driver_and_helpers_work \
leaks::no_leak_streams_events_nccl_memory peers::peer_killed_mid_collective leaks::no_leak_communicators \
fault_child missing_symbol_child "
while read -r t; do
    case $known in *" $t "*) ;; *) run_test "$t" "$t" ;; esac
done < <("$bin" --list --ignored 2>/dev/null | sed -n 's/: test$//p')

passed=0; failed=0
for r in "${results[@]}"; do
    if [ "$r" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
{
    echo
    echo "fault suite on $(hostname): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -); LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    printf '%-52s %-6s %7s  %s\n' "test" "result" "seconds" "measured bound"
    for i in "${!names[@]}"; do
        printf '%-52s %-6s %7s  %s\n' "${names[$i]}" "${results[$i]}" "${secs_list[$i]}" "${bounds[$i]}"
    done
    echo "total $(($(date +%s) - t0)) s; logs in $logdir"
    echo "$passed passed, $failed failed"
} | tee "$logdir/summary.txt"
[ "$failed" = 0 ]
