/*
 * bench_stream_runs.c - how fast a decode step's matmul runs stream their weights,
 * depending on where each thread's part of consecutive runs lies.
 *
 * A decode step is ~90 matmul runs one after the other (TinyLlama at Q4_K: per layer
 * q+k+v 2.95 MB, o 2.36 MB, gate+up 13 MB, down 6.5 MB), each ending at a barrier. In
 * the model a run's rows lie together and the threads split each run, so a thread's
 * stream jumps at every run. This walks the 88 Q4_K runs of 22 layers (545 MB, repacked
 * to Q4_K_X8 as the model runs them, one token) in turns of:
 *   model     kern_matmul per run over the runs laid out as in the model (its split,
 *             the activations quantized per run: what a decode step does),
 *   runs      the same layout, each thread one contiguous half of every run (static
 *             split, a pool run and its barrier per matmul run),
 *   threads   each thread's halves of all the runs laid end to end, one region per thread,
 *             a barrier per run as before: a thread's stream goes on across the barrier,
 *   ahead     that, each thread prefetching the first 16 KiB of its next part before it
 *             reaches the barrier,
 *   one run   that layout without the barriers (one pool run for the whole step),
 *   read      a plain read of each thread's region (bench_read), the ceiling.
 * Figures are GB/s of weights, best and median of the passes, which take turns so that a
 * change of the machine's load hits every mode alike. Then, from the "one run" passes, the
 * rate per thread of each of the four shapes (q+k+v, o, gate+up, down), each run timed by
 * the thread that streams it: the shapes take turns inside every pass.
 *
 * Usage: bench_stream_runs [passes] [threads]   (defaults 10, 2; the buffers take 1.1 GB)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/pool.h"
#include "common/readprobe.h"
#include "kernels/kern_internal.h"
#include "kernels/kernels.h"
#include "quant/quantize.h"

enum { N_LAYER = 22, RUNS = 4 * N_LAYER, EMBD = 2048, FF = 5632, MAX_THREADS = 8 };
enum { AHEAD_BYTES = 16 << 10 }; /* "ahead": what a thread prefetches of its next part */
enum { MODE_MODEL, MODE_RUNS, MODE_THREADS, MODE_AHEAD, MODE_ONE, MODE_READ, N_MODES };
static const char *const mode_names[N_MODES] = {"model",   "runs",    "threads",
                                                "ahead",   "one run", "read"};

typedef struct run_desc {
    int64_t rows, cols;
    size_t row_bytes;
    const uint8_t *w;                 /* the model's layout: the run's rows together */
    const uint8_t *part[MAX_THREADS]; /* the threads' layout: this run's half in region t */
    int64_t r0[MAX_THREADS + 1];      /* thread t's rows [r0[t], r0[t + 1]) */
} run_desc;

typedef struct step_job {
    const run_desc *runs;
    int first, last; /* runs [first, last) */
    int threads_layout;
    size_t ahead; /* bytes of the thread's next part to prefetch before the barrier */
    kern_gemm8_fn gemm8;
    const uint8_t *xq[2]; /* the activations for 2048 and 5632 columns (Q8_K) */
    size_t xq_bytes[2];
    float *out;
    int timed;                            /* per shape: ns and bytes per thread */
    double shape_ns[MAX_THREADS][4], shape_bytes[MAX_THREADS][4];
    const uint8_t *region[MAX_THREADS];
    size_t region_bytes[MAX_THREADS];
    int streams;                     /* of the read, per thread: 1 or 2 (bench_read) */
    uint64_t sink[MAX_THREADS * 8];
} step_job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void step_worker(void *ctx, int ith, int nth) {
    (void)nth;
    step_job *j = ctx;
    double t_prev = j->timed ? now_s() : 0;
    for (int k = j->first; k < j->last; k++) {
        const run_desc *r = &j->runs[k];
        const int wide = r->cols != EMBD;
        const uint8_t *w = j->threads_layout ? r->part[ith] : r->w + r->r0[ith] * r->row_bytes;
        for (int64_t row = r->r0[ith]; row < r->r0[ith + 1]; row += 8, w += 8 * r->row_bytes)
            j->gemm8(r->cols, w, j->xq[wide], j->xq_bytes[wide], NULL, NULL, 1, j->out + row,
                     (size_t)r->rows);
        if (j->timed) {
            const double t = now_s();
            j->shape_ns[ith][k % 4] += (t - t_prev) * 1e9;
            j->shape_bytes[ith][k % 4] += (double)(r->r0[ith + 1] - r->r0[ith]) * r->row_bytes;
            t_prev = t;
        }
        for (size_t o = 0; k + 1 < RUNS && o < j->ahead; o += 64)
            __builtin_prefetch(j->runs[k + 1].part[ith] + o, 0, 3);
    }
}

