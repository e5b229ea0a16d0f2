#!/usr/bin/env bash
# The GPU runner: runs what ci/gpu staged on a GPU host (no Rust needed there) and prints one table, then
# "N passed, M failed" last. Copied to .gpu-build/run.sh; run it from the repository checkout.
#
# Usage: bash .gpu-build/run.sh LOGDIR [VERSION[=LIBDIR][@RANKS] ...]
#
# Each VERSION is a build ci/gpu staged (.gpu-build/nccl-VERSION/, default: all of them), run against
# libnccl VERSION: the one in LIBDIR if given (an NCCL built from source: <nccl>/build/lib), else the first
# found on this host ($NCCL_LIB_DIR, ldconfig's cache, a search of /opt /usr /home /root), each candidate's
# version read by nccl_info. RANKS (commas: @2,4,8) are that version's rank counts, else GPU_RANKS (default
# "2"). Every multi-process test runs at each count on whatever GPUs this host has (METRALE_TEST_RANKS; the
# testkit's placement puts ranks that share a GPU on simulated hosts that talk over loopback sockets, or,
# with METRALE_TEST_PLACEMENT=multi-rank-gpu and NCCL 2.30+, on one host), so one GPU is enough. Each table
# row names the version and the placement ("8 ranks on 1 GPU, 8 hosts"), as the tests printed it.
# Steps (GPU_STEPS, default "info multi tests fixed kill"); GPU_RANKS_<STEP> (e.g. GPU_RANKS_kill="8")
# overrides the counts for one step:
#   info   once: nccl_info finds the GPUs and checks an all-reduce; every other build's nccl_info against
#          this library: one built against headers newer than this library must report the version skew (exit 2)
#   multi  at each count: examples/multi_process placed like the tests, started with flags and torchrun's
#          variables, and under mpirun where this host has Open MPI's (a SKIP row otherwise)
#   tests  at each count: the GPU, fault and NCCL API suites with cargo-nextest from the archive
#          (crates/testkit/gpu-nextest.toml: one test at a time, each killed after 300 s), except the fixed-count tests
#          and the peer-kill test; GPU_TESTS=<nextest filterset> picks some. The NCCL API suite's elastic
#          test runs the staged elastic example (METRALE_ELASTIC_BIN), the whole step beside a 3-member etcd
#          cluster on loopback (ci/etcd-cluster) for its etcd scenarios: Debian's etcd that ci/gpu staged
#          (.gpu-build/etcd/*.deb), unpacked into a temporary folder first on PATH, else the host's etcd on
#          PATH; without either those scenarios print SKIP. A test that prints
#          "SKIP <test>: <why>" (it needs more GPUs in one process than this host has) is a SKIP row; one
#          that prints "SKIP <test> (<check>): <why>" skipped that check only: a PASS row naming it
#   fixed  once: the tests of a fixed rank count (the GPU suite's fixed::, 300 MiB at 2 ranks, 16 ranks), and
#          the fault suite's tests of one process (leaks of streams, events and NCCL memory; 32 threads)
#   kill   at each count: the peer-kill test FAULTS_KILL_REPS times (default 1; each run kills a rank
#          METRALE_FAULT_KILL_REPS times, default 10, a fresh job of every rank each time), and once more with P2P and
#          SHM disabled where the host has 2 GPUs or more (on one GPU every rank is its own host: sockets
#          already), with a watchdog of FAULTS_KILL_WATCHDOG_S (default 10; NCCL never notices a dead peer
#          over P2P, so such a run lasts the whole deadline)
# On a one-GPU host: GPU_RANKS="2 4 8" bash .gpu-build/run.sh LOGDIR 2.29.7=/tmp/nccl-2.29.7/lib 2.28.9@2
# GPU_TEST_THREADS (default 1): tests run at once in each step, sharing the GPUs: the memory checks count
# each process's own device memory (nvidia-smi), the timing bounds are generous; speed numbers then mean less.
# GPU_NO_CAPTURE=1: the tests print as they run (nextest's --no-capture, one test at a time), so a step cut
# off at its budget keeps what its tests printed.
# GPU_BUDGET_S (default 3600): no step starts after it, and a step is cut off at it. GPU_WAIT_FOR_LIB_S: how
# long to wait for a LIBDIR's libnccl.so.2 to appear (a build still running). NCCL_NVLS_ENABLE=0 is
# exported for every process, whatever the caller set: NVLink multicast is forbidden on the project's GPU
# host, and the tests refuse to run with any other value (testkit's gpus()).
# Logs: LOGDIR/summary.txt (the table and every MEASURED line), machine.txt, nccl-VERSION/*.log.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# A hung rank's stacks come from gdb or cuda-gdb on PATH (crates/testkit/src/stacks.rs); CUDA's is in its bin/.
{ command -v gdb || command -v cuda-gdb; } >/dev/null || [ ! -x /usr/local/cuda/bin/cuda-gdb ] ||
    export PATH=$PATH:/usr/local/cuda/bin

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logdir=${1:?usage: bash .gpu-build/run.sh LOGDIR [VERSION[=LIBDIR][@RANKS] ...]}
shift
mkdir -p "$logdir" && logdir=$(cd "$logdir" && pwd) || exit 2
# shellcheck disable=SC1091
. "$here/BUILD" || { echo "$here/BUILD missing: stage with ci/gpu first" >&2; exit 2; }
# The checkout the archives' paths are remapped to (a CUDA 12 tree is one folder further down).
repo=$(cd "$here/${REPO_UP:-..}" && pwd)
# This run's temporary folder (etcd's files), removed when it ends.
scratch=$(mktemp -d /tmp/gpu-run.XXXXXX) || exit 2
trap 'rm -rf "$scratch"' EXIT
# unxz FILE: FILE's xz data, decompressed to stdout (xz, else python3's lzma).
unxz() {
    if command -v xz >/dev/null; then xz -dc "$1"
    else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi
}
# ci/gpu stages the binaries compressed: each unpacked beside its .xz, where it is missing or older.
for z in "$repo/.gpu-build/cargo-nextest.xz" "$here"/nccl-*/*.xz; do
    [ -e "$z" ] && [ "$z" -nt "${z%.xz}" ] || continue
    { unxz "$z" > "${z%.xz}.part" && chmod +x "${z%.xz}.part" && mv "${z%.xz}.part" "${z%.xz}"; } ||
        { echo "cannot unpack $z (needs xz or python3)" >&2; exit 2; }
done
runs=("$@")
[ ${#runs[@]} -gt 0 ] || read -ra runs <<< "$VERSIONS"
steps=" ${GPU_STEPS:-info multi tests fixed kill} "
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
budget=${GPU_BUDGET_S:-3600}
t0=$SECONDS

rows=()   # "RESULT<TAB>SECONDS<TAB>WHAT<TAB>NOTE"
times=()  # "LABEL LOG: SECONDS": the wall time of each nextest run (a step at one rank count)
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
    pv=$(METRALE_NCCL_LIBRARY=$d LD_LIBRARY_PATH=$d timeout 120 "$probe" 2>/dev/null | grep -m1 '^NCCL library' | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1)
    [ -n "$pv" ] && echo "found libnccl $pv in $d"
done | tee "$logdir/libnccl-found.txt"
mapfile -t found < <(sed -n 's/^found libnccl \([^ ]*\) in /\1 /p' "$logdir/libnccl-found.txt")

# etcd for the elastic etcd scenarios: the Debian packages ci/gpu staged, unpacked here (dpkg-deb, else ar or
# python3, and tar), else the host's own. The tests step then runs inside ci/etcd-cluster.
etcd_wrap=()
# unpack_deb DEB DIR: the package's files under DIR.
unpack_deb() {
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
    local members
    members=$(mktemp -d "$scratch/deb.XXXXXX") || return
    if command -v ar >/dev/null; then
        (cd "$members" && ar x "$1") || return
    else
        # A .deb is an ar archive: a 60-byte header a member (its name first, its size at 48), its data
        # padded to an even length.
        python3 - "$1" "$members" <<'PY' || return
import os, sys
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
at = 8
while at + 60 <= len(data):
    name, size = data[at:at + 16].decode().strip().rstrip("/"), int(data[at + 48:at + 58])
    open(os.path.join(sys.argv[2], os.path.basename(name)), "wb").write(data[at + 60:at + 60 + size])
    at += 60 + size + size % 2
PY
    fi
    mkdir -p "$2" && unxz "$members/data.tar.xz" | tar -x -C "$2"
}
debs=()
for deb in "$repo"/.gpu-build/etcd/etcd-server_*.deb "$repo"/.gpu-build/etcd/etcd-client_*.deb; do
    [ -e "$deb" ] && debs+=("$deb")
done
if [ ${#debs[@]} = 2 ]; then
    ok=true
    for deb in "${debs[@]}"; do unpack_deb "$deb" "$scratch/etcd" || ok=false; done
    if $ok && [ -x "$scratch/etcd/usr/bin/etcd" ] && [ -x "$scratch/etcd/usr/bin/etcdctl" ]; then
        export PATH=$scratch/etcd/usr/bin:$PATH
    else
        record FAIL 0 "etcd from .gpu-build/etcd" "cannot unpack ${debs[*]##*/} (needs dpkg-deb, ar or python3, and tar)"
    fi
