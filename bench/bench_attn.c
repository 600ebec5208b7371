/*
 * bench_attn.c - decode attention alone (op_attention), TinyLlama's attention shape
 * (22 layers, 32 query heads, 4 KV heads of 64): one decode step's attention at a context
 * of --ctx positions, over f32, f16 and q8_0 caches, the KV in blocks of --block positions
 * (256 by default, the figures in bench/README.md; the runner's pool uses 32,
 * RUNNER_BLOCK_TOKENS) (all 22 layers: 185 MB of f32 KV at 4096, beyond the last-level
 * cache, as in a real decode step). Per type: ms per step (median of --runs, after one
 * untimed step) with min..max, process CPU ms per step (median; on a shared machine wall
 * time counts the neighbours, CPU time what the code costs), and GB/s of K and V read in
 * the best run, with 1 and --threads threads; the types alternate within each run so a
 * busy neighbour hits all alike.
 *
 *   build/bench/bench_attn [--ctx 4096] [--threads 2] [--runs 7] [--block 256]
 *                          [--kv f32,f16,q8_0]
 *
 * --kv keeps only the named cache types (to profile one kernel under perf).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kv/layout.h"
#include "model/internal.h"
#include "model/model.h"
#include "model/ops.h"
#include "model_synth.h"

enum { NL = 22, NH = 32, NKV = 4, HD = 64, MAX_RUNS = 64 };

static double now_s(clockid_t clk) {
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *arg(int argc, char **argv, const char *flag, const char *dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], flag) == 0) return argv[i + 1];
    return dflt;
}

/* One decode step's attention: every layer, the token at position ctx - 1. */
static double step(model_ctx *c, const model_seq_kv *view, int32_t ctx, double *cpu) {
    c->seq_kv[0] = (model_seq_views){{*view, *view}, NULL};
    c->seq_end[0] = ctx;
    c->n_seq = 1;
    c->seq_first[0] = 0;
    c->seq_first[1] = 1;
    c->tok_pos[0] = ctx - 1;
    c->tok_seq[0] = 0;
    c->tok_id[0] = 3;
    const double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    hl_pool_burst_begin(c->pool); /* as the forward pass: workers spin between the layers */
    for (int32_t l = 0; l < NL; l++) {
        const op_attn a = {.layer = l, .n_head = NH, .n_head_kv = NKV, .head_dim_k = HD,
                           .head_dim_v = HD, .scale = 0.125f, .causal = true};
        op_attention(c, &a, 1);
    }
    hl_pool_burst_end(c->pool);
    *cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    return now_s(CLOCK_MONOTONIC) - t0;
}

