/* perf_twin: the C reference for the Rust perf program (bench/src/). The same loop, the same buffers
 * (ncclMemAlloc, registered as -R asks), the same timing, the same check and the same output (nccl-tests'
 * columns), calling NCCL and the CUDA driver API directly, so that the two programs can be run side by side
 * and diffed (bench/run.sh does). --helpers times the direct calls that the crate's helpers wrap
 * (cuStreamQuery, cuEventRecord, cuStreamWaitEvent, a status compare, ncclGroupStart/End).
 *
 * Plain C11, NCCL 2.27 or newer (symmetric windows); build, with the CUDA toolkit in <cuda>:
 *   gcc -O2 -std=c11 -Wall -Wextra -I<cuda>/include -I<nccl>/include perf_twin.c \
 *       -L<nccl>/lib -l:libnccl.so.2 -Wl,-rpath,<nccl>/lib -L<cuda>/lib64/stubs -lcuda -lm -o perf_twin
 * (the stub libcuda.so only satisfies the linker: at run time libcuda.so.1 comes from the driver).
 *
 * Keep in step with bench/src/{main,args,coll,data,helpers,register}.rs: any difference between the two
 * programs other than the language is a bug in the comparison. */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 27, 0)
#error "perf_twin needs NCCL 2.27 or newer (ncclCommWindowRegister), as metrale-gpu-sys does"
#endif

/* ---------------------------------------------------------------- errors */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "perf_twin: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void cu_fail(CUresult r, const char *call) {
    const char *name = NULL, *text = NULL;
    cuGetErrorName(r, &name);
    cuGetErrorString(r, &text);
    fprintf(stderr, "perf_twin: error: %s failed: CUDA error %d %s (%s)\n", call, (int)r,
            name ? name : "an unknown CUresult", text ? text : "no description");
    exit(1);
}

static void nccl_fail(ncclResult_t r, const char *call) {
    const char *last = ncclGetLastError(NULL);
    fprintf(stderr, "perf_twin: error: %s failed: NCCL error %d (%s)%s%s\n", call, (int)r, ncclGetErrorString(r),
            last && *last ? "; NCCL's last error: " : "", last && *last ? last : "");
    exit(1);
}

#define CU(call)                                   \
    do {                                           \
        CUresult r_ = (call);                      \
        if (r_ != CUDA_SUCCESS) cu_fail(r_, #call); \
    } while (0)
#define NC(call)                                      \
    do {                                              \
        ncclResult_t r_ = (call);                     \
        if (r_ != ncclSuccess) nccl_fail(r_, #call);  \
    } while (0)

/* ---------------------------------------------------------------- options (args.rs) */

enum coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALLTOALL, SENDRECV, NCOLLS };
static const char *coll_names[NCOLLS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                         "reduce",     "alltoall",   "sendrecv"};
static int coll_reduces(int c) { return c == ALL_REDUCE || c == REDUCE_SCATTER || c == REDUCE; }
static int coll_rooted(int c) { return c == BROADCAST || c == REDUCE; }
static int coll_in_place_unchecked(int c) { return c == ALLTOALL || c == SENDRECV; }

enum dtype { T_INT8, T_UINT8, T_INT32, T_UINT32, T_INT64, T_UINT64, T_HALF, T_FLOAT, T_DOUBLE, T_BF16, NTYPES };
static const char *type_names[NTYPES] = {"int8",   "uint8", "int32", "uint32", "int64",
                                         "uint64", "half",  "float", "double", "bfloat16"};
static const size_t type_sizes[NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const ncclDataType_t type_nccl[NTYPES] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                                 ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                                 ncclFloat64, ncclBfloat16};
static int type_is_float(int t) { return t == T_HALF || t == T_FLOAT || t == T_DOUBLE || t == T_BF16; }

enum op { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, NOPS };
static const char *op_names[NOPS] = {"sum", "prod", "max", "min", "avg"};
static const ncclRedOp_t op_nccl[NOPS] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

struct options {
    int coll;
    size_t min_bytes, max_bytes, step_factor, step_bytes;
    int gpus, warmup, iters, check, dtype, op, root, graph_launches;
    int local_register; /* -R: 0 off, 1 ncclCommRegister, 2 symmetric windows */
    int helpers;
    size_t helper_calls;
    int helper_reps;
};

static void usage(const char *program) {
    printf("C twin of metrale-gpu-sys' benchmark, bench/src/ (nccl-tests' format, one process driving -g GPUs).\n\n"
           "Usage: %s [COLLECTIVE] [-b SIZE] [-e SIZE] [-f N] [-i SIZE] [-g N] [-w N] [-n N] [-c 0|1]\n"
           "          [-d TYPE] [-o OP] [-r ROOT] [-G N] [-R 0|1|2]\n"
           "       %s --helpers [--calls N] [--reps N]\n\n"
           "COLLECTIVE: all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv\n"
           "TYPE: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16; OP: sum, prod, max,\n"
           "min, avg. Options and defaults as perf --help (the Rust program) describes them.\n",
           program, program);
}

static size_t parse_size(const char *text) {
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text) die("not a size: '%s' (expected e.g. 8, 64K, 128M, 4G)", text);
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end != '\0') die("not a size: '%s' (expected e.g. 8, 64K, 128M, 4G)", text);
    return (size_t)v << shift;
}

