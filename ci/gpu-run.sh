#!/usr/bin/env bash
# The GPU runner: runs what ci/gpu staged on a GPU host (no Rust needed there) and prints one table, then
# "N passed, M failed" last. Copied to .gpu-build/run.sh; run it from the repository checkout.
#
# Usage: bash .gpu-build/run.sh LOGDIR [VERSION[=LIBDIR] ...]
#
# Each VERSION is a build ci/gpu staged (.gpu-build/nccl-VERSION/, default: all of them), run against
# libnccl VERSION: the one in LIBDIR if given (an NCCL built from source: <nccl>/build/lib), else the first
# found on this host ($NCCL_LIB_DIR, ldconfig's cache, a search of /opt /usr /home /root), each candidate's
# version read by nccl_info. Steps per version (GPU_STEPS, default "info multi tests kill"):
#   info   nccl_info finds the GPUs and checks an all-reduce; every other build's nccl_info against this
#          library: one built against newer headers must report the version skew (exit 2)
#   multi  examples/multi_process, 2 processes (flags, torchrun's variables) over P2P and over sockets;
#          under mpirun too when this host has Open MPI's
#   tests  the GPU, fault and NCCL API suites with cargo-nextest from the archive (ci/gpu-nextest.toml:
#          one test at a time, each killed after 240 s); GPU_TESTS=<nextest filterset> picks some. The
#          NCCL API suite's elastic test runs the staged examples/elastic (METRALE_ELASTIC_BIN)
#   kill   the peer-kill test FAULTS_KILL_REPS times (default 1) over P2P and once over sockets, with a
#          watchdog of FAULTS_KILL_WATCHDOG_S (default 10; NCCL never notices a dead peer over P2P, so each
#          run lasts the whole deadline)
# GPU_BUDGET_S (default 3600): no step starts after it, and a step is cut off at it. GPU_WAIT_FOR_LIB_S: how
# long to wait for a LIBDIR's libnccl.so.2 to appear (a build still running). NCCL_NVLS_ENABLE=0 is
# exported for every process, whatever the caller set: NVLink multicast is forbidden on the project's GPU
# host, and the tests refuse to run with any other value (testkit's gpus()).
# Logs: LOGDIR/summary.txt (the table and every MEASURED line), machine.txt, nccl-VERSION/*.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logdir=${1:?usage: bash .gpu-build/run.sh LOGDIR [VERSION[=LIBDIR] ...]}
shift
mkdir -p "$logdir" && logdir=$(cd "$logdir" && pwd) || exit 2
# shellcheck disable=SC1091
. "$here/BUILD" || { echo "$here/BUILD missing: stage with ci/gpu first" >&2; exit 2; }
# The checkout the archives' paths are remapped to (a CUDA 12 tree is one folder further down).
repo=$(cd "$here/${REPO_UP:-..}" && pwd)
runs=("$@")
[ ${#runs[@]} -gt 0 ] || read -ra runs <<< "$VERSIONS"
steps=" ${GPU_STEPS:-info multi tests kill} "
budget=${GPU_BUDGET_S:-3600}
t0=$SECONDS

rows=()   # "RESULT<TAB>SECONDS<TAB>WHAT<TAB>NOTE"
record() { rows+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"${4:-}"); }
left() { echo $((budget - (SECONDS - t0))); }

# step LOG LIMIT CMD...: runs CMD with its output in LOG, cut off at LIMIT or the budget; sets rc, secs.
step() {
    local log=$1 limit=$2 start=$SECONDS; shift 2
    [ "$(left)" -lt "$limit" ] && limit=$(left)
    if [ "$limit" -le 0 ]; then rc=124; secs=0; echo "not run: the ${budget}s budget was spent" > "$log"; return; fi
    echo ">>> $*" > "$log"
    timeout -k 10 "$limit" "$@" >> "$log" 2>&1
    rc=$?; secs=$((SECONDS - start))
    echo "<<< exit status $rc after ${secs}s" >> "$log"
}
verdict() { # verdict WHAT LOG OK-CONDITION-EXIT-STATUS
    if [ "$3" = 0 ]; then record PASS "$secs" "$1"; else record FAIL "$secs" "$1" "exit $rc; see ${2#"$logdir"/}"; fi
}

{ nvidia-smi; nvidia-smi topo -m; uname -a; ldd --version | head -1; env | grep -E '^(NCCL|CUDA|LD_)' | sort; } \
    > "$logdir/machine.txt" 2>&1
echo "GPU runner: builds for NCCL ${runs[*]} (CUDA ${CUDA_HEADERS:-13} headers) of $COMMIT ($BUILT); logs in $logdir"

# The host's libnccl folders and their versions (read by a staged nccl_info, whatever its headers).
probe=$here/nccl-${VERSIONS%% *}/nccl_info
dirs=()
[ -n "${NCCL_LIB_DIR:-}" ] && dirs+=("$NCCL_LIB_DIR")
while read -r lib; do dirs+=("$(dirname "$lib")"); done < <(
    { ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2/ { print $NF }'
      timeout 60 find /opt /usr /home /root -maxdepth 9 -name 'libnccl.so.2' 2>/dev/null; } | sort -u)
for d in "${dirs[@]}"; do
    pv=$(LD_LIBRARY_PATH=$d timeout 120 "$probe" 2>/dev/null | grep -m1 '^NCCL library' | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1)
    [ -n "$pv" ] && echo "found libnccl $pv in $d"
done | tee "$logdir/libnccl-found.txt"
mapfile -t found < <(sed -n 's/^found libnccl \([^ ]*\) in /\1 /p' "$logdir/libnccl-found.txt")

# nextest LOG LIMIT FILTERSET [OPTION...]: the staged suites of $build under cargo-nextest, one row per test.
nextest() {
    local log=$1 limit=$2 filter=$3; shift 3
    step "$log" "$limit" "$repo/.gpu-build/cargo-nextest" nextest run --archive-file "$build/tests.tar.zst" \
        --workspace-remap "$repo" --config-file "$here/nextest.toml" --profile gpu --run-ignored all \
        --color never -E "not test(=child_entry) and ($filter)" "$@"
    # nextest's status lines: "PASS [  1.2s] (3/9) metrale-gpu-sys::gpu name".
    while IFS=$'\t' read -r status s name; do
        case $status in PASS|LEAK) record PASS "$s" "[$v] $name" ;; *) record FAIL "$s" "[$v] $name" "$status; see ${log#"$logdir"/}" ;; esac
    done < <(sed -nE 's/^ *([A-Z-]+) \[ *([0-9.]+)s\] (\[[ 0-9/]+\] )?(\([ 0-9/]+\) )?metrale-gpu-sys::(.*)$/\1\t\2\t\3\5/p' "$log" | grep -v '^SLOW')
    local cut
    cut=$(grep -oE '[0-9]+/[0-9]+ tests were not run' "$log")
    if [ -n "$cut" ]; then record FAIL 0 "[$v] nextest run cut off" "$cut; see ${log#"$logdir"/}"
    elif ! grep -q "Summary" "$log"; then record FAIL "$secs" "[$v] nextest run" "exit $rc, no summary; see ${log#"$logdir"/}"; fi
}