int main(int argc, char **argv) {
    const int32_t ctx = atoi(arg(argc, argv, "--ctx", "4096"));
    const int threads = atoi(arg(argc, argv, "--threads", "2"));
    int runs = atoi(arg(argc, argv, "--runs", "7"));
    const int32_t block = atoi(arg(argc, argv, "--block", "256"));
    const hl_type all[3] = {HL_TYPE_F32, HL_TYPE_F16, HL_TYPE_Q8_0};
    const char *kv_arg = arg(argc, argv, "--kv", "f32,f16,q8_0");
    hl_type types[3];
    int nt = 0;
    for (int i = 0; i < 3; i++) {
        const char *name = hl_type_name(all[i]), *at = strstr(kv_arg, name);
        const size_t len = strlen(name);
        /* a whole item of the list: f16 must not match inside bf16, say */
        if (at && (at == kv_arg || at[-1] == ',') && (at[len] == '\0' || at[len] == ','))
            types[nt++] = all[i];
    }
    if (ctx < 1 || threads < 1 || runs < 1 || block < 1 || block > 65536 || nt == 0) {
        fprintf(stderr, "usage: bench_attn [--ctx 4096] [--threads 2] [--runs 7] [--block 256] "
                        "[--kv f32,f16,q8_0]\n");
        return 2;
    }
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    char path[] = "/tmp/bench_attn_XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    synth_cfg cfg = {.arch = "llama", .n_vocab = 32, .n_embd = 64, .n_layer = NL, .n_ff = 64,
                     .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .rope_base = 10000.0f,
                     .wtype = HL_TYPE_F32, .seed = 1};
    synth_model *sm = synth_build(&cfg, path);
    hl_err err = {0};
    model *m = NULL;
    if (!sm || model_load(path, NULL, &m, &err)) {
        fprintf(stderr, "bench_attn: %s\n", err.msg);
        return 1;
    }
    synth_free(sm);
    remove(path);
    const int nthr[2] = {1, threads};
    model_ctx *cs[2];
    for (int k = 0; k < 2; k++)
        if (model_ctx_create(m, nthr[k], 8, &cs[k], &err)) {
            fprintf(stderr, "bench_attn: %s\n", err.msg);
            return 1;
        }
    kv_layer_dims dims[NL];
    for (int l = 0; l < NL; l++) dims[l] = (kv_layer_dims){NKV, HD, HD};
    kv_geom g[3];
    const int nblk = (ctx + block - 1) / block;
    void **blocks[3];
    model_seq_kv view[3];
    float row[HD];
    unsigned seed = 1;
    for (int ti = 0; ti < nt; ti++) {
        if (kv_geom_init(&g[ti], NL, dims, types[ti], types[ti], &err)) {
            fprintf(stderr, "bench_attn: %s\n", err.msg);
            return 1;
        }
        blocks[ti] = calloc((size_t)nblk, sizeof(void *));
        for (int b = 0; b < nblk; b++) {
            blocks[ti][b] = malloc((size_t)block * g[ti].bytes_per_pos);
            if (!blocks[ti][b]) return 1;
        }
        for (int32_t p = 0; p < ctx; p++)
            for (int l = 0; l < NL; l++)
                for (int h = 0; h < NKV; h++) {
                    for (int i = 0; i < HD; i++) {
                        seed = seed * 1664525u + 1013904223u;
                        row[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                    }
                    void *base = blocks[ti][p / block];
                    kern_kv_store_key(types[ti], row, kv_geom_k(&g[ti], base, block, l, h, p % block), HD,
                                      kv_geom_k_stride(&g[ti], block, p % block));
                    kern_kv_store_row(types[ti], row, kv_geom_v(&g[ti], base, block, l, h, p % block), HD);
                }
        view[ti] = (model_seq_kv){.blocks = blocks[ti], .B = block, .len = ctx, .geom = &g[ti]};
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8 * NH * HD; i++) cs[k]->q[i] = 0.01f * (float)(i % 17);
    static double t[2][3][MAX_RUNS], cpu[2][3][MAX_RUNS];
    for (int k = 0; k < 2; k++)
        for (int ti = 0; ti < nt; ti++) step(cs[k], &view[ti], ctx, &cpu[k][ti][0]); /* warm-up */
    for (int r = 0; r < runs; r++)
        for (int k = 0; k < 2; k++)
            for (int ti = 0; ti < nt; ti++) t[k][ti][r] = step(cs[k], &view[ti], ctx, &cpu[k][ti][r]);
    printf("bench_attn: decode attention at %d positions in blocks of %d, 22 layers x 32 heads "
           "(4 KV) x 64, kernels %s, median [min..max] of %d\n",
           ctx, block, kern_variant(), runs);
    for (int k = 0; k < 2; k++)
        for (int ti = 0; ti < nt; ti++) {
            qsort(t[k][ti], (size_t)runs, sizeof(double), cmp_d);
            qsort(cpu[k][ti], (size_t)runs, sizeof(double), cmp_d);
            const double med = t[k][ti][runs / 2];
            const double bytes = (double)ctx * (double)g[ti].bytes_per_pos;
            printf("  %d thread%s %-5s %7.3f ms/step [%.3f..%.3f]  cpu %7.3f ms  %5.1f GB/s of KV "
                   "(best run)  (%.1f MB)\n",
                   nthr[k], nthr[k] > 1 ? "s" : " ", hl_type_name(types[ti]), med * 1e3,
                   t[k][ti][0] * 1e3, t[k][ti][runs - 1] * 1e3, cpu[k][ti][runs / 2] * 1e3,
                   bytes / t[k][ti][0] / 1e9, bytes / 1e6);
        }
    for (int ti = 0; ti < nt; ti++) {
        for (int b = 0; b < nblk; b++) free(blocks[ti][b]);
        free(blocks[ti]);
        kv_geom_free(&g[ti]);
    }
    for (int k = 0; k < 2; k++) model_ctx_free(cs[k]);
    model_free(m);
    return 0;
}
