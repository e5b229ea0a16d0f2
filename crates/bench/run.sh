#!/usr/bin/env bash
# Runs the benchmark on a GPU host, from the folder bench/stage filled (.gpu-build/bench/, which may be
# copied anywhere): finds the NCCL that perf was built for, compiles the C twin against it, then runs the
# programs (Rust perf through the crate, the C twin, and NVIDIA's nccl-tests when NCCL_TESTS_BUILD names
# a build of it) in turn, phase by phase, and prints the side-by-side tables (table.py).
#
# Usage: bash run.sh LOG_DIR      every program's output is kept in LOG_DIR; the tables in LOG_DIR/summary.md
#
# Phases (BENCH_PHASES, in this order; about 6 minutes on 2 H200s with all three programs):
#   small    all_reduce 8 B to 16 MiB (-f 8), -w 20 -n 100, in each mode, BENCH_ROUNDS rounds (default 3)
#   large    all_reduce 64 MiB to 1 GiB (-f 2), -w 5 -n 20 (-n 10 with a graph), in each mode,
#            BENCH_LARGE_ROUNDS rounds (default 2)
#   colls    BENCH_COLLS (default all_gather reduce_scatter broadcast sendrecv), 8 B to 1 GiB (-f 8),
#            -w 5 -n 20, default mode, one round
#   helpers  --helpers of perf and the C twin (no nccl-tests counterpart), pinned to one core,
#            BENCH_HELPER_ROUNDS rounds (default 3)
# Modes (BENCH_MODES): default, graph (-G 20), reg (-R 1), sym (-R 2), symgraph (-R 2 -G 20).
# Within a phase the programs take turns going first. No run starts after BENCH_BUDGET_S seconds
# (default 540) and each is cut at BENCH_BUDGET_S + 45, so that the whole script ends within 10 minutes.
#
# Environment:
#   NCCL_TESTS_BUILD  the folder of an NVIDIA/nccl-tests build (all_reduce_perf, ...), built per its own
#                   README against the same NCCL; not given: nccl-tests' column is left out (summary.md says so)
#   NCCL_HOME       a folder with include/nccl.h and lib/libnccl.so.2: a pip wheel's nvidia/nccl, or an NCCL
#                   built from source (<nccl>/build); default: searched (find_nccl below) for the version
#                   perf was built for
#   CUDA_HOME       the CUDA toolkit (default /usr/local/cuda): cuda.h and the libcuda stub for the twin
#   BENCH_WORK      where the C twin is compiled (default /tmp/metrale-gpu-bench)
#   BENCH_GPUS      GPUs driven by each program (-g, default 2)
#   NCCL_NVLS_ENABLE  default 0 (NVLink SHARP off: some hosts forbid it); set it to 1 to allow it
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logs=${1:?usage: run.sh LOG_DIR}
mkdir -p "$logs" || exit 2
logs=$(cd "$logs" && pwd)
SECONDS=0
status=0
say() { printf 'bench [%3ds]: %s\n' "$SECONDS" "$*"; }

export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
work=${BENCH_WORK:-/tmp/metrale-gpu-bench}
gpus=${BENCH_GPUS:-2}
budget=${BENCH_BUDGET_S:-540}
phases=${BENCH_PHASES:-small large colls helpers}
read -r -a modes <<< "${BENCH_MODES:-default graph reg sym symgraph}"
read -r -a colls <<< "${BENCH_COLLS:-all_gather reduce_scatter broadcast sendrecv}"
rounds=${BENCH_ROUNDS:-3}
large_rounds=${BENCH_LARGE_ROUNDS:-2}
helper_rounds=${BENCH_HELPER_ROUNDS:-3}

rust=$here/perf
# perf built with the crate's feature `link` (DT_NEEDED libnccl), where bench/stage built one: the
# "linked" program, beside perf's run-time loading.
linked=$here/perf-linked
[ -x "$rust" ] || { say "no perf binary in $here: run crates/bench/stage on the build machine first"; exit 2; }
want=$(sed -n 's/^NCCL_VERSION=//p' "$here/BUILD-INFO.txt" 2>/dev/null)
[ -n "$want" ] || { say "no NCCL_VERSION in $here/BUILD-INFO.txt: run crates/bench/stage first"; exit 2; }
[ -f "$CUDA_HOME/include/cuda.h" ] || { say "no cuda.h in $CUDA_HOME/include: set CUDA_HOME"; exit 2; }

# The version nccl.h in folder $1 declares, as 2.28.9.
header_version() {
    awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END{if (v["NCCL_MAJOR"] != "") print v["NCCL_MAJOR"] "." v["NCCL_MINOR"] "." v["NCCL_PATCH"]}' "$1/nccl.h" 2>/dev/null
}

