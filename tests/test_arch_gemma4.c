/*
 * test_arch_gemma4.c - gemma4 against llama.cpp's goldens (tests/arch_golden.h): per-layer
 * token inputs, KV sharing, local and global layers of different head sizes and KV heads,
 * proportional rope (rope_freqs), V norm, V = K on a layer without attn_v, layer output
 * scale, final softcap; F32, F16 and Q8_0 weights. Then the same model over the block pool
 * the server uses (per-layer KV dims, shared layers without storage): batched evaluation,
 * the runner and its prefix cache; and files whose KV sharing cannot work are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
#include "kv/block.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

TEST(arch_gemma4) { arch_golden_check("gemma4"); }
TEST(arch_gemma4_f16) { arch_golden_check("gemma4-f16"); }
TEST(arch_gemma4_q8_0) { arch_golden_check("gemma4-q8_0"); }
TEST(arch_gemma4_keqv) { arch_golden_check("gemma4-keqv"); }
TEST(arch_gemma4_keqv_f16) { arch_golden_check("gemma4-keqv-f16"); }
TEST(arch_gemma4_keqv_q8_0) { arch_golden_check("gemma4-keqv-q8_0"); }

static int32_t argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

static void fill_tokens(int32_t *p, int n, int seed, int32_t n_vocab) {
    uint32_t x = (uint32_t)seed * 2654435761u + 7;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % (uint32_t)(n_vocab - 3));
    }
}

/* The geometry gives the 3 shared layers no storage; the pool built from it (as the
 * runner builds it) serves several sequences in one batch exactly as each alone, and each
 * alone as a contiguous cache (up to the order of the attention's blocks). */
#define NSEQ 4
TEST(gemma4_block_pool_batch_matches_each_alone_and_model_eval) {
    model *m = arch_load_file("gemma4.gguf");
    if (!m) SKIP("testdata/arch/gemma4.gguf not found");
    const model_hparams *hp = model_get_hparams(m);
    const int32_t V = hp->n_vocab;
    const kv_geom *g = model_kv_geom(m);
    CHECK_EQ_INT(g->n_layer, 6);
    static const int32_t want_heads[6] = {2, 2, 1, 0, 0, 0}, want_hd[6] = {32, 32, 64, 0, 0, 0};
    size_t bytes = 0;
    for (int l = 0; l < 6; l++) {
        CHECK_EQ_INT(g->dims[l].n_head_kv, want_heads[l]);
        if (want_heads[l]) CHECK_EQ_INT(g->dims[l].head_dim_k, want_hd[l]);
        bytes += (size_t)want_heads[l] * (size_t)want_hd[l] * 2 * sizeof(float);
    }
    CHECK_EQ_INT((int)g->bytes_per_pos, (int)bytes);

    model_ctx *c;
    CHECK_OK(model_ctx_create(m, 2, 64, &c, NULL), NULL);
    kv_pool_config pc = {.layout = {.n_layer = hp->n_layer, .n_head_kv = hp->n_head_kv,
                                    .head_dim_k = hp->head_dim_k, .head_dim_v = hp->head_dim_v,
                                    .block_tokens = 8, .layers = g->dims},
                         .budget_bytes = (size_t)16 << 20};
    kv_pool *pool;
    CHECK_OK(kv_pool_create(&pc, &pool, NULL), NULL);
    static const int cached[NSEQ] = {13, 0, 21, 9}, fresh[NSEQ] = {6, 11, 1, 1};
    int32_t toks[NSEQ][40];
    kv_table alone[NSEQ], batched[NSEQ];
    float *alone_logits = calloc((size_t)NSEQ * (size_t)V, sizeof(float));
    float *out = calloc((size_t)NSEQ * (size_t)V, sizeof(float));
    float *ref = calloc((size_t)V, sizeof(float));
    CHECK(alone_logits && out && ref);
    for (int s = 0; s < NSEQ; s++) {
        fill_tokens(toks[s], cached[s] + fresh[s], 70 + s, V);
        kv_table *tabs[2] = {&alone[s], &batched[s]};
        for (int k = 0; k < 2; k++) {
            kv_table_init(tabs[k], pool);
            if (!cached[s]) continue;
            CHECK_OK(kv_table_reserve(tabs[k], cached[s], NULL), NULL);
            model_kv_view v = {.blocks = tabs[k]->data, .n_blocks = tabs[k]->n_blocks,
                               .block_tokens = 8, .len = tabs[k]->len, .geom = kv_pool_geom(pool)};
            CHECK_OK(model_eval_view(c, &v, toks[s], cached[s], NULL, NULL), NULL);
            kv_table_commit(tabs[k], cached[s]);
        }
        CHECK_OK(kv_table_reserve(&alone[s], fresh[s], NULL), NULL);
        model_kv_view v = {.blocks = alone[s].data, .n_blocks = alone[s].n_blocks, .block_tokens = 8,
                           .len = alone[s].len, .geom = kv_pool_geom(pool)};
        CHECK_OK(model_eval_view(c, &v, toks[s] + cached[s], fresh[s], NULL, NULL), NULL);
        kv_table_commit(&alone[s], fresh[s]);
        memcpy(alone_logits + (size_t)s * V, model_ctx_logits(c), (size_t)V * sizeof(float));
        /* the same tokens over one contiguous cache */
        model_kv *kv;
        CHECK_OK(model_kv_create(m, 64, &kv, NULL), NULL);
        CHECK_OK(model_eval(c, kv, toks[s], cached[s] + fresh[s], NULL, NULL), NULL);
        memcpy(ref, model_ctx_logits(c), (size_t)V * sizeof(float));
        model_kv_free(kv);
        float d = 0;
        for (int32_t i = 0; i < V; i++) d = fmaxf(d, fabsf(ref[i] - alone_logits[(size_t)s * V + i]));
        CHECK_MSG(d < 1e-4f, "sequence %d: blocks vs contiguous cache differ by %g", s, d);
        CHECK_EQ_INT(argmax(ref, V), argmax(alone_logits + (size_t)s * V, V));
    }
    model_batch_entry e[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        CHECK_OK(kv_table_reserve(&batched[s], fresh[s], NULL), NULL);
        e[s] = (model_batch_entry){.kv = {batched[s].data, batched[s].n_blocks, 8,
                                          batched[s].len, kv_pool_geom(pool)},
                                   .tokens = toks[s] + cached[s], .n_tokens = fresh[s],
                                   .want_logits = true};
    }
    CHECK_OK(model_eval_batch(c, e, NSEQ, out, NULL), NULL);
    for (int s = 0; s < NSEQ; s++) {
        CHECK_MSG(memcmp(out + (size_t)s * V, alone_logits + (size_t)s * V,
                         (size_t)V * sizeof(float)) == 0,
                  "sequence %d's logits differ in a batch", s);
        kv_table_free(&alone[s]);
        kv_table_free(&batched[s]);
    }
    free(alone_logits);
    free(out);
    free(ref);
    kv_pool_destroy(pool);
    model_ctx_free(c);
    model_free(m);
}

