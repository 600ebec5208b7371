/*
 * bench_kernels.c - matmul throughput per weight type at TinyLlama's FFN shape
 * (5632 x 2048): decode (1 token) and prefill (32 tokens), in weight GB/s.
 * Usage: bench_kernels [threads] [--small]. HEARTH_CPU=ref measures the reference path.
 * --small: the batched-decode shapes instead, n = 1..16 tokens per matmul (what a decode
 * step of n sequences runs), best of 15 calls, time per call and per token relative to
 * n = 1: a matmul that reads each weight row once for all its tokens costs little more
 * at n = 4 than at n = 1.
 * Also prints process CPU time per call: on a busy machine, cpu-ms / threads is a
 * steadier measure of the kernel than wall time.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/pool.h"
#include "kernels/kernels.h"

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = 1, small = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--small") == 0)
            small = 1;
        else
            threads = atoi(argv[i]);
    }
    hl_pool *pool = NULL;
    hl_err err;
    if (hl_pool_create(threads, &pool, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const hl_type types[] = {HL_TYPE_F16,  HL_TYPE_Q8_0, HL_TYPE_Q4_0, HL_TYPE_Q4_K,
                             HL_TYPE_Q6_K, HL_TYPE_Q5_K, HL_TYPE_Q4_1, HL_TYPE_MXFP4};
    const int64_t rows = 5632, cols = 2048, max_tok = 32;
    float *x = malloc(sizeof(float) * (size_t)(cols * max_tok));
    float *out = malloc(sizeof(float) * (size_t)(rows * max_tok));
    for (int64_t i = 0; i < cols * max_tok; i++) x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
    printf("variant %s, %d threads\n", kern_variant(), threads);
    for (size_t tj = 0; tj < 2 * (sizeof types / sizeof types[0]); tj++) {
        const hl_type t = types[tj / 2];
        const int ti_pass = (int)(tj % 2); /* 0: file layout, 1: the packed one */
        if (ti_pass && kern_packed_type(t, rows) == t) continue;
        const size_t bytes = hl_row_size(t, cols) * (size_t)rows;
        unsigned char *w = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) w[i] = (unsigned char)(i * 2654435761u >> 13);
        /* keep fp16 scales finite: quantize real data where we can */
        if (hl_type_traits_get(t)->can_quantize) {
            float *row = malloc(sizeof(float) * (size_t)cols);
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t c = 0; c < cols; c++)
                    row[c] = (float)((r * 31 + c * 17) % 200) / 100.0f - 1.0f;
                hl_quantize_row(t, row, w + (size_t)r * hl_row_size(t, cols), cols);
            }
            free(row);
        }
        /* MXFP4 has no quantizer: random codes with normal-range shared exponents */
        if (t == HL_TYPE_MXFP4)
            for (size_t b = 0; b < bytes / sizeof(block_mxfp4); b++)
                ((block_mxfp4 *)w)[b].e = (uint8_t)(120 + b % 8);
        /* the layout the model runs this type in (kern_repack at load), when it differs */
        const hl_type packed = kern_packed_type(t, rows);
        if (packed != t && ti_pass) {
            void *tmp = malloc(8 * hl_row_size(t, cols));
            if (!kern_repack(packed, w, rows, cols, tmp)) {
                fprintf(stderr, "repack of %s failed\n", hl_type_name(t));
                return 1;
            }
            free(tmp);
        }
        const hl_type run_t = ti_pass ? packed : t;
        void *scratch = malloc(kern_matmul_scratch_size(run_t, cols, max_tok) + 1);
        if (small) {
            double base = 0;
            printf("%-7s", hl_type_name(run_t));
            for (int64_t nt = 1; nt <= 16; nt++) {
                double best = 1e9;
                kern_matmul(pool, run_t, w, rows, cols, x, nt, out, scratch); /* warm */
                for (int r = 0; r < 15; r++) {
                    const double t0 = clock_s(CLOCK_MONOTONIC);
                    kern_matmul(pool, run_t, w, rows, cols, x, nt, out, scratch);
                    const double dt = clock_s(CLOCK_MONOTONIC) - t0;
                    if (dt < best) best = dt;
                }
                if (nt == 1) base = best;
                printf(" n%lld %.0fus (%.2f)", (long long)nt, best * 1e6, best / nt / base);
            }
            printf("\n");
            fflush(stdout);
            free(scratch);
            free(w);
            continue;
        }
        for (int mode = 0; mode < 2; mode++) {
            const int64_t nt = mode ? max_tok : 1;
            const int reps = mode ? 3 : 20;
            kern_matmul(pool, run_t, w, rows, cols, x, nt, out, scratch); /* warm */
            const double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            for (int r = 0; r < reps; r++) kern_matmul(pool, run_t, w, rows, cols, x, nt, out, scratch);
            const double dt = (clock_s(CLOCK_MONOTONIC) - t0) / reps;
            const double dc = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / reps;
            printf("%-7s %s: %8.3f ms (cpu %8.3f ms)  %6.2f GB/s weights  %6.1f GFLOP/s"
                   " (%6.1f per cpu-s)\n",
                   hl_type_name(run_t), mode ? "prefill32" : "decode   ", dt * 1e3, dc * 1e3,
                   (double)bytes / dt / 1e9, 2.0 * rows * cols * nt / dt / 1e9,
                   2.0 * rows * cols * nt / dc / 1e9);
        }
        free(scratch);
        free(w);
    }
    free(x);
    free(out);
    hl_pool_destroy(pool);
    return 0;
}
