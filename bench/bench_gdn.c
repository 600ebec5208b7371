/*
 * bench_gdn.c - Gated DeltaNet (qwen35) prefill and decode speed against a dense model of
 * about the same size.
 *
 *   bench_gdn [--threads 2] [--runs 3] [--prefill 512,2048] [--decode 64]
 *
 * Two synthetic Q8_0 models with random weights (speed does not depend on the values),
 * written to temporary files and loaded:
 *   - qwen35: 8 layers (6 Gated DeltaNet + 2 gated full attention, interval 4), n_embd
 *     1024, n_ff 3072, GDN 8 key and 8 value heads of 128 (conv kernel 4), attention
 *     8 heads of 128 with 2 KV heads; vocab 8192.
 *   - dense: llama with the same n_embd, n_layer, n_ff, vocab; 8 heads of 128, 8 KV heads.
 * For each prefill length: one model_eval of that many tokens from an empty cache (the
 * chunked delta rule for the GDN layers), then --decode single-token evals; medians of
 * --runs runs after an untimed warm-up. Prints tok/s and the weight bytes of each model.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/stats.h"
#include "common/synth.h"
#include "model/model.h"
#include "model_synth.h"
#include "tensor/types.h"

enum { E = 1024, L = 8, FF = 3072, V = 8192, NH = 8, NKV = 2, HD = 128, GK = 8, GV = 8,
       DK = 128, KCONV = 4, MAX_RUNS = 16 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


static int write_qwen35(const char *path) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return 1;
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    gguf_writer_set_u32(w, "qwen35.context_length", 8192);
    gguf_writer_set_u32(w, "qwen35.embedding_length", E);
    gguf_writer_set_u32(w, "qwen35.block_count", L);
    gguf_writer_set_u32(w, "qwen35.feed_forward_length", FF);
    gguf_writer_set_u32(w, "qwen35.attention.head_count", NH);
    gguf_writer_set_u32(w, "qwen35.attention.head_count_kv", NKV);
    gguf_writer_set_u32(w, "qwen35.attention.key_length", HD);
    gguf_writer_set_u32(w, "qwen35.attention.value_length", HD);
    gguf_writer_set_u32(w, "qwen35.rope.dimension_count", 64);
    gguf_writer_set_f32(w, "qwen35.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_f32(w, "qwen35.rope.freq_base", 1e7f);
    gguf_writer_set_u32(w, "qwen35.ssm.conv_kernel", KCONV);
    gguf_writer_set_u32(w, "qwen35.ssm.inner_size", GV * DK);
    gguf_writer_set_u32(w, "qwen35.ssm.state_size", DK);
    gguf_writer_set_u32(w, "qwen35.ssm.time_step_rank", GV);
    gguf_writer_set_u32(w, "qwen35.ssm.group_count", GK);
    gguf_writer_set_u32(w, "qwen35.full_attention_interval", 4);
    synth_write_vocab(w, V);
    const float ws = 0.05f;
    const int CH = GV * DK + 2 * GK * DK;
    int rc = bench_synth_add_tensor(w, "token_embd.weight", V, E, HL_TYPE_Q8_0, 1.0f, 0);
    rc |= bench_synth_add_tensor(w, "output_norm.weight", 1, E, HL_TYPE_F32, 0.1f, 1.0f);
    rc |= bench_synth_add_tensor(w, "output.weight", V, E, HL_TYPE_Q8_0, ws, 0);
    for (int l = 0; l < L && !rc; l++) {
        char n[64];
#define T(name, rows, cols, type, s, o) \
    (snprintf(n, sizeof n, "blk.%d.%s", l, name), bench_synth_add_tensor(w, n, rows, cols, type, s, o))
        rc |= T("attn_norm.weight", 1, E, HL_TYPE_F32, 0.1f, 1.0f);
        rc |= T("post_attention_norm.weight", 1, E, HL_TYPE_F32, 0.1f, 1.0f);
        if ((l + 1) % 4 == 0) {
            rc |= T("attn_q.weight", 2 * NH * HD, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("attn_k.weight", NKV * HD, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("attn_v.weight", NKV * HD, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("attn_output.weight", E, NH * HD, HL_TYPE_Q8_0, ws, 0);
            rc |= T("attn_q_norm.weight", 1, HD, HL_TYPE_F32, 0.1f, 1.0f);
            rc |= T("attn_k_norm.weight", 1, HD, HL_TYPE_F32, 0.1f, 1.0f);
        } else {
            rc |= T("attn_qkv.weight", CH, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("attn_gate.weight", GV * DK, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("ssm_conv1d.weight", CH, KCONV, HL_TYPE_F32, 0.3f, 0);
            rc |= T("ssm_dt.bias", 1, GV, HL_TYPE_F32, 0.5f, 0);
            rc |= T("ssm_a", 1, GV, HL_TYPE_F32, 0.5f, -1.0f);
            rc |= T("ssm_beta.weight", GV, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("ssm_alpha.weight", GV, E, HL_TYPE_Q8_0, ws, 0);
            rc |= T("ssm_norm.weight", 1, DK, HL_TYPE_F32, 0.1f, 1.0f);
            rc |= T("ssm_out.weight", E, GV * DK, HL_TYPE_Q8_0, ws, 0);
        }
        rc |= T("ffn_gate.weight", FF, E, HL_TYPE_Q8_0, ws, 0);
        rc |= T("ffn_up.weight", FF, E, HL_TYPE_Q8_0, ws, 0);
        rc |= T("ffn_down.weight", E, FF, HL_TYPE_Q8_0, ws, 0);
#undef T
    }
    hl_err err;
    if (!rc && gguf_writer_write_file(w, path, &err)) {
        fprintf(stderr, "write %s: %s\n", path, err.msg);
        rc = 1;
    }
    gguf_writer_destroy(w);
    return rc;
}

static const char *arg(int argc, char **argv, const char *flag, const char *dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], flag) == 0) return argv[i + 1];
    return dflt;
}

/* Prefill of n tokens and decode of n_decode after it: medians over runs. */
static int measure(model *m, int threads, int runs, int n, int n_decode, double *pp, double *tg) {
    model_kv *kv = NULL;
    model_ctx *c = NULL;
    hl_err err;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n + n_decode));
    if (!toks || model_kv_create(m, n + n_decode + 8, &kv, &err) ||
        model_ctx_create(m, threads, n, &c, &err)) {
        fprintf(stderr, "setup: %s\n", toks ? err.msg : "out of memory");
        free(toks);
        model_kv_free(kv);
        return 1;
    }
    for (int i = 0; i < n + n_decode; i++) toks[i] = 3 + (int32_t)((bench_frand() + 1) * 4000);
    double p[MAX_RUNS], t[MAX_RUNS];
    int rc = model_eval(c, kv, toks, 32, NULL, &err) != HL_OK; /* warm-up */
    for (int r = 0; !rc && r < runs; r++) {
        rc |= model_kv_truncate(kv, 0, &err) != HL_OK;
        double t0 = now_s();
        rc |= model_eval(c, kv, toks, n, NULL, &err) != HL_OK;
        p[r] = n / (now_s() - t0);
        t0 = now_s();
        for (int i = 0; !rc && i < n_decode; i++)
            rc |= model_eval(c, kv, toks + n + i, 1, NULL, &err) != HL_OK;
        t[r] = n_decode / (now_s() - t0);
    }
    if (rc) fprintf(stderr, "eval: %s\n", err.msg);
    else {
        *pp = bench_median(p, runs);
        *tg = bench_median(t, runs);
    }
    model_ctx_free(c);
    model_kv_free(kv);
    free(toks);
    return rc;
}