/* Through the runner (the server's path): a conversation past the window, continued from
 * the prefix cache, gives the greedy tokens of model_eval. */
TEST(gemma4_runner_greedy_matches_model_eval) {
    model *m = arch_load_file("gemma4.gguf");
    if (!m) SKIP("testdata/arch/gemma4.gguf not found");
    int32_t prompt[24];
    fill_tokens(prompt, 24, 5, model_get_hparams(m)->n_vocab);
    arch_runner_eval_check(m, prompt, 24);
    model_free(m);
}

/* gemma4.gguf with one metadata value changed in place (same size), written to the temp
 * dir; returns the load status and the error. */
static hl_status load_patched(const char *key, size_t value_off, const void *val, size_t n,
                              hl_err *err) {
    const char *src = test_shared_path("testdata/arch/gemma4.gguf");
    FILE *f = fopen(src, "rb");
    if (!f) return HL_ERR_IO;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len);
    size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    const size_t klen = strlen(key);
    uint8_t *at = NULL;
    for (size_t i = 0; buf && got == (size_t)len && i + klen < (size_t)len && !at; i++)
        if (memcmp(buf + i, key, klen) == 0) at = buf + i + klen;
    if (!at) {
        free(buf);
        return HL_ERR_FORMAT + 1000; /* key not found: not the status the tests expect */
    }
    memcpy(at + value_off, val, n);
    char path[512];
    snprintf(path, sizeof path, "%s/gemma4-patched.gguf", test_tmpdir());
    f = fopen(path, "wb");
    if (f) {
        fwrite(buf, 1, (size_t)len, f);
        fclose(f);
    }
    free(buf);
    model *m = NULL;
    hl_status st = model_load(path, NULL, &m, err);
    model_free(m);
    return st;
}

TEST(gemma4_refuses_kv_sharing_that_cannot_work) {
    if (!test_shared_path("testdata/arch/gemma4.gguf")) SKIP("testdata/arch/gemma4.gguf not found");
    hl_err err;
    /* u32 value after its 4-byte type */
    const uint32_t five = 5, big = 48;
    CHECK(load_patched("gemma4.attention.shared_kv_layers", 4, &five, 4, &err) == HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "fewer than 2") != NULL, "%s", err.msg);
    CHECK(load_patched("gemma4.rope.dimension_count_swa", 4, &big, 4, &err) == HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "dimension_count_swa") != NULL, "%s", err.msg);
    /* bool array (type, element type, u64 count, data): layer 1 made global, so local
     * layers 3 and 4 would share a global layer's cache */
    const uint8_t no = 0;
    CHECK(load_patched("gemma4.attention.sliding_window_pattern", 4 + 4 + 8 + 1, &no, 1, &err) ==
          HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "shares the KV cache of layer 1") != NULL, "%s", err.msg);
    /* the unpatched file loads */
    CHECK(load_patched("gemma4.attention.shared_kv_layers", 4, &(uint32_t){3}, 4, &err) == HL_OK);
}
