/*
 * bench_dot_stream.c - how fast one core streams quantized weights from memory through
 * the decode dot kernels, against a plain read of the same bytes.
 *
 * Decode is a matrix-vector product over ~1 GB of weights per token: every byte comes
 * from DRAM, so a kernel is fast enough when it keeps up with what one core can read.
 * bench_kernels reuses one 12 MB matrix, which the last-level cache partly holds; here
 * each type gets a 512 MiB buffer of 2048-column rows, walked once per pass by:
 *   read      a plain load-and-add loop in the widest vectors the CPU has, one and two
 *             streams per thread on alternate passes (the ceiling; bench_read, the same
 *             probe as bench_model's),
 *   dot       vec_dot row after row, as a decode matmul calls it,
 *   matmul    one kern_matmul of 1 token over the whole buffer as a matrix, in the layout
 *             the model runs the type in (kern_packed_type: repacked at load), threads
 *             and all, as decode runs it.
 * The two take turns pass after pass, so a change of machine load hits them alike;
 * figures are the best pass (GB/s of weights), which is the steadiest on a shared VM.
 *
 * With 2+ threads, each pass splits the buffer into one contiguous part per thread (the
 * threads then compete for the memory bus, as in a decode).
 *
 * cols, a comma list of row lengths (multiples of 256, default 2048), runs the matmul
 * once per length on a buffer of its own, the lengths taking turns inside every pass,
 * and then prints their medians side by side: a row's activations are read once per
 * group of 8 rows, and past ~4096 columns the weights streamed in between push them
 * out of L1 (bench/README, "long rows").
 *
 * Usage: bench_dot_stream [passes] [MiB] [threads] [types|all] [cols] (MiB may be a
 * fraction: 0.25 stays in L2; types: a comma list such as q4_K,q6_K, default all).
 * HEARTH_CPU caps the kernel variant.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kern_internal.h"
#include "base/pool.h"
#include "common/readprobe.h"
#include "common/stats.h"
#include "kernels/kernels.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile float g_sink;
static volatile uint64_t g_sink_u;

static void pass_read(const uint8_t *buf, size_t bytes, int streams) {
    g_sink_u = bench_read(buf, bytes, streams);
}

static void pass_dot(const kern_table *tab, hl_type t, const uint8_t *buf, int64_t rows,
                     size_t row_bytes, int64_t cols, const void *xq, float *out) {
    for (int64_t r = 0; r < rows; r++)
        out[r & 4095] = tab->vec_dot[t](cols, buf + (size_t)r * row_bytes, xq);
    g_sink = out[0];
}

typedef struct pass_job {
    const kern_table *tab;
    hl_type type;
    int kind;    /* 0 read, 1 dot */
    int streams; /* of a read, per thread: 1 or 2 */
    const uint8_t *buf;
    int64_t rows, cols;
    size_t row_bytes;
    const void *xq;
    float *out; /* 4096 floats per thread */
} pass_job;

static void pass_worker(void *ctx, int ith, int nth) {
    const pass_job *j = ctx;
    /* a contiguous part per thread, a multiple of 64 rows */
    const int64_t per = (j->rows / 64 + nth - 1) / nth * 64;
    const int64_t r0 = per * ith < j->rows ? per * ith : j->rows;
    const int64_t r1 = r0 + per < j->rows ? r0 + per : j->rows;
    const uint8_t *b = j->buf + (size_t)r0 * j->row_bytes;
    float *out = j->out + (size_t)ith * 4096;
    if (j->kind == 0) pass_read(b, (size_t)(r1 - r0) * j->row_bytes, j->streams);
    if (j->kind == 1) pass_dot(j->tab, j->type, b, r1 - r0, j->row_bytes, j->cols, j->xq, out);
}