int main(int argc, char **argv) {
    const int threads = atoi(arg(argc, argv, "--threads", "2"));
    int runs = atoi(arg(argc, argv, "--runs", "3"));
    const int n_decode = atoi(arg(argc, argv, "--decode", "64"));
    const char *lens = arg(argc, argv, "--prefill", "512,2048");
    if (runs < 1) runs = 1;
    if (runs > MAX_RUNS) runs = MAX_RUNS;
    char path[] = "/tmp/hearth-bench-gdn-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return 1;
    }
    close(fd);
    model *gdn = NULL;
    hl_err err;
    if (write_qwen35(path) || model_load(path, NULL, &gdn, &err)) {
        fprintf(stderr, "qwen35 model: %s\n", err.msg);
        unlink(path);
        return 1;
    }
    unlink(path);
    const bench_llama dc = {.n_vocab = V, .n_embd = E, .n_layer = L, .n_ff = FF, .n_head = NH,
                            .n_head_kv = NH, .n_ctx = 8192};
    model *dense = bench_synth_llama(&dc);
    if (!dense) return 1;
    printf("weights: qwen35 %.1f MiB, dense %.1f MiB (Q8_0); %d threads, median of %d runs\n",
           model_weight_bytes(gdn) / 1048576.0, model_weight_bytes(dense) / 1048576.0, threads,
           runs);
    printf("| model | prefill tokens | prefill tok/s | decode %d after it, tok/s |\n|---|---|---|---|\n",
           n_decode);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", lens);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        const int n = atoi(tok);
        if (n < 32 || n > 8000) continue;
        double pp, tg;
        for (int which = 0; which < 2; which++) {
            if (measure(which ? dense : gdn, threads, runs, n, n_decode, &pp, &tg)) return 1;
            printf("| %s | %d | %.1f | %.1f |\n", which ? "dense llama" : "qwen35 (GDN)", n, pp, tg);
            fflush(stdout);
        }
    }
    model_free(gdn);
    model_free(dense);
    return 0;
}