static long parse_count(const char *text) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 0) die("not a count: '%s'", text);
    return v;
}

static int lookup(const char *what, const char *text, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], text) == 0) return i;
    die("unknown %s '%s'", what, text);
}

/* Long options without a short form. */
enum { OPT_HELPERS = 256, OPT_CALLS, OPT_REPS };

static void parse(int argc, char **argv, struct options *o) {
    *o = (struct options){.coll = ALL_REDUCE, .min_bytes = 32 << 20, .max_bytes = 32 << 20, .step_factor = 1,
                          .step_bytes = 1 << 20, .gpus = 1, .warmup = 5, .iters = 20, .check = 1,
                          .dtype = T_FLOAT, .op = OP_SUM, .root = 0, .graph_launches = 0,
                          .local_register = 0, .helpers = 0,
                          .helper_calls = 100000, .helper_reps = 11};
    static struct option longs[] = {
        {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
        {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
        {"ngpus", required_argument, 0, 'g'}, {"warmup_iters", required_argument, 0, 'w'},
        {"iters", required_argument, 0, 'n'}, {"check", required_argument, 0, 'c'},
        {"datatype", required_argument, 0, 'd'}, {"op", required_argument, 0, 'o'},
        {"root", required_argument, 0, 'r'}, {"cudagraph", required_argument, 0, 'G'},
        {"local_register", required_argument, 0, 'R'}, {"helpers", no_argument, 0, OPT_HELPERS},
        {"calls", required_argument, 0, OPT_CALLS}, {"reps", required_argument, 0, OPT_REPS},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "b:e:f:i:g:w:n:c:d:o:r:G:R:h", longs, NULL)) != -1) {
        switch (c) {
        case 'b': o->min_bytes = parse_size(optarg); break;
        case 'e': o->max_bytes = parse_size(optarg); break;
        case 'f': o->step_factor = (size_t)parse_count(optarg); break;
        case 'i': o->step_bytes = parse_size(optarg); break;
        case 'g': o->gpus = (int)parse_count(optarg); break;
        case 'w': o->warmup = (int)parse_count(optarg); break;
        case 'n': o->iters = (int)parse_count(optarg); break;
        case 'c': o->check = parse_count(optarg) != 0; break;
        case 'd': o->dtype = lookup("data type", optarg, type_names, NTYPES); break;
        case 'o': o->op = lookup("reduction op", optarg, op_names, NOPS); break;
        case 'r': o->root = (int)parse_count(optarg); break;
        case 'G': o->graph_launches = (int)parse_count(optarg); break;
        case 'R':
            if (strcmp(optarg, "0") && strcmp(optarg, "1") && strcmp(optarg, "2"))
                die("-R: '%s' is not 0 (not registered), 1 (ncclCommRegister) or 2 (symmetric windows)", optarg);
            o->local_register = optarg[0] - '0';
            break;
        case OPT_HELPERS: o->helpers = 1; break;
        case OPT_CALLS: o->helper_calls = (size_t)parse_count(optarg); break;
        case OPT_REPS: o->helper_reps = (int)parse_count(optarg); break;
        case 'h': usage(argv[0]); exit(0);
        default: fprintf(stderr, "perf_twin: try '%s --help'\n", argv[0]); exit(1);
        }
    }
    if (optind < argc) o->coll = lookup("collective", argv[optind++], coll_names, NCOLLS);
    if (optind < argc) die("unexpected argument '%s'", argv[optind]);
    if (o->gpus < 1) die("-g: at least one GPU");
    if (o->iters < 1) die("-n: at least one timed iteration");
    if (o->min_bytes > o->max_bytes) die("-b is larger than -e");
    if (o->step_factor == 0 || (o->step_factor == 1 && o->step_bytes == 0)) die("-f 0, or -f 1 with -i 0: the sweep would never end");
    if (o->root >= o->gpus) die("-r: the root must be one of the -g ranks");
    if (o->helpers && (o->helper_calls == 0 || o->helper_reps < 1)) die("--calls and --reps must be at least 1");
}

/* ---------------------------------------------------------------- counts and bandwidth (coll.rs) */

struct counts { size_t send, recv, param, send_inplace, recv_inplace; };

static struct counts get_counts(int coll, size_t bytes, size_t elem, size_t n) {
    size_t count = bytes / elem;
    size_t align = 16 / elem > 1 ? 16 / elem : 1;
    size_t block = (count / n) / align * align;
    struct counts c = {count, count, count, 0, 0};
    switch (coll) {
    case ALL_GATHER: c = (struct counts){block, block * n, block, block, 0}; break;
    case REDUCE_SCATTER: c = (struct counts){block * n, block, block, 0, block}; break;
    case ALLTOALL: c = (struct counts){block * n, block * n, block, 0, 0}; break;
    default: break;
    }
    return c;
}

