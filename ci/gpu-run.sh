#!/usr/bin/env bash
# Runs the GPU suite that ci/gpu built, on the GPU machine (copied there as .gpu-build/run.sh).
#
# Usage: bash .gpu-build/run.sh LOGDIR
#
#   1. finds libnccl of the version the suite was built for (BUILD's NCCL_VERSION): $NCCL_LIB_DIR if set,
#      the PyTorch venv's nvidia/nccl/lib, other pip wheels, ldconfig's list, the usual system folders;
#      each candidate is verified by the test binary's own version check (ncclGetVersion);
#   2. points every binary at it (LD_LIBRARY_PATH, which overrides their build-machine RUNPATH);
#   3. runs nccl_info built against that version: must exit 0 with the all-reduce correct;
#   4. runs nccl_info built against the pinned NCCL: where the library is older, it must report the
#      version skew and exit non-zero (2), which counts as a pass;
#   5. runs the host checks, then every GPU test, each in its own process (timeout per test;
#      GPU_TESTS=<regex> picks some);
#   6. writes full logs to LOGDIR (machine.txt, find-nccl.log, one log per step under steps/) and
#      summary.txt, and prints a table last, ending with the line "N passed, M failed".
# Exit status: 0 when everything passed, 1 otherwise (2: bad usage or no matching libnccl).
#
# NCCL_NVLS_ENABLE=0 is exported here, so every process started from this script (the tests' own child
# processes set it again) runs with NVLink multicast off: it is forbidden on the GPU host.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logdir=${1:-}
[ -n "$logdir" ] || { echo "usage: $0 LOGDIR" >&2; exit 2; }
mkdir -p "$logdir/steps" || exit 2
logdir=$(cd "$logdir" && pwd)
[ -f "$here/BUILD" ] || { echo "$here/BUILD missing: build with ci/gpu first" >&2; exit 2; }
# shellcheck disable=SC1091
. "$here/BUILD"
want=$NCCL_VERSION
budget=${GPU_RUN_BUDGET_S:-540}      # stop starting tests after this many seconds (a command gets 600)
per_test=${GPU_TEST_TIMEOUT_S:-150}  # one test's limit
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }'; }

names=(); results=(); seconds=(); notes=()
record() { names+=("$1"); results+=("$2"); seconds+=("$3"); notes+=("${4:-}"); }

# run_step NAME LOGFILE LIMIT CMD...: runs CMD with a time limit; sets rc and secs.
run_step() {
    local name=$1 log=$2 limit=$3; shift 3
    local start; start=$(date +%s.%N)
    echo ">>> $name: $*" > "$log"
    timeout -k 10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "<<< exit status $rc after ${secs}s" >> "$log"
}

# first_failure LOGFILE: the first line saying why a test failed.
first_failure() {
    grep -m1 -E "panicked at|^FAIL |assertion|error" "$1" -A1 | tr '\n' ' ' | cut -c1-240
}

echo "GPU suite: NCCL $want (pinned $PINNED_NCCL), commit $COMMIT (dirty: $DIRTY), built $BUILT"

# The machine, read only.
{
    nvidia-smi
    nvidia-smi topo -m
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
    uname -a
    ldd --version | head -1
    env | grep -E '^(NCCL|CUDA|LD_LIBRARY)' | sort
} > "$logdir/machine.txt" 2>&1
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
gpu_list=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)

# 1. libnccl $want.
candidates=()
[ -n "${NCCL_LIB_DIR:-}" ] && candidates+=("$NCCL_LIB_DIR")
candidates+=(/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib)
for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib /opt/*/lib/python3*/site-packages/nvidia/nccl/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib /usr/lib/python3/dist-packages/nvidia/nccl/lib; do
    [ -d "$d" ] && candidates+=("$d")
done
while read -r lib; do
    [ -n "$lib" ] && candidates+=("$(dirname "$lib")")
done < <(ldconfig -p 2>/dev/null | awk '/libnccl\.so/ { print $NF }')
candidates+=(/usr/lib/x86_64-linux-gnu /usr/local/nccl/lib /usr/local/cuda/lib64)
nccl_dir=""
seen=" "
for d in "${candidates[@]}"; do
    case $seen in *" $d "*) continue ;; esac
    seen="$seen$d "
    [ -e "$d/libnccl.so.2" ] || [ -e "$d/libnccl.so" ] || continue
    echo "--- candidate $d" >> "$logdir/find-nccl.log"
    if LD_LIBRARY_PATH=$d METRALE_EXPECT_NCCL=$want "$here/gpu-tests" --exact nccl_library_matches_headers \
        --nocapture >> "$logdir/find-nccl.log" 2>&1; then
        nccl_dir=$d
        break
    fi
done
if [ -z "$nccl_dir" ]; then
    echo "no libnccl $want found on this machine (looked in: ${candidates[*]}); see $logdir/find-nccl.log" | tee -a "$logdir/summary.txt"
    exit 2
fi
export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
lib_line=$(grep -m1 "NCCL headers" "$logdir/find-nccl.log" | tail -1)
record "libnccl $want found ($nccl_dir)" PASS 0.0
echo "libnccl $want: $nccl_dir"

