/*
 * bench_pool.c - the cost of one hl_pool_run: back-to-back runs of a tiny job (a
 * decoded token does ~150 of them), and runs separated by ~20 us of caller-only work
 * (the small ops between matmuls). Prints wall us per run and process CPU us per run.
 * Usage: bench_pool [threads] [runs]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/pool.h"

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void tiny(void *ctx, int ith, int nth) {
    (void)nth;
    atomic_fetch_add((atomic_long *)ctx, ith + 1);
}

static void busy_us(double us) {
    const double end = clock_s(CLOCK_MONOTONIC) + us * 1e-6;
    while (clock_s(CLOCK_MONOTONIC) < end) {
    }
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int runs = argc > 2 ? atoi(argv[2]) : 20000;
    hl_pool *pool;
    hl_err err;
    if (hl_pool_create(threads, &pool, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    atomic_long sum = 0;
    for (int gap = 0; gap <= 20; gap += 20) {
        const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < runs; i++) {
            hl_pool_run(pool, tiny, &sum);
            if (gap) busy_us(gap);
        }
        const double w = clock_s(CLOCK_MONOTONIC) - w0 - (gap ? runs * gap * 1e-6 : 0);
        const double c = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("pool %d threads, %d runs, %2d us caller work between runs: %.2f us/run wall "
               "(excluding the gap), %.2f us/run cpu\n",
               threads, runs, gap, w / runs * 1e6, c / runs * 1e6);
    }
    hl_pool_destroy(pool);
    return sum > 0 ? 0 : 1;
}