fi
if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    etcd_wrap=("$repo/ci/etcd-cluster" --)
    echo "etcd for the elastic etcd scenarios: $(command -v etcd) ($(etcd --version | head -n 1))" |
        tee -a "$logdir/machine.txt"
fi

# nextest LOG LIMIT FILTERSET [OPTION...]: the staged suites of $build under cargo-nextest (inside WRAP, an
# array, where set), one row per test, labelled with the version and the placement the tests printed
# ("2 ranks on 1 GPU, 2 hosts (hosts)"), or with LABEL.
wrap=()
no_capture=()
[ "${GPU_NO_CAPTURE:-0}" = 1 ] && no_capture=(--no-capture)
nextest() {
    local log=$1 limit=$2 filter=$3; shift 3
    step "$log" "$limit" "${wrap[@]}" "$repo/.gpu-build/cargo-nextest" nextest run --archive-file "$build/tests.tar.zst" \
        --workspace-remap "$repo" --config-file "$here/nextest.toml" --profile gpu --run-ignored all \
        --color never --test-threads "${GPU_TEST_THREADS:-1}" "${no_capture[@]}" \
        -E "not ($not_tests) and ($filter)" "$@"
    local label plan
    plan=$(grep -m1 -oE '[0-9]+ ranks? on [0-9]+ GPUs?, [0-9]+ hosts? \([a-z-]+\)' "$log")
    label=${LABEL:-"[$tag${plan:+, $plan}]"}
    times+=("$label ${log#"$logdir"/}: ${secs} s")
    # The tests that said they could not run here: "SKIP module::test: why"; those that skipped one check
    # and ran the rest: "SKIP module::test (the check): why", a PASS row that names the check.
    declare -A skipped=() parts=()
    while IFS=$'\x1f' read -r name part why; do
        if [ -n "$part" ]; then parts[$name]="skipped $part: $why"; else skipped[$name]=$why; fi
    done < <(sed -nE 's/^(.* )?SKIP ([A-Za-z0-9_:]+)( \(([^)]*)\))?: (.*)$/\2\x1f\4\x1f\5/p' "$log")
    # nextest's status lines: "PASS [  1.2s] (3/9) metrale-gpu-sys::gpu name".
    while IFS=$'\t' read -r status s name; do
        case $status in
            PASS|LEAK)
                if [ -n "${skipped[${name#* }]+x}" ]; then record SKIP "$s" "$label $name" "${skipped[${name#* }]}"
                else record PASS "$s" "$label $name" "${parts[${name#* }]:-}"; fi ;;
            *) record FAIL "$s" "$label $name" "$status; see ${log#"$logdir"/}" ;;
        esac
    done < <(sed -nE 's/^ *([A-Z-]+) \[ *([0-9.]+)s\] (\[[ 0-9/]+\] )?(\([ 0-9/]+\) )?metrale-gpu-sys::(.*)$/\1\t\2\t\3\5/p' "$log" | grep -v '^SLOW')
    local cut
    cut=$(grep -oE '[0-9]+/[0-9]+ tests were not run' "$log")
    if [ -n "$cut" ]; then record FAIL 0 "$label nextest run cut off" "$cut; see ${log#"$logdir"/}"
    elif ! grep -q "Summary" "$log"; then record FAIL "$secs" "$label nextest run" "exit $rc, no summary; see ${log#"$logdir"/}"; fi
}