# 3. nccl_info, built against $want.
run_step "nccl_info" "$logdir/steps/nccl_info.log" 120 "$here/nccl_info"
if [ "$rc" = 0 ] && grep -q "sum correct" "$logdir/steps/nccl_info.log"; then
    record "nccl_info (NCCL $want build): all-reduce correct" PASS "$secs"
else
    record "nccl_info (NCCL $want build): all-reduce correct" FAIL "$secs" "exit $rc; see steps/nccl_info.log"
fi

# 4. nccl_info built against the pinned NCCL: the skew, where the library is older.
older=$(printf '%s\n%s\n' "$want" "$PINNED_NCCL" | sort -V | head -1)
if [ "$want" != "$PINNED_NCCL" ] && [ "$older" = "$want" ]; then
    run_step "nccl_info-pinned" "$logdir/steps/nccl_info-pinned.log" 120 "$here/nccl_info-pinned"
    if [ "$rc" = 2 ] && grep -q "version skew" "$logdir/steps/nccl_info-pinned.log"; then
        record "nccl_info (NCCL $PINNED_NCCL build): skew reported, exit $rc" PASS "$secs"
    else
        record "nccl_info (NCCL $PINNED_NCCL build): skew reported" FAIL "$secs" "exit $rc; see steps/nccl_info-pinned.log"
    fi
else
    run_step "nccl_info-pinned" "$logdir/steps/nccl_info-pinned.log" 120 "$here/nccl_info-pinned"
    if [ "$rc" = 0 ]; then
        record "nccl_info (NCCL $PINNED_NCCL build): no skew against $want" PASS "$secs"
    else
        record "nccl_info (NCCL $PINNED_NCCL build): no skew against $want" FAIL "$secs" "exit $rc"
    fi
fi

# 4b. examples/multi_process: one process per GPU with the TCP rendezvous, flags and torchrun's variables,
#     over NVLink (P2P) and over NCCL's network transport (sockets, as between two hosts).
multi() {  # multi PORT: rank 0 by flags, rank 1 by torchrun's variables
    "$here/multi_process" --rank 0 --world-size 2 --local-rank 0 --master "127.0.0.1:$1" & local r0=$!
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 "$here/multi_process"; local rc1=$?
    wait "$r0"; local rc0=$?
    [ "$rc0" = 0 ] && [ "$rc1" = 0 ]
}
export -f multi; export here
for transport in p2p net; do
    extra=(); [ "$transport" = net ] && extra=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
    port=$((29600 + ${#names[@]}))
    run_step "multi_process $transport" "$logdir/steps/multi_process-$transport.log" 120 "${extra[@]}" bash -c "multi $port"
    if [ "$rc" = 0 ] && [ "$(grep -c 'all-reduce of .* correct' "$logdir/steps/multi_process-$transport.log")" = 2 ]; then
        record "multi_process, 2 processes ($transport)" PASS "$secs"
    else
        record "multi_process, 2 processes ($transport)" FAIL "$secs" "exit $rc; see steps/multi_process-$transport.log"
    fi
done

# 5. The host checks, then every GPU test in its own process.
run_step "host checks" "$logdir/steps/host-checks.log" 120 "$here/gpu-tests" --test-threads=4
if [ "$rc" = 0 ]; then record "host checks (non-GPU tests)" PASS "$secs"; else record "host checks (non-GPU tests)" FAIL "$secs" "exit $rc"; fi

# GPU_TESTS (an extended regular expression) runs only the tests whose names match it.
mapfile -t tests < <("$here/gpu-tests" --list --ignored 2>/dev/null | sed -n 's/: test$//p' \
    | grep -vx child_process_entry | grep -E -- "${GPU_TESTS:-.}")
[ "${#tests[@]}" -gt 0 ] || record "list of GPU tests" FAIL 0.0 "gpu-tests --list --ignored listed none"
for t in "${tests[@]}"; do
    log="$logdir/steps/${t//::/.}.log"
    if [ "$(elapsed)" -gt "$budget" ]; then
        record "$t" FAIL 0.0 "not run: the run's ${budget}s budget was spent"
        continue
    fi
    echo "running $t ..."
    run_step "$t" "$log" "$per_test" "$here/gpu-tests" --exact "$t" --ignored --nocapture --test-threads=1
    case $rc in
        0) if grep -q "1 passed" "$log"; then record "$t" PASS "$secs"; else record "$t" FAIL "$secs" "ran no test"; fi ;;
        124|137) record "$t" FAIL "$secs" "TIMEOUT after ${per_test}s" ;;
        *) record "$t" FAIL "$secs" "exit $rc: $(first_failure "$log")" ;;
    esac
done

# 6. The table, last.
passed=0; failed=0
for r in "${results[@]}"; do
    if [ "$r" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
{
    echo
    echo "GPU suite on $(hostname): ${gpu_list:-GPUs unknown}, driver ${driver:-unknown}; libnccl $want from $nccl_dir"
    echo "${lib_line}"
    for i in "${!names[@]}"; do
        if [ -n "${notes[$i]}" ]; then echo "  ${names[$i]}: ${notes[$i]}"; fi
    done
    printf '%-74s %-6s %8s\n' "test" "result" "seconds"
    for i in "${!names[@]}"; do
        printf '%-74s %-6s %8s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
    done
    echo "total $(elapsed) s; full logs in $logdir"
    echo "$passed passed, $failed failed"
} | tee "$logdir/summary.txt"
[ "$failed" = 0 ]
