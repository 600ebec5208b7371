/*
 * bench_sampler.c - sampling throughput (tokens/s) for 32000 and 151936 vocabularies
 * under typical option sets, single slot and a batch of 4 slots. Timed in thread CPU
 * time, so a busy machine skews the numbers less than wall time would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sample/sampler.h"

enum { N_ROWS = 8, BATCH = 4 };

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1.0p-53);
}

/* Roughly LM-shaped logits: a noisy bulk plus a few strong candidates. */
static void fill_rows(float *x, int32_t v) {
    for (int r = 0; r < N_ROWS; r++) {
        float *row = x + (size_t)r * v;
        for (int32_t i = 0; i < v; i++) {
            float a = frand(), b = frand(), c = frand();
            row[i] = (a + b + c - 1.5f) * 4.0f;
        }
        for (int k = 0; k < 20; k++) row[(int32_t)(frand() * (float)v)] += 8.0f + 4.0f * frand();
    }
}

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct config {
    const char *name;
    sampler_opts opts;
} config;

static double run(int32_t v, const float *rows, const sampler_opts *o, int batch, int iters) {
    sampler *s = NULL;
    hl_err err;
    if (sampler_create(v, 4096, &s, &err) != HL_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    int32_t ids[BATCH], prior[64];
    for (int i = 0; i < 64; i++) prior[i] = (int32_t)(frand() * (float)v);
    for (int b = 0; b < batch; b++) {
        sampler_opts so = *o;
        so.seed = 1000 + b;
        ids[b] = b;
        if (sampler_add(s, b, &so, prior, 64, &err) != HL_OK) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
    }
    sampler_out out[BATCH];
    uint64_t t0 = cpu_ns();
    long checksum = 0;
    for (int it = 0; it < iters; it++) {
        /* rows are consumed in place: point at consecutive stored rows */
        const float *src = rows + (size_t)((it * batch) % (N_ROWS - batch + 1)) * v;
        if (sampler_sample(s, ids, batch, src, (size_t)v, out, &err) != HL_OK) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        checksum += out[0].token;
    }
    uint64_t t1 = cpu_ns();
    sampler_destroy(s);
    if (checksum < 0) printf("impossible\n");
    return (double)iters * batch / ((double)(t1 - t0) * 1e-9);
}

int main(void) {
    const int32_t vocabs[] = {32000, 151936};
    config cfgs[6];
    for (int i = 0; i < 6; i++) cfgs[i].opts = sampler_opts_defaults();
    cfgs[0].name = "ollama defaults (T.8 k40 p.9)";
    cfgs[1].name = "greedy";
    cfgs[1].opts.temperature = 0;
    cfgs[2].name = "defaults + rep 1.1/64 + logprobs 5";
    cfgs[2].opts.repeat_penalty = 1.1f;
    cfgs[2].opts.logprobs = true;
    cfgs[2].opts.top_logprobs = 5;
    cfgs[3].name = "T.7 p.9 (no top-k)";
    cfgs[3].opts.top_k = 0;
    cfgs[3].opts.temperature = 0.7f;
    cfgs[4].name = "T1 min_p .05 (no top-k/p)";
    cfgs[4].opts.top_k = 0;
    cfgs[4].opts.top_p = 0;
    cfgs[4].opts.min_p = 0.05f;
    cfgs[4].opts.temperature = 1;
    cfgs[5].name = "probs order T.8 k40 p.9";
    cfgs[5].opts.order = SAMPLER_ORDER_PROBS;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        int32_t v = vocabs[vi];
        float *rows = malloc(sizeof(float) * (size_t)v * N_ROWS);
        if (!rows) return 1;
        fill_rows(rows, v);
        for (int c = 0; c < 6; c++) {
            int iters = v > 100000 ? 300 : 1500;
            run(v, rows, &cfgs[c].opts, 1, 20); /* warm up */
            double one = run(v, rows, &cfgs[c].opts, 1, iters);
            double four = run(v, rows, &cfgs[c].opts, BATCH, iters / BATCH);
            printf("vocab %6d  %-36s %9.0f tok/s  (batch %d: %9.0f tok/s)\n", v, cfgs[c].name,
                   one, BATCH, four);
        }
        free(rows);
    }
    return 0;
}