static void bandwidths(int coll, const struct counts *c, size_t elem, size_t n, double seconds, double *algbw,
                       double *busbw) {
    double nf = (double)n;
    double bytes = (double)(c->param * elem);
    if (coll == ALL_GATHER || coll == REDUCE_SCATTER || coll == ALLTOALL) bytes *= nf;
    *algbw = seconds > 0.0 ? bytes / 1.0e9 / seconds : 0.0;
    double factor = 1.0;
    if (coll == ALL_REDUCE) factor = 2.0 * (nf - 1.0) / nf;
    else if (coll == ALL_GATHER || coll == REDUCE_SCATTER || coll == ALLTOALL) factor = (nf - 1.0) / nf;
    *busbw = *algbw * factor;
}

struct segment { size_t offset, len; int source; /* -1: the reduction */ size_t start; };

/* Fills segs (room for n) and returns how many. */
static int get_segments(int coll, const struct counts *c, int rank, int n, int root, struct segment *segs) {
    size_t p = c->param;
    switch (coll) {
    case ALL_REDUCE: segs[0] = (struct segment){0, p, -1, 0}; return 1;
    case REDUCE_SCATTER: segs[0] = (struct segment){0, p, -1, (size_t)rank * p}; return 1;
    case REDUCE:
        if (rank != root) return 0;
        segs[0] = (struct segment){0, p, -1, 0};
        return 1;
    case BROADCAST: segs[0] = (struct segment){0, p, root, 0}; return 1;
    case SENDRECV: segs[0] = (struct segment){0, p, (rank + n - 1) % n, 0}; return 1;
    case ALL_GATHER:
        for (int b = 0; b < n; b++) segs[b] = (struct segment){(size_t)b * p, p, b, 0};
        return n;
    case ALLTOALL:
        for (int b = 0; b < n; b++) segs[b] = (struct segment){(size_t)b * p, p, b, (size_t)rank * p};
        return n;
    }
    return 0;
}

/* ---------------------------------------------------------------- data (data.rs) */

#define REDUCE_PERIOD 13
#define COPY_PERIOD 101

static int64_t input_value(int reducing, int op, size_t rank, size_t index) {
    if (reducing) {
        int64_t base = (int64_t)((3 * index + 7 * rank) % REDUCE_PERIOD);
        return op == OP_PROD ? 1 + (base & 1) : base;
    }
    return (int64_t)((3 * index + 11 * rank) % COPY_PERIOD);
}