# Sets NCCL_INC and NCCL_LIB: NCCL_HOME, or the first installation of NCCL $want found among pip wheels
# (any Python environment under /opt, /usr, /usr/local, ~/.local), /usr/local/nccl* and /opt/nccl*, and the
# system folders (/usr/include + the multiarch lib folder).
find_nccl() {
    local cand=() c inc lib v
    if [ -n "${NCCL_HOME:-}" ]; then
        cand=("$NCCL_HOME")
    else
        for c in /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl /opt/*/lib/python3*/site-packages/nvidia/nccl \
                 /usr/local/lib/python3*/dist-packages/nvidia/nccl /usr/local/lib/python3*/site-packages/nvidia/nccl \
                 /usr/lib/python3/dist-packages/nvidia/nccl "$HOME"/.local/lib/python3*/site-packages/nvidia/nccl \
                 /usr/local/nccl* /opt/nccl*; do
            [ -d "$c" ] && cand+=("$c")
        done
        cand+=("system")
    fi
    for c in "${cand[@]}"; do
        if [ "$c" = system ]; then
            inc=/usr/include lib=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
        else
            inc=$c/include lib=$c/lib
        fi
        v=$(header_version "$inc")
        echo "candidate $c: nccl.h ${v:-missing}, $( [ -e "$lib/libnccl.so.2" ] && echo "libnccl.so.2 present" || echo "no libnccl.so.2")" >> "$logs/find-nccl.txt"
        if [ -n "$v" ] && [ -e "$lib/libnccl.so.2" ] && { [ "$v" = "$want" ] || [ -n "${NCCL_HOME:-}" ]; }; then
            NCCL_INC=$inc NCCL_LIB=$lib
            [ "$v" = "$want" ] || say "warning: NCCL_HOME holds NCCL $v, perf was built for $want (perf refuses an older library)"
            return 0
        fi
    done
    return 1
}
: > "$logs/find-nccl.txt"
if ! find_nccl; then
    cat "$logs/find-nccl.txt"
    say "no NCCL $want with nccl.h and libnccl.so.2 here: set NCCL_HOME=<dir with include/ and lib/>, or stage"
    say "perf for a version this host has (crates/bench/stage VERSION)"
    exit 2
fi
export LD_LIBRARY_PATH=$NCCL_LIB:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# perf loads libnccl at run time (the crate's default): this names the same library for it.
export METRALE_NCCL_LIBRARY=$NCCL_LIB/libnccl.so.2
say "NCCL $(header_version "$NCCL_INC"): $NCCL_INC, $NCCL_LIB"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    cat "$here/BUILD-INFO.txt"
    echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NCCL_INC=$NCCL_INC NCCL_LIB=$NCCL_LIB CUDA_HOME=$CUDA_HOME"
    echo "nccl.h: $(header_version "$NCCL_INC")"
    [ -x "$CUDA_HOME/bin/nvcc" ] && "$CUDA_HOME/bin/nvcc" --version 2>&1 | tail -n 1
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv 2>&1
    nvidia-smi topo -m 2>&1
    echo "perf links: $(ldd "$rust" 2>&1 | grep -E 'nccl|not found' | tr -s ' \t' ' ') (none: loaded at run time from METRALE_NCCL_LIBRARY=$METRALE_NCCL_LIBRARY)"
    [ -x "$linked" ] && echo "perf-linked links: $(ldd "$linked" 2>&1 | grep -E 'nccl|not found' | tr -s ' \t' ' ')"
} > "$logs/environment.txt"

# The C twin, compiled here against the same NCCL.
twin=$work/perf_twin
mkdir -p "$work"
say "compiling the C twin"
if ! gcc -O2 -std=c11 -Wall -Wextra -I"$CUDA_HOME/include" -I"$NCCL_INC" "$here/perf_twin.c" \
        -L"$NCCL_LIB" -l:libnccl.so.2 -Wl,-rpath,"$NCCL_LIB" -L"$CUDA_HOME/lib64/stubs" -lcuda -lm \
        -o "$twin" > "$logs/compile-twin.txt" 2>&1; then
    cat "$logs/compile-twin.txt"
    say "the C twin does not compile"
    exit 1
fi

# nccl-tests: a build given in NCCL_TESTS_BUILD, or none (perf and the twin only). notes.md goes into summary.md.
: > "$logs/notes.md"
rs="rust"
[ -x "$linked" ] && rs="rust linked"
programs="$rs c nt"
nt_bin=${NCCL_TESTS_BUILD:-}
if [ -z "$nt_bin" ]; then
    programs="$rs c"
    echo "- nccl-tests was not run (no NCCL_TESTS_BUILD): its column and the Rust/nccl-tests targets are left out." >> "$logs/notes.md"
    say "no NCCL_TESTS_BUILD: perf and the C twin only"
elif [ ! -x "$nt_bin/all_reduce_perf" ]; then
    say "NCCL_TESTS_BUILD=$nt_bin has no all_reduce_perf: give the folder nccl-tests' make wrote its *_perf to"
    exit 2
else
    nt_bin=$(cd "$nt_bin" && pwd)
    nt_nccl=$(ldd "$nt_bin/all_reduce_perf" 2>/dev/null | awk '/libnccl/ {print $3; exit}')
    if [ "$(readlink -f "$nt_nccl" 2>/dev/null)" != "$(readlink -f "$NCCL_LIB/libnccl.so.2")" ]; then
        echo "- nccl-tests loads ${nt_nccl:-no libnccl}, not $NCCL_LIB/libnccl.so.2: its column is another NCCL's." >> "$logs/notes.md"
        say "warning: nccl-tests loads ${nt_nccl:-no libnccl}, perf and the twin $NCCL_LIB/libnccl.so.2"
    fi