# counts STEP: the rank counts of STEP for this version (GPU_RANKS_<STEP>, else the version's, else GPU_RANKS).
counts() {
    local var=GPU_RANKS_$1
    echo "${!var:-$ranks}"
}

fixed_tests='test(/^fixed::/) | test(=leaks::no_leak_streams_events_nccl_memory) | test(=leaks::many_threads_share_one_driver_and_helpers_work)'
kill_test='test(=peers::peer_killed_mid_collective)'
example_tests='test(/^multiprocess::multi_process_example/)'
# Not tests: the child entry points and the fake ranks a CPU test starts (each is a rank of another test).
not_tests='test(=child_entry) | test(=peers::fake_killed_rank)'

for run in "${runs[@]}"; do
    ranks=${GPU_RANKS:-2}
    case $run in *@*) ranks=${run##*@}; ranks=${ranks//,/ }; run=${run%@*} ;; esac
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
    # The binaries load libnccl at run time: the loader's variable names this one (LD_LIBRARY_PATH serves a
    # build with feature link, and the C programs).
    export METRALE_NCCL_LIBRARY=$lib LD_LIBRARY_PATH=$lib
    # An older library than this build's headers, for the fault suite's loader test.
    unset METRALE_OLDER_NCCL_LIB
    for f in "${found[@]}"; do
        [ "$(printf '%s\n%s\n' "${f%% *}" "$v" | sort -V | head -1)" != "$v" ] && export METRALE_OLDER_NCCL_LIB=${f#* } && break
    done
    # nccl_info against this library, every time: it says the library's own version (a LIBDIR may hold
    # another than the build's), which rows name where it differs and the skew check compares against;
    # the info step records its verdict.
    step "$out/nccl_info.log" 120 "$build/nccl_info"
    info_rc=$rc info_secs=$secs
    libv=$(grep -m1 '^NCCL library' "$out/nccl_info.log" | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1)
    tag=$v; [ -n "$libv" ] && [ "$libv" != "$v" ] && tag="$v headers, libnccl $libv"
    echo "=== NCCL $v: headers $v, library $lib ($libv)${METRALE_OLDER_NCCL_LIB:+, older library $METRALE_OLDER_NCCL_LIB}"

    if [[ $steps == *" info "* ]]; then
        rc=$info_rc secs=$info_secs
        grep -q "sum correct" "$out/nccl_info.log"; verdict "[$tag] nccl_info: all-reduce correct" "$out/nccl_info.log" $((rc + $?))
        for other in "$here"/nccl-*/; do
            o=$(basename "$other"); o=${o#nccl-}; [ "$o" = "$v" ] && continue
            # Only ci/gpu's builds (a folder of libraries beside them is no build).
            [ -e "$other/tests.tar.zst" ] || continue
            step "$out/nccl_info-$o-build.log" 120 "$other/nccl_info"
            if [ "$(printf '%s\n%s\n' "$o" "${libv:-$v}" | sort -V | tail -1)" = "${libv:-$v}" ]; then want=0; else want=2; fi
            verdict "[$tag] nccl_info built for $o: exit $want" "$out/nccl_info-$o-build.log" $((rc != want))
        done
    fi

    if [[ $steps == *" multi "* ]]; then
        for n in $(counts multi); do
            METRALE_TEST_RANKS=$n METRALE_MULTI_PROCESS_BIN=$build/multi_process \
                nextest "$out/multi_process-$n.log" 600 "$example_tests"
        done
    fi

    if [[ $steps == *" tests "* ]]; then
        wrap=("${etcd_wrap[@]}")
        for n in $(counts tests); do
            METRALE_TEST_RANKS=$n METRALE_ELASTIC_BIN=$build/elastic nextest "$out/suites-$n.log" 3000 \
                "(${GPU_TESTS:-all()}) and not ($kill_test) and not ($fixed_tests) and not ($example_tests)"
        done
        wrap=()
    fi
    if [[ $steps == *" fixed "* ]]; then
        LABEL="[$tag, fixed rank counts on $gpus GPU(s)]" nextest "$out/fixed.log" 900 "$fixed_tests"
    fi
    if [[ $steps == *" kill "* ]]; then
        export METRALE_FAULT_WATCHDOG_S=${FAULTS_KILL_WATCHDOG_S:-10}
        for n in $(counts kill); do
            METRALE_TEST_RANKS=$n nextest "$out/peer-kill-$n.log" 900 "$kill_test" --stress-count "${FAULTS_KILL_REPS:-1}"
            if [ "$gpus" -ge 2 ]; then
                METRALE_TEST_RANKS=$n NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 nextest "$out/peer-kill-net-$n.log" 300 "$kill_test"
            fi
        done
        unset METRALE_FAULT_WATCHDOG_S
    fi
done

passed=0; failed=0; skipped=0; part=0
for r in "${rows[@]}"; do
    case ${r%%$'\t'*} in PASS) passed=$((passed + 1)) ;; SKIP) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
    case $r in PASS*$'\t'skipped\ *) part=$((part + 1)) ;; esac
done
{
    echo
    echo "GPU runner on $(hostname): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
    echo "measured:"
    grep -r "MEASURED " "$logdir"/nccl-*/ 2>/dev/null | sed -E 's|^.*/nccl-([^/]*)/([^:]*)\.log:.*MEASURED |  [\1 \2] |' | sort -u
    echo "time per run:"
    for t in "${times[@]}"; do echo "  $t"; done
    printf '%-6s %8s  %s\n' result seconds test
    for r in "${rows[@]}"; do
        IFS=$'\t' read -r res s what note <<< "$r"
        printf '%-6s %8s  %s%s\n' "$res" "$s" "$what" "${note:+  ($note)}"
    done
    echo "total $((SECONDS - t0)) s; logs in $logdir"
    echo "$passed passed$([ "$part" = 0 ] || echo " ($part with a check skipped)"), $failed failed, $skipped skipped"
} | tee "$logdir/summary.txt"
[ "$failed" = 0 ]