static uint16_t f32_to_f16(float value) {
    uint32_t x;
    memcpy(&x, &value, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    uint32_t mant = x & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10) return sign;
        uint32_t m = mant | 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = 1u << (shift - 1);
        uint32_t rest = m & ((1u << shift) - 1);
        uint32_t h = m >> shift;
        if (rest > half || (rest == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

static double f16_to_f64(uint16_t bits) {
    double sign = (bits & 0x8000) ? -1.0 : 1.0;
    int exp = (bits >> 10) & 0x1f;
    double mant = (double)(bits & 0x3ff);
    if (exp == 0) return sign * mant * ldexp(1.0, -24);
    if (exp == 0x1f) return mant == 0.0 ? sign * INFINITY : NAN;
    return sign * (1.0 + mant / 1024.0) * ldexp(1.0, exp - 15);
}

static uint16_t f32_to_bf16(float value) {
    uint32_t x;
    memcpy(&x, &value, 4);
    if (isnan(value)) return (uint16_t)((x >> 16) | 0x40);
    uint32_t round = 0x7fff + ((x >> 16) & 1);
    return (uint16_t)((x + round) >> 16);
}

static double bf16_to_f64(uint16_t bits) {
    uint32_t x = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &x, 4);
    return (double)f;
}

/* v in type t at dst; integer types wrap (two's complement, as gcc defines the conversion). */
static void encode_i64(int t, int64_t v, void *dst) {
    switch (t) {
    case T_INT8: { int8_t x = (int8_t)v; memcpy(dst, &x, 1); break; }
    case T_UINT8: { uint8_t x = (uint8_t)v; memcpy(dst, &x, 1); break; }
    case T_INT32: { int32_t x = (int32_t)v; memcpy(dst, &x, 4); break; }
    case T_UINT32: { uint32_t x = (uint32_t)v; memcpy(dst, &x, 4); break; }
    case T_INT64: { memcpy(dst, &v, 8); break; }
    case T_UINT64: { uint64_t x = (uint64_t)v; memcpy(dst, &x, 8); break; }
    case T_HALF: { uint16_t x = f32_to_f16((float)v); memcpy(dst, &x, 2); break; }
    case T_FLOAT: { float x = (float)v; memcpy(dst, &x, 4); break; }
    case T_DOUBLE: { double x = (double)v; memcpy(dst, &x, 8); break; }
    case T_BF16: { uint16_t x = f32_to_bf16((float)v); memcpy(dst, &x, 2); break; }
    }
}

/* v rounded to floating type t, back as a double. */
static double round_f64(int t, double v) {
    switch (t) {
    case T_HALF: return f16_to_f64(f32_to_f16((float)v));
    case T_BF16: return bf16_to_f64(f32_to_bf16((float)v));
    case T_FLOAT: return (double)(float)v;
    default: return v;
    }
}

/* v (a value of type t, as decode returns it) back in type t at dst. */
static void encode_f64(int t, double v, void *dst) {
    switch (t) {
    case T_HALF: { uint16_t x = f32_to_f16((float)v); memcpy(dst, &x, 2); break; }
    case T_BF16: { uint16_t x = f32_to_bf16((float)v); memcpy(dst, &x, 2); break; }
    case T_FLOAT: { float x = (float)v; memcpy(dst, &x, 4); break; }
    case T_DOUBLE: memcpy(dst, &v, 8); break;
    case T_UINT64: { uint64_t x = (uint64_t)v; memcpy(dst, &x, 8); break; }
    default: encode_i64(t, (int64_t)v, dst); break;
    }
}

/* The period's `period` elements (of `elem` bytes, at table) repeated to len + period elements: any len
 * elements of the pattern, from any phase, are then contiguous (tiled + (start % period) * elem). */
static unsigned char *tile(const unsigned char *table, size_t period, size_t elem, size_t len) {
    size_t total = (len + period) * elem;
    unsigned char *tiled = malloc(total);
    if (!tiled) die("out of host memory");
    size_t have = period * elem < total ? period * elem : total;
    memcpy(tiled, table, have);
    while (have < total) {
        size_t n = have < total - have ? have : total - have;
        memcpy(tiled + have, tiled, n);
        have += n;
    }
    return tiled;
}

static double decode(int t, const void *src) {
    switch (t) {
    case T_INT8: { int8_t x; memcpy(&x, src, 1); return (double)x; }
    case T_UINT8: { uint8_t x; memcpy(&x, src, 1); return (double)x; }
    case T_INT32: { int32_t x; memcpy(&x, src, 4); return (double)x; }
    case T_UINT32: { uint32_t x; memcpy(&x, src, 4); return (double)x; }
    case T_INT64: { int64_t x; memcpy(&x, src, 8); return (double)x; }
    case T_UINT64: { uint64_t x; memcpy(&x, src, 8); return (double)x; }
    case T_HALF: { uint16_t x; memcpy(&x, src, 2); return f16_to_f64(x); }
    case T_FLOAT: { float x; memcpy(&x, src, 4); return (double)x; }
    case T_DOUBLE: { double x; memcpy(&x, src, 8); return x; }
    case T_BF16: { uint16_t x; memcpy(&x, src, 2); return bf16_to_f64(x); }
    }
    return NAN;
}

struct expected { double values[COPY_PERIOD]; size_t period; double tolerance; };

static void expected_copy(int t, int source, struct expected *e) {
    unsigned char tmp[8];
    e->period = COPY_PERIOD;
    e->tolerance = 0.0;
    for (size_t i = 0; i < COPY_PERIOD; i++) {
        encode_i64(t, input_value(0, 0, (size_t)source, i), tmp);
        e->values[i] = decode(t, tmp);
    }
}

static void expected_reduction(int t, int op, int n, struct expected *e) {
    unsigned char tmp[8];
    e->period = REDUCE_PERIOD;
    for (size_t i = 0; i < REDUCE_PERIOD; i++) {
        int64_t sum = 0, max = 0, min = 0;
        uint64_t prod = 1;
        for (int r = 0; r < n; r++) {
            int64_t v = input_value(1, op, (size_t)r, i);
            sum += v;
            prod *= (uint64_t)v;
            if (r == 0 || v > max) max = v;
            if (r == 0 || v < min) min = v;
        }
        int64_t result = 0;
        switch (op) {
        case OP_SUM: result = sum; break;
        case OP_PROD: result = (int64_t)prod; break;
        case OP_MAX: result = max; break;
        case OP_MIN: result = min; break;
        case OP_AVG: result = sum / n; break;
        }
        if (op == OP_AVG && type_is_float(t)) {
            e->values[i] = round_f64(t, (double)sum / (double)n);
        } else {
            encode_i64(t, result, tmp);
            e->values[i] = decode(t, tmp);
        }
    }
    e->tolerance = 0.0;
    if (type_is_float(t) && op == OP_AVG) {
        double eps = t == T_HALF ? ldexp(1.0, -10) : t == T_BF16 ? ldexp(1.0, -7) : t == T_FLOAT ? ldexp(1.0, -23)
                                                                                              : ldexp(1.0, -52);
        e->tolerance = ((double)n + 2.0) * eps * (double)REDUCE_PERIOD;
    }
}

/* The slow path of the check, one per element type: count the wrong elements of a chunk (with the tolerance). */
#define ID(x) ((double)(x))
#define TYPED(NAME, CT, TO_DOUBLE)                                                                            \
    static uint64_t wrong_##NAME(const void *got, size_t m, const struct expected *e, size_t start) {       \
        const CT *g = got;                                                                                    \
        size_t k = start % e->period;                                                                         \
        uint64_t wrong = 0;                                                                                   \
        for (size_t i = 0; i < m; i++) {                                                                      \
            double v = TO_DOUBLE(g[i]);                                                                       \
            if (!(fabs(v - e->values[k]) <= e->tolerance)) wrong++;                                           \
            if (++k == e->period) k = 0;                                                                      \
        }                                                                                                     \
        return wrong;                                                                                         \
    }
TYPED(i8, int8_t, ID)
TYPED(u8, uint8_t, ID)
TYPED(i32, int32_t, ID)
TYPED(u32, uint32_t, ID)
TYPED(i64, int64_t, ID)
TYPED(u64, uint64_t, ID)
TYPED(f16, uint16_t, f16_to_f64)
TYPED(f32, float, ID)
TYPED(f64, double, ID)
TYPED(bf16, uint16_t, bf16_to_f64)

typedef uint64_t (*wrong_fn)(const void *, size_t, const struct expected *, size_t);
static const wrong_fn wrongs[NTYPES] = {wrong_i8, wrong_u8, wrong_i32, wrong_u32, wrong_i64,
                                        wrong_u64, wrong_f16, wrong_f32, wrong_f64, wrong_bf16};

/* ---------------------------------------------------------------- the benchmark (perf.rs) */

#define CHUNK_BYTES ((size_t)64 << 20)
#define MAX_GPUS 64

struct gpu {
    int device;
    CUcontext ctx;
    ncclComm_t comm;
    CUstream stream;
    CUevent start, stop;
    CUdeviceptr send, recv;
    void *send_reg, *recv_reg; /* -R 1: ncclCommRegister handles */
    ncclWindow_t send_win, recv_win; /* -R 2: symmetric windows */
};

static const char *register_names[3] = {"ncclMemAlloc, not registered (-R 0)",
                                        "ncclMemAlloc, registered with ncclCommRegister (-R 1)",
                                        "ncclMemAlloc, registered with ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC) (-R 2)"};

static struct options o;
static struct gpu gpus[MAX_GPUS];
static int ngpus;
static size_t elem;

struct shape { struct counts c; size_t total_bytes, steps; };

static struct shape make_shape(size_t bytes) {
    struct shape s;
    s.c = get_counts(o.coll, bytes, elem, (size_t)ngpus);
    s.total_bytes = (s.c.send > s.c.recv ? s.c.send : s.c.recv) * elem;
    s.steps = s.total_bytes > 0 ? o.max_bytes / s.total_bytes : 1;
    if (s.steps < 1) s.steps = 1;
    return s;
}

static void use_device(int d) { CU(cuCtxSetCurrent(gpus[d].ctx)); }

static void buffers(const struct shape *s, int rank, int in_place, size_t shift, CUdeviceptr *send,
                    CUdeviceptr *recv) {
    const struct gpu *g = &gpus[rank];
    if (in_place) {
        CUdeviceptr base = g->recv + shift;
        *send = base + s->c.send_inplace * (size_t)rank * elem;
        *recv = base + s->c.recv_inplace * (size_t)rank * elem;
    } else {
        *send = g->send + shift;
        *recv = g->recv + shift;
    }
}

static void issue(const struct shape *s, int rank, CUdeviceptr send, CUdeviceptr recv) {
    size_t p = s->c.param;
    ncclDataType_t dt = type_nccl[o.dtype];
    ncclRedOp_t op = op_nccl[o.op];
    ncclComm_t comm = gpus[rank].comm;
    cudaStream_t stream = gpus[rank].stream;
    const void *sendp = (const void *)(uintptr_t)send;
    void *recvp = (void *)(uintptr_t)recv;
    switch (o.coll) {
    case ALL_REDUCE: NC(ncclAllReduce(sendp, recvp, p, dt, op, comm, stream)); break;
    case ALL_GATHER: NC(ncclAllGather(sendp, recvp, p, dt, comm, stream)); break;
    case REDUCE_SCATTER: NC(ncclReduceScatter(sendp, recvp, p, dt, op, comm, stream)); break;
    case BROADCAST: NC(ncclBroadcast(sendp, recvp, p, dt, o.root, comm, stream)); break;
    case REDUCE: NC(ncclReduce(sendp, recvp, p, dt, op, o.root, comm, stream)); break;
    case ALLTOALL: {
        size_t block = p * elem;
        NC(ncclGroupStart());
        for (int peer = 0; peer < ngpus; peer++) {
            size_t off = block * (size_t)peer;
            NC(ncclSend((const void *)(uintptr_t)(send + off), p, dt, peer, comm, stream));
            NC(ncclRecv((void *)(uintptr_t)(recv + off), p, dt, peer, comm, stream));
        }
        NC(ncclGroupEnd());
        break;
    }
    case SENDRECV: {
        int to = (rank + 1) % ngpus, from = (rank + ngpus - 1) % ngpus;
        NC(ncclGroupStart());
        NC(ncclSend(sendp, p, dt, to, comm, stream));
        NC(ncclRecv(recvp, p, dt, from, comm, stream));
        NC(ncclGroupEnd());
        break;
    }
    }
}

static void launch(const struct shape *s, int in_place, size_t iter) {
    size_t shift = s->total_bytes * (iter % s->steps);
    int grouped = ngpus > 1;
    if (grouped) NC(ncclGroupStart());
    for (int rank = 0; rank < ngpus; rank++) {
        CUdeviceptr send, recv;
        buffers(s, rank, in_place, shift, &send, &recv);
        issue(s, rank, send, recv);
    }
    if (grouped) NC(ncclGroupEnd());
}

static void sync_all(void) {
    for (int r = 0; r < ngpus; r++) CU(cuStreamSynchronize(gpus[r].stream));
}

static double measure(const struct shape *s, int in_place) {
    for (int i = 0; i < o.warmup; i++) launch(s, in_place, (size_t)i);
    sync_all();
    CUgraphExec execs[MAX_GPUS];
    /* A zero-element size has nothing to capture (an empty graph): it runs eagerly, as the Rust side does. */
    int graphed = o.graph_launches > 0 && s->c.param > 0;
    if (graphed) {
        for (int r = 0; r < ngpus; r++)
            CU(cuStreamBeginCapture(gpus[r].stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        for (int i = 0; i < o.iters; i++) launch(s, in_place, (size_t)i);
        CUgraph graphs[MAX_GPUS];
        for (int r = 0; r < ngpus; r++) CU(cuStreamEndCapture(gpus[r].stream, &graphs[r]));
        for (int r = 0; r < ngpus; r++) {
            use_device(r);
            CU(cuGraphInstantiateWithFlags(&execs[r], graphs[r], 0));
        }
        for (int r = 0; r < ngpus; r++) CU(cuGraphLaunch(execs[r], gpus[r].stream));
        sync_all();
        for (int r = 0; r < ngpus; r++) CU(cuGraphDestroy(graphs[r]));
    }
    for (int r = 0; r < ngpus; r++) CU(cuEventRecord(gpus[r].start, gpus[r].stream));
    if (graphed) {
        for (int l = 0; l < o.graph_launches; l++)
            for (int r = 0; r < ngpus; r++) CU(cuGraphLaunch(execs[r], gpus[r].stream));
    } else {
        for (int i = 0; i < o.iters; i++) launch(s, in_place, (size_t)i);
    }
    for (int r = 0; r < ngpus; r++) CU(cuEventRecord(gpus[r].stop, gpus[r].stream));
    float ms = 0.0f;
    for (int r = 0; r < ngpus; r++) {
        float t = 0.0f;
        CU(cuEventSynchronize(gpus[r].stop));
        CU(cuEventElapsedTime(&t, gpus[r].start, gpus[r].stop));
        if (t > ms) ms = t;
    }
    if (graphed) {
        sync_all();
        for (int r = 0; r < ngpus; r++) CU(cuGraphExecDestroy(execs[r]));
    }
    int launches = graphed ? o.graph_launches : 1;
    return (double)ms * 1000.0 / ((double)o.iters * launches);
}

/* Returns the wrong count, or -1 for N/A. */
static long long check(const struct shape *s, int in_place) {
    if (!o.check || (in_place && coll_in_place_unchecked(o.coll))) return -1;
    const struct counts *c = &s->c;
    int reducing = coll_reduces(o.coll);
    size_t most = c->send > c->recv ? c->send : c->recv;
    size_t chunk = CHUNK_BYTES / elem < most ? CHUNK_BYTES / elem : most;
    if (chunk < 1) chunk = 1;
    for (int rank = 0; rank < ngpus; rank++) {
        struct gpu *g = &gpus[rank];
        use_device(rank);
        CU(cuMemsetD8Async(g->recv, 0xff, s->total_bytes, g->stream));
        CU(cuStreamSynchronize(g->stream));
        unsigned char table[COPY_PERIOD * 8];
        size_t period = reducing ? REDUCE_PERIOD : COPY_PERIOD;
        for (size_t i = 0; i < period; i++)
            encode_i64(o.dtype, input_value(reducing, o.op, (size_t)rank, i), table + i * elem);
        unsigned char *tiled = tile(table, period, elem, chunk < c->send ? chunk : c->send);
        CUdeviceptr send, recv;
        buffers(s, rank, in_place, 0, &send, &recv);
        for (size_t done = 0; done < c->send;) {
            size_t m = c->send - done < chunk ? c->send - done : chunk;
            CU(cuMemcpyHtoDAsync(send + done * elem, tiled + (done % period) * elem, m * elem, g->stream));
            CU(cuStreamSynchronize(g->stream));
            done += m;
        }
        free(tiled);
    }
    launch(s, in_place, 0);
    sync_all();
    long long wrong = 0;
    unsigned char *host = calloc(chunk, elem);
    if (!host) die("out of host memory");
    struct expected reduction, copy;
    expected_reduction(o.dtype, o.op, ngpus, &reduction);
    struct segment segs[MAX_GPUS];
    for (int rank = 0; rank < ngpus; rank++) {
        struct gpu *g = &gpus[rank];
        use_device(rank);
        CUdeviceptr send, recv;
        buffers(s, rank, in_place, 0, &send, &recv);
        int nseg = get_segments(o.coll, c, rank, ngpus, o.root, segs);
        for (int i = 0; i < nseg; i++) {
            const struct expected *e = &reduction;
            if (segs[i].source >= 0) {
                expected_copy(o.dtype, segs[i].source, &copy);
                e = &copy;
            }
            unsigned char typed[COPY_PERIOD * 8];
            for (size_t k = 0; k < e->period; k++) encode_f64(o.dtype, e->values[k], typed + k * elem);
            unsigned char *tiled = tile(typed, e->period, elem, chunk < segs[i].len ? chunk : segs[i].len);
            for (size_t done = 0; done < segs[i].len;) {
                size_t m = segs[i].len - done < chunk ? segs[i].len - done : chunk;
                CU(cuMemcpyDtoHAsync(host, recv + (segs[i].offset + done) * elem, m * elem, g->stream));
                CU(cuStreamSynchronize(g->stream));
                /* Equal to the expected values: done at memcmp speed; otherwise count, with the tolerance. */
                size_t start = segs[i].start + done;
                if (memcmp(host, tiled + (start % e->period) * elem, m * elem) != 0)
                    wrong += (long long)wrongs[o.dtype](host, m, e, start);
                done += m;
            }
            free(tiled);
        }
    }
    free(host);
    return wrong;
}

static int run_sweep(void) {
    int library = 0;
    NC(ncclGetVersion(&library));
    int available = 0;
    CU(cuDeviceGetCount(&available));
    if (available < ngpus) {
        fprintf(stderr, "perf_twin: error: -g %d asks for more GPUs than the %d this process sees\n", ngpus,
                available);
        return -1;
    }
    size_t bytes = o.max_bytes > 256 ? o.max_bytes : 256;
    for (int d = 0; d < ngpus; d++) {
        struct gpu *g = &gpus[d];
        CUdevice dev;
        g->device = d;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRetain(&g->ctx, dev));
        use_device(d);
        CU(cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING));
        CU(cuEventCreate(&g->start, CU_EVENT_DEFAULT));
        CU(cuEventCreate(&g->stop, CU_EVENT_DEFAULT));
    }
    ncclComm_t comms[MAX_GPUS];
    int devices[MAX_GPUS];
    for (int d = 0; d < ngpus; d++) devices[d] = d;
    NC(ncclCommInitAll(comms, ngpus, devices));
    for (int d = 0; d < ngpus; d++) gpus[d].comm = comms[d];
    /* The buffers as nccl-tests gets them: ncclMemAlloc in every mode, then -R's registration of each whole
     * buffer, in one group for all GPUs (a window registration is collective). */
    for (int d = 0; d < ngpus; d++) {
        struct gpu *g = &gpus[d];
        void *send = NULL, *recv = NULL;
        use_device(d);
        NC(ncclMemAlloc(&send, bytes));
        NC(ncclMemAlloc(&recv, bytes));
        g->send = (CUdeviceptr)(uintptr_t)send;
        g->recv = (CUdeviceptr)(uintptr_t)recv;
        CU(cuMemsetD8Async(g->send, 0, bytes, g->stream));
        CU(cuMemsetD8Async(g->recv, 0, bytes, g->stream));
        CU(cuStreamSynchronize(g->stream));
    }
    if (o.local_register) {
        NC(ncclGroupStart());
        for (int d = 0; d < ngpus; d++) {
            struct gpu *g = &gpus[d];
            void *send = (void *)(uintptr_t)g->send, *recv = (void *)(uintptr_t)g->recv;
            use_device(d);
            if (o.local_register == 2) {
                NC(ncclCommWindowRegister(g->comm, send, bytes, &g->send_win, NCCL_WIN_COLL_SYMMETRIC));
                NC(ncclCommWindowRegister(g->comm, recv, bytes, &g->recv_win, NCCL_WIN_COLL_SYMMETRIC));
            } else {
                NC(ncclCommRegister(g->comm, send, bytes, &g->send_reg));
                NC(ncclCommRegister(g->comm, recv, bytes, &g->recv_reg));
            }
        }
        NC(ncclGroupEnd());
    }

    printf("# metrale-gpu-sys perf_twin (C, direct calls) nccl-headers=%d nccl-library=%d\n", NCCL_VERSION_CODE,
           library);
    printf("# Collective test starting: %s\n", coll_names[o.coll]);
    char step[64];
    if (o.step_factor > 1) snprintf(step, sizeof step, "%zu(factor)", o.step_factor);
    else snprintf(step, sizeof step, "%zu(bytes)", o.step_bytes);
    printf("# nThread 1 nGpus %d minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d agg iters: 1 "
           "validation: %d graph: %d\n",
           ngpus, o.min_bytes, o.max_bytes, step, o.warmup, o.iters, o.check, o.graph_launches);
    printf("# Timing: CUDA events on each GPU's stream around the iterations; the slowest GPU's time / iterations\n");
    printf("# Buffers: %zu bytes each, %s\n", bytes, register_names[o.local_register]);
    printf("#\n# Using devices\n");
    for (int d = 0; d < ngpus; d++) {
        char name[128] = {0};
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDeviceGetName(name, (int)sizeof name, dev));
        printf("#  Rank %2d Group  0 Pid %6d device %2d %s\n", d, (int)getpid(), d, name);
    }
    printf("#\n");
    printf("#                                                              out-of-place                       in-place          \n");
    printf("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n");

    long long wrong_total = 0;
    double bw_sum = 0.0;
    int bw_count = 0;
    for (size_t size = o.min_bytes; size <= o.max_bytes;) {
        struct shape s = make_shape(size);
        printf("%12zu  %12zu  %8s  %6s  %6d", s.total_bytes, s.c.param, type_names[o.dtype],
               coll_reduces(o.coll) ? op_names[o.op] : "none", coll_rooted(o.coll) ? o.root : -1);
        for (int in_place = 0; in_place < 2; in_place++) {
            double usec = measure(&s, in_place);
            long long wrong = check(&s, in_place);
            double algbw, busbw;
            bandwidths(o.coll, &s.c, elem, (size_t)ngpus, usec * 1e-6, &algbw, &busbw);
            bw_sum += busbw;
            bw_count++;
            char w[32];
            if (wrong < 0) snprintf(w, sizeof w, "N/A");
            else {
                snprintf(w, sizeof w, "%lld", wrong);
                wrong_total += wrong;
            }
            printf("  %7.2f  %6.2f  %6.2f  %6s", usec, algbw, busbw, w);
        }
        printf("\n");
        fflush(stdout);
        size_t next = o.step_factor > 1 ? size * o.step_factor : size + o.step_bytes;
        if (next <= size) break;
        size = next;
    }
    printf("# Wrong elements       : %lld %s\n", wrong_total, wrong_total == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
    printf("#\n# Collective test concluded: %s\n#\n", coll_names[o.coll]);
    fflush(stdout);

    for (int d = 0; d < ngpus; d++) {
        struct gpu *g = &gpus[d];
        CU(cuStreamSynchronize(g->stream));
        if (o.local_register == 2) {
            NC(ncclCommWindowDeregister(g->comm, g->send_win));
            NC(ncclCommWindowDeregister(g->comm, g->recv_win));
        } else if (o.local_register == 1) {
            NC(ncclCommDeregister(g->comm, g->send_reg));
            NC(ncclCommDeregister(g->comm, g->recv_reg));
        }
        NC(ncclCommDestroy(g->comm));
        CU(cuEventDestroy(g->start));
        CU(cuEventDestroy(g->stop));
        CU(cuStreamDestroy(g->stream));
        use_device(d);
        NC(ncclMemFree((void *)(uintptr_t)g->send));
        NC(ncclMemFree((void *)(uintptr_t)g->recv));
    }
    return wrong_total > 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- --helpers (helpers.rs) */

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *name, const char *what, double *per, int reps) {
    qsort(per, (size_t)reps, sizeof *per, cmp_double);
    double median = reps % 2 ? per[reps / 2] : (per[reps / 2 - 1] + per[reps / 2]) / 2.0;
    printf("helper  %-22s %9.2f %9.2f %9.2f  %s\n", name, median, per[0], per[reps - 1], what);
    fflush(stdout);
}

/* CALL runs `calls` times per repetition, inline; DRAIN between repetitions, outside the timing. */
#define BENCH(NAME, WHAT, CALL, DRAIN)                                   \
    do {                                                                 \
        for (int rep = 0; rep <= o.helper_reps; rep++) {                 \
            double t0 = now_ns();                                        \
            for (size_t i = 0; i < o.helper_calls; i++) {                \
                CALL;                                                    \
            }                                                            \
            double t1 = now_ns();                                        \
            DRAIN;                                                       \
            if (rep > 0) per[rep - 1] = (t1 - t0) / (double)o.helper_calls; \
        }                                                                \
        report(NAME, WHAT, per, o.helper_reps);                          \
    } while (0)

static int run_helpers(void) {
    int library = 0;
    NC(ncclGetVersion(&library));
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUevent event;
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    CU(cuEventRecord(event, stream));
    CU(cuStreamSynchronize(stream));
    double *per = calloc((size_t)o.helper_reps, sizeof *per);
    if (!per) die("out of host memory");
    printf("# metrale-gpu-sys perf_twin --helpers (C, direct calls) nccl-headers=%d nccl-library=%d\n",
           NCCL_VERSION_CODE, library);
    printf("# %zu calls per repetition, %d repetitions (+1 untimed); ns per call over the repetitions\n",
           o.helper_calls, o.helper_reps);
    printf("#       name                      median       min       max  call\n");
    volatile ncclResult_t status = ncclSuccess;
    BENCH("stream_ready", "cuStreamQuery", {
        CUresult r = cuStreamQuery(stream);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) cu_fail(r, "cuStreamQuery");
    }, (void)0);
    BENCH("check_nccl", "status == ncclSuccess", {
        ncclResult_t r = status;
        if (r != ncclSuccess) nccl_fail(r, "status");
    }, (void)0);
    BENCH("group_start_end", "ncclGroupStart() + ncclGroupEnd()", {
        NC(ncclGroupStart());
        NC(ncclGroupEnd());
    }, (void)0);
    BENCH("record_event", "cuEventRecord", CU(cuEventRecord(event, stream)), CU(cuStreamSynchronize(stream)));
    BENCH("stream_wait_event", "cuStreamWaitEvent", CU(cuStreamWaitEvent(stream, event, 0)),
          CU(cuStreamSynchronize(stream)));
    CU(cuStreamSynchronize(stream));
    CU(cuEventDestroy(event));
    CU(cuStreamDestroy(stream));
    free(per);
    return 0;
}

int main(int argc, char **argv) {
    parse(argc, argv, &o);
    ngpus = o.gpus;
    elem = type_sizes[o.dtype];
    if (ngpus > MAX_GPUS) die("-g: at most %d GPUs", MAX_GPUS);
    CUresult init = cuInit(0);
    if (init != CUDA_SUCCESS) cu_fail(init, "cuInit");
    int rc = o.helpers ? run_helpers() : run_sweep();
    if (rc > 0) fprintf(stderr, "perf_twin: wrong elements: the results are not what the inputs give\n");
    return rc == 0 ? 0 : 1;
}