/* name is one of the comma-separated names of list */
static int name_in_list(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* A bank of 64 quantized rows of `cols` columns, repeated over `rows`: speed does not
 * depend on the values. False when out of memory. */
static bool fill_rows(hl_type t, uint8_t *buf, int64_t rows, int64_t cols) {
    const size_t row_bytes = hl_row_size(t, cols);
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!row) return false;
    for (int64_t r = 0; r < 64; r++) {
        for (int64_t c = 0; c < cols; c++)
            row[c] = (float)((r * 31 + c * 17) % 200) / 100.0f - 1.0f;
        if (hl_type_traits_get(t)->can_quantize) {
            hl_quantize_row(t, row, buf + (size_t)r * row_bytes, cols);
            continue;
        }
        /* MXFP4 has no quantizer: pattern codes with normal-range shared exponents */
        block_mxfp4 *b = (block_mxfp4 *)(buf + (size_t)r * row_bytes);
        for (int64_t k = 0; k < cols / QK_MXFP4; k++) {
            b[k].e = (uint8_t)(120 + (r + k) % 8);
            for (int j = 0; j < QK_MXFP4 / 2; j++)
                b[k].qs[j] = (uint8_t)((r * 31 + k * 17 + j * 7) & 0xff);
        }
    }
    for (int64_t r = 64; r < rows; r += 64)
        memcpy(buf + (size_t)r * row_bytes, buf, 64 * row_bytes);
    free(row);
    return true;
}

/* A matrix of ~mib MiB with rows of `cols` columns, in the layout decode runs it in. */
typedef struct matmul_buf {
    hl_type packed;
    uint8_t *buf;
    int64_t rows, cols;
    size_t bytes;
    float *out;
    void *scratch;
} matmul_buf;

static void matmul_buf_free(matmul_buf *m) {
    free(m->buf);
    free(m->out);
    free(m->scratch);
}

static bool matmul_buf_make(matmul_buf *m, hl_type t, double mib, int64_t cols) {
    const size_t row_bytes = hl_row_size(t, cols);
    const int64_t rows = (int64_t)(mib * (1 << 20) / (double)row_bytes) / 64 * 64;
    *m = (matmul_buf){.packed = kern_packed_type(t, rows), .rows = rows, .cols = cols,
                      .bytes = row_bytes * (size_t)rows};
    m->buf = bench_stream_alloc(m->bytes);
    m->out = malloc(sizeof(float) * (size_t)rows);
    m->scratch = malloc(kern_matmul_scratch_size(m->packed, cols, 1) + 1);
    void *tmp = malloc(8 * row_bytes);
    bool ok = m->buf && m->out && m->scratch && tmp && fill_rows(t, m->buf, rows, cols);
    ok = ok && (m->packed == t || kern_repack(m->packed, m->buf, rows, cols, tmp));
    free(tmp);
    if (!ok) matmul_buf_free(m);
    return ok;
}