static void read_worker(void *ctx, int ith, int nth) {
    (void)nth;
    step_job *j = ctx;
    j->sink[ith * 8] = bench_read(j->region[ith], j->region_bytes[ith], j->streams);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int passes = argc > 1 ? atoi(argv[1]) : 10;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    if (passes < 1 || passes > 1000 || threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "usage: bench_stream_runs [passes 1..1000] [threads 1..%d]\n",
                MAX_THREADS);
        return 2;
    }
    hl_pool *pool = NULL;
    hl_err err;
    if (hl_pool_create(threads, &pool, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    kern_init();
    const kern_table *tab = kern_table_active();
    const hl_type packed = kern_packed_type(HL_TYPE_Q4_K, 8);
    if (packed == HL_TYPE_Q4_K || !tab->gemm8[packed]) {
        fprintf(stderr, "bench_stream_runs: no Q4_K_X8 kernel in the %s table\n", kern_variant());
        return 1;
    }
    static run_desc runs[RUNS];
    const int64_t shape[4][2] = {{EMBD + 2 * 256, EMBD}, {EMBD, EMBD}, {2 * FF, EMBD}, {EMBD, FF}};
    size_t total = 0, biggest = 0;
    for (int k = 0; k < RUNS; k++) {
        run_desc *r = &runs[k];
        r->rows = shape[k % 4][0];
        r->cols = shape[k % 4][1];
        r->row_bytes = hl_row_size(HL_TYPE_Q4_K, r->cols);
        const int64_t per = (r->rows / 8 + threads - 1) / threads * 8;
        for (int t = 0; t <= threads; t++) r->r0[t] = per * t < r->rows ? per * t : r->rows;
        total += (size_t)r->rows * r->row_bytes;
        if ((size_t)r->rows * r->row_bytes > biggest) biggest = (size_t)r->rows * r->row_bytes;
    }
    uint8_t *model = bench_stream_alloc(total), *by_thread = bench_stream_alloc(total);
    float *x = malloc(sizeof(float) * FF), *out = malloc(sizeof(float) * 2 * FF);
    uint8_t *tmp = malloc(8 * hl_row_size(HL_TYPE_Q4_K, FF));
    if (!model || !by_thread || !x || !out || !tmp) return 1;
    /* a bank of 64 quantized rows per width, repeated: speed does not depend on values */
    uint8_t *bank[2];
    for (int b = 0; b < 2; b++) {
        const int64_t cols = b ? FF : EMBD;
        const size_t rb = hl_row_size(HL_TYPE_Q4_K, cols);
        bank[b] = malloc(64 * rb);
        if (!bank[b]) return 1;
        for (int64_t r = 0; r < 64; r++) {
            for (int64_t c = 0; c < cols; c++)
                x[c] = (float)((r * 31 + c * 17) % 200) / 100.0f - 1.0f;
            hl_quantize_row(HL_TYPE_Q4_K, x, bank[b] + r * rb, cols);
        }
    }
    size_t off = 0, region_off[MAX_THREADS] = {0};
    step_job job = {.runs = runs, .gemm8 = tab->gemm8[packed], .out = out};
    for (int t = 0; t < threads; t++) {
        job.region_bytes[t] = 0;
        for (int k = 0; k < RUNS; k++)
            job.region_bytes[t] += (size_t)(runs[k].r0[t + 1] - runs[k].r0[t]) * runs[k].row_bytes;
        region_off[t] = t ? region_off[t - 1] + job.region_bytes[t - 1] : 0;
        job.region[t] = by_thread + region_off[t];
    }
    for (int k = 0; k < RUNS; k++) {
        run_desc *r = &runs[k];
        uint8_t *w = model + off;
        const uint8_t *b = bank[r->cols != EMBD];
        for (int64_t row = 0; row < r->rows; row += 64)
            memcpy(w + row * r->row_bytes, b,
                   (size_t)(r->rows - row < 64 ? r->rows - row : 64) * r->row_bytes);
        if (!kern_repack(packed, w, r->rows, r->cols, tmp)) return 1;
        r->w = w;
        off += (size_t)r->rows * r->row_bytes;
        for (int t = 0; t < threads; t++) {
            const size_t bytes = (size_t)(r->r0[t + 1] - r->r0[t]) * r->row_bytes;
            memcpy(by_thread + region_off[t], w + r->r0[t] * r->row_bytes, bytes);
            r->part[t] = by_thread + region_off[t];
            region_off[t] += bytes;
        }
    }
    uint8_t *xq[2];
    for (int b = 0; b < 2; b++) {
        const int64_t cols = b ? FF : EMBD;
        for (int64_t c = 0; c < cols; c++) x[c] = (float)((c * 7919) % 2001) / 1000.0f - 1.0f;
        job.xq_bytes[b] = hl_row_size(HL_TYPE_Q8_K, cols);
        xq[b] = malloc(job.xq_bytes[b]);
        if (!xq[b]) return 1;
        hl_quantize_row(HL_TYPE_Q8_K, x, xq[b], cols);
        job.xq[b] = xq[b];
    }
    void *scratch = malloc(kern_matmul_scratch_size(packed, FF, 1) + 1);
    float *mout = malloc(sizeof(float) * 2 * FF);
    if (!scratch || !mout) return 1;
    printf("bench_stream_runs: kernels %s, %d threads, %d Q4_K_X8 runs of one token, %.1f MB "
           "per step (largest run %.1f MB), %d passes\n",
           kern_variant(), threads, RUNS, total / 1e6, biggest / 1e6, passes);
    double *gbs = malloc(sizeof(double) * N_MODES * (size_t)passes);
    if (!gbs) return 1;
    hl_pool_burst_begin(pool);
    for (int p = -1; p < passes; p++) { /* pass -1 warms up */
        for (int m = 0; m < N_MODES; m++) {
            const double t0 = now_s();
            if (m == MODE_MODEL) {
                for (int k = 0; k < RUNS; k++)
                    kern_matmul(pool, packed, runs[k].w, runs[k].rows, runs[k].cols, x, 1, mout,
                                scratch);
            } else if (m == MODE_READ) {
                job.streams = p % 2 == 0 ? 1 : 2; /* one and two on alternate passes */
                hl_pool_run(pool, read_worker, &job);
            } else if (m == MODE_ONE) {
                job.first = 0, job.last = RUNS, job.threads_layout = 1, job.ahead = 0;
                job.timed = p >= 0;
                hl_pool_run(pool, step_worker, &job);
                job.timed = 0;
            } else {
                job.threads_layout = m == MODE_THREADS || m == MODE_AHEAD;
                job.ahead = m == MODE_AHEAD ? AHEAD_BYTES : 0;
                for (int k = 0; k < RUNS; k++) {
                    job.first = k, job.last = k + 1;
                    hl_pool_run(pool, step_worker, &job);
                }
            }
            if (p >= 0) gbs[m * passes + p] = (double)total / (now_s() - t0) / 1e9;
        }
    }
    hl_pool_burst_end(pool);
    double best_read = 0;
    for (int p = 0; p < passes; p++)
        if (gbs[MODE_READ * passes + p] > best_read) best_read = gbs[MODE_READ * passes + p];
    for (int m = 0; m < N_MODES; m++) {
        double *v = gbs + m * passes;
        qsort(v, (size_t)passes, sizeof *v, cmp_double);
        printf("%-8s best %6.2f GB/s (%3.0f%% of read) | median %6.2f | worst %6.2f\n",
               mode_names[m], v[passes - 1], 100 * v[passes - 1] / best_read, v[passes / 2],
               v[0]);
    }
    static const char *const shape_names[4] = {"q+k+v", "o", "gate+up", "down"};
    printf("one run, per shape and thread:");
    for (int sh = 0; sh < 4; sh++) {
        double bytes = 0, ns = 0;
        for (int t = 0; t < threads; t++)
            bytes += job.shape_bytes[t][sh], ns += job.shape_ns[t][sh];
        printf(" %s (%lld x %lld) %.2f GB/s%s", shape_names[sh], (long long)shape[sh][0],
               (long long)shape[sh][1], bytes / ns, sh < 3 ? "," : "\n");
    }
    free(gbs);
    free(mout);
    free(scratch);
    for (int b = 0; b < 2; b++) free(xq[b]), free(bank[b]);
    free(tmp);
    free(out);
    free(x);
    free(by_thread);
    free(model);
    hl_pool_destroy(pool);
    return 0;
}
