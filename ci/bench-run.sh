#!/usr/bin/env bash
# Runs on the GPU machine, from the folder ci/bench filled (.gpu-build/bench/): compiles the C twin there
# against the machine's NCCL, then runs the C twin and the Rust example (built by ci/bench) interleaved,
# collective by collective, and prints the side-by-side tables (ci/bench_table.py).
#
# Usage: bench-run.sh LOG_DIR       every output is kept in LOG_DIR (e.g. "$OUT/bench" on the device tool)
#
# Phases (about 5 minutes on 2×H200; BENCH_BUDGET_S stops starting new runs once spent):
#   helpers  --helpers of both programs, BENCH_HELPER_ROUNDS rounds (default 2)
#   full     all_reduce all_gather reduce_scatter broadcast sendrecv, 8 B to 4 GiB (-f 4: the last size is
#            2 GiB, as nccl-tests steps), -g 2 -w 5 -n 20 -c 1, eager: the busbw comparison
#   small    the same collectives, 8 B to 1 MiB, -w 20 -n 200 eager and -n 100 -G 10 (CUDA graph),
#            BENCH_ROUNDS rounds (default 2): the latency comparison, medians over rounds
# Order: C first in even-numbered slots, Rust first in odd ones, so that neither always runs first.
#
# Environment: NCCL_LIB (default: the PyTorch wheel's NCCL 2.28.9), NCCL_INC (default NCCL_LIB/../include),
# CUDA_HOME (default /usr/local/cuda), BENCH_ROUNDS, BENCH_HELPER_ROUNDS, BENCH_BUDGET_S (default 480),
# BENCH_COLLS (default the five above), BENCH_MAX (default 4G).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logs=${1:?usage: bench-run.sh LOG_DIR}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

# NVLink multicast is forbidden on these hosts: every process must see this.
export NCCL_NVLS_ENABLE=0
NCCL_LIB=${NCCL_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
NCCL_INC=${NCCL_INC:-$(cd "$NCCL_LIB/../include" 2>/dev/null && pwd || echo "$NCCL_LIB/../include")}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH=$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
rounds=${BENCH_ROUNDS:-2}
helper_rounds=${BENCH_HELPER_ROUNDS:-2}
budget=${BENCH_BUDGET_S:-480}
colls=(${BENCH_COLLS:-all_reduce all_gather reduce_scatter broadcast sendrecv})
max=${BENCH_MAX:-4G}
SECONDS=0

say() { printf 'bench-run [%3ds]: %s\n' "$SECONDS" "$*"; }

rust=$here/perf
twin=$here/perf_twin
[ -x "$rust" ] || { say "no Rust binary at $rust: run ci/bench on the build machine first"; exit 1; }
[ -f "$NCCL_INC/nccl.h" ] || { say "no nccl.h in $NCCL_INC (set NCCL_INC)"; exit 1; }
[ -f "$CUDA_HOME/include/cuda.h" ] || { say "no cuda.h in $CUDA_HOME/include (set CUDA_HOME)"; exit 1; }

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE NCCL_LIB=$NCCL_LIB NCCL_INC=$NCCL_INC"
    echo "nccl.h: $(grep -m1 'define NCCL_VERSION_CODE' "$NCCL_INC/nccl.h")"
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
    nvidia-smi topo -m 2>&1
    echo "Rust binary links: $(ldd "$rust" 2>&1 | grep -E 'nccl|not found' | tr -s ' \t' ' ')"
} > "$logs/environment.txt"

# The C twin, compiled here with the machine's compiler against the same NCCL the Rust binary loads.
cflags=(-O2 -std=c11 -Wall -Wextra -I"$CUDA_HOME/include" -I"$NCCL_INC")
ldflags=(-L"$NCCL_LIB" -l:libnccl.so.2 -Wl,-rpath,"$NCCL_LIB" -L"$CUDA_HOME/lib64/stubs" -lcuda -lm)
if command -v gcc >/dev/null; then
    compile=(gcc "${cflags[@]}" "$here/perf_twin.c" "${ldflags[@]}" -o "$twin")
elif command -v cc >/dev/null; then
    compile=(cc "${cflags[@]}" "$here/perf_twin.c" "${ldflags[@]}" -o "$twin")
else
    compile=(nvcc -O2 -I"$CUDA_HOME/include" -I"$NCCL_INC" "$here/perf_twin.c" -L"$NCCL_LIB" -l:libnccl.so.2
        -Xlinker -rpath -Xlinker "$NCCL_LIB" -L"$CUDA_HOME/lib64/stubs" -lcuda -lm -o "$twin")
fi
say "compiling the C twin: ${compile[*]}"
if ! "${compile[@]}" > "$logs/compile.txt" 2>&1; then
    cat "$logs/compile.txt"
    say "the C twin does not compile"
    exit 1
fi
[ -s "$logs/compile.txt" ] && cat "$logs/compile.txt"
echo "C twin links: $(ldd "$twin" 2>&1 | grep -E 'nccl|cuda|not found' | tr -s ' \t' ' ')" >> "$logs/environment.txt"
cat "$logs/environment.txt"

status=0
# run NAME LANG ARGS...: one program, its stdout in NAME-LANG.txt, stderr in NAME-LANG.err.
run() {
    local name=$1 lang=$2; shift 2
    local bin=$rust; [ "$lang" = c ] && bin=$twin
    if ((SECONDS > budget)); then
        say "skipped $name-$lang: the ${budget}s budget is spent"
        echo "skipped: budget" > "$logs/$name-$lang.skipped"
        return
    fi
    local t0=$SECONDS
    timeout 240 "$bin" "$@" > "$logs/$name-$lang.txt" 2> "$logs/$name-$lang.err"
    local rc=$?
    echo "$name-$lang rc=$rc $((SECONDS - t0))s: $(basename "$bin") $*" >> "$logs/runs.txt"
    if ((rc != 0)); then
        status=1
        say "$name-$lang exited $rc: $(tail -n 3 "$logs/$name-$lang.err" | tr '\n' ' ')"
    else
        say "$name-$lang done in $((SECONDS - t0))s"
    fi
}

# pair SLOT NAME ARGS...: both programs, the order alternating with SLOT.
pair() {
    local slot=$1 name=$2; shift 2
    if ((slot % 2 == 0)); then
        run "$name" c "$@"; run "$name" rust "$@"
    else
        run "$name" rust "$@"; run "$name" c "$@"
    fi
}

slot=0
for ((r = 1; r <= helper_rounds; r++)); do
    pair $((slot++)) "helpers-r$r" --helpers --calls 100000 --reps 11
done
for coll in "${colls[@]}"; do
    pair $((slot++)) "full-$coll-normal-r1" "$coll" -b 8 -e "$max" -f 4 -g 2 -w 5 -n 20 -c 1
done
for ((r = 1; r <= rounds; r++)); do
    for coll in "${colls[@]}"; do
        pair $((slot++)) "small-$coll-normal-r$r" "$coll" -b 8 -e 1M -f 4 -g 2 -w 20 -n 200 -c 1
        pair $((slot++)) "small-$coll-graph-r$r" "$coll" -b 8 -e 1M -f 4 -g 2 -w 20 -n 100 -G 10 -c 1
    done
done

say "all runs finished; tables:"
python3 "$here/bench_table.py" "$logs" || status=1
say "full outputs in $logs (runs.txt lists every command and exit status)"
exit $status