for run in "${runs[@]}"; do
    v=${run%%=*}; build=$here/nccl-$v; out=$logdir/nccl-$v
    mkdir -p "$out"
    [ -d "$build" ] || { record FAIL 0 "NCCL $v" "no staged build $build (ci/gpu $v)"; continue; }
    lib=""; [ "$run" != "$v" ] && lib=${run#*=}
    if [ -n "$lib" ]; then
        for _ in $(seq "${GPU_WAIT_FOR_LIB_S:-0}"); do [ -e "$lib/libnccl.so.2" ] && break; sleep 1; done
        [ -e "$lib/libnccl.so.2" ] || { record FAIL 0 "NCCL $v" "no libnccl.so.2 in $lib"; continue; }
    else
        for f in "${found[@]}"; do [ "${f%% *}" = "$v" ] && lib=${f#* } && break; done
        [ -n "$lib" ] || { record FAIL 0 "NCCL $v" "no libnccl $v on this host (see libnccl-found.txt); give VERSION=LIBDIR"; continue; }
    fi
    export LD_LIBRARY_PATH=$lib
    # An older library than this build's headers, for the fault suite's loader test.
    unset METRALE_OLDER_NCCL_LIB
    for f in "${found[@]}"; do
        [ "$(printf '%s\n%s\n' "${f%% *}" "$v" | sort -V | head -1)" != "$v" ] && export METRALE_OLDER_NCCL_LIB=${f#* } && break
    done
    echo "=== NCCL $v: headers $v, library $lib${METRALE_OLDER_NCCL_LIB:+, older library $METRALE_OLDER_NCCL_LIB}"

    if [[ $steps == *" info "* ]]; then
        step "$out/nccl_info.log" 120 "$build/nccl_info"
        grep -q "sum correct" "$out/nccl_info.log"; verdict "[$v] nccl_info: all-reduce correct" "$out/nccl_info.log" $((rc + $?))
        for other in "$here"/nccl-*/; do
            o=$(basename "$other"); o=${o#nccl-}; [ "$o" = "$v" ] && continue
            step "$out/nccl_info-$o-build.log" 120 "$other/nccl_info"
            if [ "$(printf '%s\n%s\n' "$o" "$v" | sort -V | tail -1)" = "$v" ]; then want=0; else want=2; fi
            verdict "[$v] nccl_info built for $o: exit $want" "$out/nccl_info-$o-build.log" $((rc != want))
        done
    fi

    if [[ $steps == *" multi "* ]]; then
        for transport in p2p net; do
            log=$out/multi_process-$transport.log; port=$((29500 + RANDOM % 1000))
            extra=(); [ $transport = net ] && extra=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
            step "$log" 120 env "${extra[@]}" bash -c "
                '$build/multi_process' --rank 0 --world-size 2 --local-rank 0 --master 127.0.0.1:$port & r0=\$!
                RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port '$build/multi_process'; rc1=\$?
                wait \$r0 && exit \$rc1"
            [ "$(grep -c 'processes correct' "$log")" = 2 ]; verdict "[$v] multi_process, 2 processes ($transport)" "$log" $((rc + $?))
        done
        if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
            log=$out/multi_process-mpirun.log; root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
            step "$log" 120 env MASTER_ADDR=127.0.0.1 MASTER_PORT=$((30500 + RANDOM % 1000)) mpirun "${root[@]}" -np 2 \
                --oversubscribe -x MASTER_ADDR -x MASTER_PORT -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$build/multi_process"
            [ "$(grep -c 'processes correct' "$log")" = 2 ]; verdict "[$v] multi_process under mpirun" "$log" $((rc + $?))
        else
            record SKIP 0 "[$v] multi_process under mpirun" "no Open MPI mpirun on this host"
        fi
    fi

    kill_test='test(=peers::peer_killed_mid_collective)'
    if [[ $steps == *" tests "* ]]; then
        METRALE_ELASTIC_BIN=$build/elastic nextest "$out/suites.log" 3000 "(${GPU_TESTS:-all()}) and not $kill_test"
    fi
    if [[ $steps == *" kill "* ]]; then
        export METRALE_FAULT_WATCHDOG_S=${FAULTS_KILL_WATCHDOG_S:-10}
        nextest "$out/peer-kill-p2p.log" 900 "$kill_test" --stress-count "${FAULTS_KILL_REPS:-1}"
        NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 nextest "$out/peer-kill-net.log" 300 "$kill_test"
        unset METRALE_FAULT_WATCHDOG_S
    fi
done

passed=0; failed=0; skipped=0
for r in "${rows[@]}"; do
    case ${r%%$'\t'*} in PASS) passed=$((passed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
done
{
    echo
    echo "GPU runner on $(hostname): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
    echo "measured:"
    grep -r "MEASURED " "$logdir"/nccl-*/ 2>/dev/null | sed -E 's|^.*/nccl-([^/]*)/[^:]*:.*MEASURED |  [\1] |' | sort -u
    printf '%-6s %8s  %s\n' result seconds test
    for r in "${rows[@]}"; do
        IFS=$'\t' read -r res s what note <<< "$r"
        printf '%-6s %8s  %s%s\n' "$res" "$s" "$what" "${note:+  ($note)}"
    done
    echo "total $((SECONDS - t0)) s; logs in $logdir"
    echo "$passed passed, $failed failed, $skipped skipped"
} | tee "$logdir/summary.txt"
[ "$failed" = 0 ]