fi
echo "nccl-tests: ${nt_bin:-not given} ($(find "${nt_bin:-/nonexistent}" -maxdepth 1 -name '*_perf' 2>/dev/null | wc -l) binaries)" >> "$logs/environment.txt"
cat "$logs/environment.txt"
say "setup done"

skipped=() failed=()  # runs, for notes.md
pin=()  # a prefix for every command (the helpers phase pins to one core)
# run NAME PROG ARGS...: one program (rust, linked, c or nt; ARGS start with the collective); stdout in NAME-PROG.txt.
run() {
    local name=$1 prog=$2; shift 2
    local cmd
    case $prog in
        rust) cmd=("$rust" "$@") ;;
        linked) cmd=("$linked" "$@") ;;
        c) cmd=("$twin" "$@") ;;
        nt) cmd=("$nt_bin/$1_perf" "${@:2}") ;;
    esac
    if [ ! -x "${cmd[0]}" ]; then
        echo "$name-$prog: no program ${cmd[0]}" >> "$logs/runs.txt"
        return
    fi
    local left=$((budget - SECONDS))
    if ((left <= 0)); then
        echo "skipped: the ${budget}s budget was spent" > "$logs/$name-$prog.skipped"
        skipped+=("$name-$prog")
        return
    fi
    local t0=$SECONDS
    timeout -k 5 $((left + 45 < 150 ? left + 45 : 150)) "${pin[@]}" "${cmd[@]}" > "$logs/$name-$prog.txt" 2> "$logs/$name-$prog.err"
    local rc=$?
    echo "$name-$prog rc=$rc $((SECONDS - t0))s: ${cmd[*]}" >> "$logs/runs.txt"
    if ((rc != 0)); then
        status=1
        failed+=("$name-$prog (exit $rc)")
        say "$name-$prog exited $rc: $(tail -n 3 "$logs/$name-$prog.err" | tr '\n' ' ')"
    fi
}

slot=0
# turns NAME PROGS ARGS...: each program of PROGS ("rust c nt" or "rust c"), the first one changing with every call.
turns() {
    local name=$1 n i progs
    read -r -a progs <<< "$2"
    shift 2
    n=${#progs[@]}
    for ((i = 0; i < n; i++)); do
        run "$name" "${progs[(slot + i) % n]}" "$@"
    done
    slot=$((slot + 1))
}

# mode_args MODE: sets the array margs to the mode's nccl-tests flags.
mode_args() {
    case $1 in
        default) margs=() ;;
        graph) margs=(-G 20) ;;
        reg) margs=(-R 1) ;;
        sym) margs=(-R 2) ;;
        symgraph) margs=(-R 2 -G 20) ;;
        *) say "unknown mode $1 (default, graph, reg, sym, symgraph)"; margs=(--unknown-mode "$1") ;;
    esac
}

common=(-g "$gpus" -c 1)
for phase in $phases; do
    say "phase $phase"
    case $phase in
        small)
            for ((r = 1; r <= rounds; r++)); do
                for m in "${modes[@]}"; do
                    mode_args "$m"
                    turns "small-all_reduce-$m-r$r" "$programs" all_reduce -b 8 -e 16M -f 8 "${common[@]}" \
                        -w 20 -n 100 "${margs[@]}"
                done
            done ;;
        large)
            for ((r = 1; r <= large_rounds; r++)); do
                for m in "${modes[@]}"; do
                    mode_args "$m"
                    iters=20; case $m in *graph) iters=10 ;; esac
                    turns "large-all_reduce-$m-r$r" "$programs" all_reduce -b 64M -e 1G -f 2 "${common[@]}" \
                        -w 5 -n "$iters" "${margs[@]}"
                done
            done ;;
        colls)
            for c in "${colls[@]}"; do
                turns "colls-$c-default-r1" "$programs" "$c" -b 8 -e 1G -f 8 "${common[@]}" -w 5 -n 20
            done ;;
        helpers)
            command -v taskset > /dev/null && pin=(taskset -c "${BENCH_HELPER_CPU:-1}")
            for ((r = 1; r <= helper_rounds; r++)); do
                turns "helpers-r$r" "rust c" --helpers --calls 100000 --reps 11
            done
            pin=() ;;
        *) say "unknown phase $phase (small, large, colls, helpers)"; status=1 ;;
    esac
done

if ((${#skipped[@]})); then
    status=1
    echo "- ${#skipped[@]} runs did not start, the ${budget} s budget (BENCH_BUDGET_S) being spent: ${skipped[*]}" >> "$logs/notes.md"
fi
if ((${#failed[@]})); then
    echo "- ${#failed[@]} runs failed (their .err files say why): ${failed[*]}" >> "$logs/notes.md"
fi
say "all runs finished; tables:"
python3 "$here/table.py" "$logs" || status=1
say "full outputs in $logs (runs.txt: every command, exit status and duration)"
exit $status