int main(int argc, char **argv) {
    const int passes = argc > 1 ? atoi(argv[1]) : 5;
    const double mib = argc > 2 ? atof(argv[2]) : 512; /* fractions: e.g. 0.25 stays in L2 */
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const char *only = argc > 4 && strcmp(argv[4], "all") != 0 ? argv[4] : NULL;
    const char *cols_arg = argc > 5 ? argv[5] : "2048";
    if (passes < 1 || passes > 1000) {
        fprintf(stderr, "bench_dot_stream: passes must be 1..1000\n");
        return 2;
    }
    /* the matmul's row lengths: the first also serves the read and dot passes */
    enum { MAX_COLS = 8 };
    int64_t cols_list[MAX_COLS] = {0}, max_cols = 0;
    int n_cols = 0;
    for (const char *p = cols_arg; *p && n_cols < MAX_COLS;) {
        char *e;
        const long long c = strtoll(p, &e, 10);
        if (e == p || c < 256 || c % 256 != 0 || c > (1 << 20)) {
            fprintf(stderr, "bench_dot_stream: columns must be multiples of 256: %s\n", cols_arg);
            return 2;
        }
        cols_list[n_cols++] = c;
        if (c > max_cols) max_cols = c;
        p = *e == ',' ? e + 1 : e;
    }
    if (n_cols == 0) {
        fprintf(stderr, "bench_dot_stream: no columns in %s\n", cols_arg);
        return 2;
    }
    hl_pool *pool = NULL;
    hl_err err;
    if (hl_pool_create(threads, &pool, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    kern_init();
    const char *variant = kern_variant();
    /* the active table: kern_table_active() is what kern_matmul uses */
    const kern_table *tab = kern_table_active();
    printf("variant %s, %d threads, %g MiB per type, best of %d passes (GB/s of weights)\n",
           variant, threads, mib, passes);
    const hl_type types[] = {HL_TYPE_Q8_0, HL_TYPE_Q4_0, HL_TYPE_Q4_K, HL_TYPE_Q6_K, HL_TYPE_Q4_1,
                             HL_TYPE_Q5_0, HL_TYPE_Q5_1, HL_TYPE_Q2_K, HL_TYPE_Q3_K, HL_TYPE_Q5_K,
                             HL_TYPE_MXFP4};
    const int64_t cols = cols_list[0];
    float *x = malloc(sizeof(float) * (size_t)max_cols);
    float *out = malloc(sizeof(float) * 4096 * (size_t)threads);
    if (!x || !out) return 1;
    for (int64_t i = 0; i < max_cols; i++) x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const hl_type t = types[ti];
        if (only && !name_in_list(only, hl_type_name(t))) continue;
        const size_t row_bytes = hl_row_size(t, cols);
        const int64_t rows = (int64_t)(mib * (1 << 20) / (double)row_bytes) / 64 * 64;
        const size_t bytes = row_bytes * (size_t)rows;
        uint8_t *buf = bench_stream_alloc(bytes);
        if (!buf) return 1;
        if (!fill_rows(t, buf, rows, cols)) return 1;
        const hl_type vdt = hl_type_traits_get(t)->vec_dot_type;
        void *xq = malloc(hl_row_size(vdt, cols));
        hl_quantize_row(vdt, x, xq, cols);
        /* per row length, the same bytes in the layout decode runs them in */
        matmul_buf mm[MAX_COLS];
        for (int c = 0; c < n_cols; c++)
            if (!matmul_buf_make(&mm[c], t, mib, cols_list[c])) return 1;
        double best[2 + MAX_COLS] = {0}, *gbs[2 + MAX_COLS];
        for (int k = 0; k < 2 + n_cols; k++)
            if (!(gbs[k] = calloc((size_t)passes, sizeof(double)))) return 1;
        for (int p = 0; p < passes; p++) {
            for (int k = 0; k < 2 + n_cols; k++) {
                pass_job job = {.tab = tab, .type = t, .kind = k, .streams = 1 + p % 2,
                                .buf = buf, .rows = rows, .cols = cols, .row_bytes = row_bytes,
                                .xq = xq, .out = out};
                const matmul_buf *m = k >= 2 ? &mm[k - 2] : NULL;
                const double t0 = now_s();
                if (!m)
                    hl_pool_run(pool, pass_worker, &job);
                else
                    kern_matmul(pool, m->packed, m->buf, m->rows, m->cols, x, 1, m->out,
                                m->scratch);
                gbs[k][p] = (double)(m ? m->bytes : bytes) / (now_s() - t0) / 1e9;
                if (gbs[k][p] > best[k]) best[k] = gbs[k][p];
            }
        }
        printf("%-6s read %6.2f | dot %6.2f (%3.0f%% of read) | matmul %-7s", hl_type_name(t),
               best[0], best[1], 100 * best[1] / best[0], hl_type_name(mm[0].packed));
        for (int c = 0; c < n_cols; c++) {
            if (n_cols > 1) printf(" %lld cols", (long long)cols_list[c]);
            printf(" %6.2f (%3.0f%%)%s", best[2 + c], 100 * best[2 + c] / best[0],
                   c + 1 < n_cols ? " |" : "");
        }
        printf("\n");
        if (n_cols > 1) {
            /* the row lengths took turns in every pass: their medians compare directly */
            const double read = bench_median(gbs[0], passes);
            printf("%-6s medians: read %6.2f", "", read);
            for (int c = 0; c < n_cols; c++) {
                const double mm_gbs = bench_median(gbs[2 + c], passes);
                printf(" | %lld cols %6.2f (%3.0f%%)", (long long)cols_list[c], mm_gbs,
                       100 * mm_gbs / read);
            }
            printf("\n");
        }
        for (int k = 0; k < 2 + n_cols; k++) free(gbs[k]);
        for (int c = 0; c < n_cols; c++) matmul_buf_free(&mm[c]);
        free(xq);
        free(buf);
    }
    free(x);
    free(out);
    hl_pool_destroy(pool);
    return 0;
}
