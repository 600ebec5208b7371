/*
 * test_arch_phi3.c - phi3 against llama.cpp's goldens (tests/arch_golden.h): fused qkv and
 * gate|up, partial rotary (neox), LongRoPE with the long and the short factor sets and
 * the attention factor; F32, F16 and Q8_0 weights. Also: the factor set follows the
 * context size the caller serves (model_ctx_set_n_ctx, a model_kv's capacity, the
 * runner's num_ctx) by llama.cpp's rule; separate q/k/v equal the fused tensor; load
 * errors name the fused tensors and their shapes.
 */
#include "arch_golden.h"
#include "test.h"

TEST(arch_phi3) { arch_golden_check("phi3"); }
TEST(arch_phi3_f16) { arch_golden_check("phi3-f16"); }
TEST(arch_phi3_q8_0) { arch_golden_check("phi3-q8_0"); }
TEST(arch_phi3_longrope) { arch_golden_check("phi3-longrope"); }
TEST(arch_phi3_longrope_f16) { arch_golden_check("phi3-longrope-f16"); }
TEST(arch_phi3_longrope_q8_0) { arch_golden_check("phi3-longrope-q8_0"); }
TEST(arch_phi3_longrope_short) { arch_golden_check("phi3-longrope-short"); }
TEST(arch_phi3_longrope_short_f16) { arch_golden_check("phi3-longrope-short-f16"); }
TEST(arch_phi3_longrope_short_q8_0) { arch_golden_check("phi3-longrope-short-q8_0"); }

/* ---- which LongRoPE factors: chosen by the context size the caller serves ---- */

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kv/layout.h"
#include "model_synth.h"
#include "runner/runner.h"

#define N_TOK 24

/* phi3-longrope-short: original context 256, trained 1024. Loads it and its golden
 * prompt and greedy ids (NULL model when the shared data is absent: the test skips). */
static model *load_short(int32_t *prompt, int32_t *n_prompt, int32_t *greedy,
                         int32_t *n_greedy) {
    const char *gp = test_shared_path("testdata/arch/phi3-longrope-short.gguf");
    const char *jp = test_shared_path("testdata/arch/phi3-longrope-short.json");
    if (!gp || !jp) {
        test_skip("testdata/arch/phi3-longrope-short.{gguf,json} not found (HEARTH_SHARED)");
        return NULL;
    }
    json_t *root = json_load_file(jp, 0, NULL);
    if (!root) {
        test_fail_at(__FILE__, __LINE__, "cannot parse %s", jp);
        return NULL;
    }
    json_t *p = json_object_get(root, "prompt_ids"), *g = json_object_get(root, "greedy_ids");
    *n_prompt = *n_greedy = 0;
    for (size_t i = 0; i < json_array_size(p) && i < 64; i++)
        prompt[(*n_prompt)++] = (int32_t)json_integer_value(json_array_get(p, i));
    for (size_t i = 0; i < json_array_size(g) && i < 64; i++)
        greedy[(*n_greedy)++] = (int32_t)json_integer_value(json_array_get(g, i));
    json_decref(root);
    model *m = NULL;
    hl_err err = {0};
    if (model_load(gp, NULL, &m, &err)) test_fail_at(__FILE__, __LINE__, "%s", err.msg);
    return m;
}

/* The last of N_TOK prompt tokens' logits, from a model_kv of capacity cap with the
 * context's n_ctx set to set_n_ctx (0: unset). */
static hl_status last_logits(const model *m, const int32_t *toks, int32_t cap, int32_t set_n_ctx,
                             float *out) {
    model_kv *kv = NULL;
    model_ctx *c = NULL;
    hl_status st = model_kv_create(m, cap, &kv, NULL);
    if (!st) st = model_ctx_create(m, 1, 0, &c, NULL);
    if (!st) {
        model_ctx_set_n_ctx(c, set_n_ctx);
        st = model_eval(c, kv, toks, N_TOK, NULL, NULL);
    }
    if (!st)
        memcpy(out, model_ctx_logits(c), sizeof(float) * (size_t)model_get_hparams(m)->n_vocab);
    model_ctx_free(c);
    model_kv_free(kv);
    return st;
}

static double max_diff(const float *a, const float *b, int32_t n) {
    double d = 0;
    for (int32_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

TEST(arch_phi3_longrope_factors_follow_the_context_size) {
    int32_t prompt[64], greedy[64], n_prompt, n_greedy;
    model *m = load_short(prompt, &n_prompt, greedy, &n_greedy);
    if (!m) return; /* skipped, or failed in load_short */
    CHECK(n_prompt >= N_TOK);
    const int32_t V = model_get_hparams(m)->n_vocab;
    float *shrt = malloc(sizeof(float) * (size_t)V * 3), *lng = shrt + V, *x = shrt + 2 * V;
    /* a cache of 256 (llama.cpp's context for the golden): short factors */
    CHECK_OK(last_logits(m, prompt, 256, 0, shrt), NULL);
    /* 200 is padded to 256 as llama.cpp pads it: still short, bit for bit */
    CHECK_OK(last_logits(m, prompt, 64, 200, x), NULL);
    CHECK(max_diff(shrt, x, V) == 0);
    /* 257 pads to 512 > 256: the long factors, set on the context or from the cache */
    CHECK_OK(last_logits(m, prompt, 64, 257, lng), NULL);
    CHECK_MSG(max_diff(shrt, lng, V) > 1e-3, "long and short factors gave the same logits");
    CHECK_OK(last_logits(m, prompt, 512, 0, x), NULL);
    CHECK(max_diff(lng, x, V) == 0);
    /* a set context size wins over the cache's capacity */
    CHECK_OK(last_logits(m, prompt, 512, 256, x), NULL);
    CHECK(max_diff(shrt, x, V) == 0);
    /* a block table says nothing about the context: the trained one (1024: long) unless
     * set */
    const kv_geom *g = model_kv_geom(m);
    void *block = calloc(64, g->bytes_per_pos);
    void *const blocks[1] = {block};
    model_ctx *c = NULL;
    CHECK_OK(model_ctx_create(m, 1, 0, &c, NULL), NULL);
    for (int set = 0; set < 2; set++) {
        model_kv_view view = {.blocks = blocks, .n_blocks = 1, .block_tokens = 64};
        model_ctx_set_n_ctx(c, set ? 256 : 0);
        CHECK_OK(model_eval_view(c, &view, prompt, N_TOK, NULL, NULL), NULL);
        CHECK(max_diff(set ? shrt : lng, model_ctx_logits(c), V) == 0);
    }
    model_ctx_free(c);
    free(block);
    free(shrt);
    model_free(m);
}

static bool collect(void *user, const runner_event *ev) {
    int32_t *toks = user;
    if (ev->kind == RUNNER_EV_TOKEN && toks[0] < 16) toks[1 + toks[0]++] = ev->token;
    return true;
}

/* The runner serves num_ctx 256 as llama.cpp's golden run did: its greedy tokens are the
 * golden's (with the trained context of 1024 the long factors would apply). */
TEST(arch_phi3_longrope_runner_uses_its_context_size) {
    int32_t prompt[64], greedy[64], n_prompt, n_greedy;
    model *m = load_short(prompt, &n_prompt, greedy, &n_greedy);
    if (!m) return; /* skipped, or failed in load_short */
    CHECK(n_greedy >= 8);
    runner_config cfg = {.n_threads = 1, .n_ctx = 256, .kv_budget_bytes = (size_t)64 << 20,
                         .n_parallel = 1};
    runner *r = NULL;
    CHECK_OK(runner_create(m, &cfg, &r, NULL), NULL);
    int32_t got[17] = {0};
    runner_request req = {.tokens = prompt, .n_tokens = n_prompt, .num_predict = 8,
                          .emit = collect, .user = got};
    req.sampling = (sampler_opts){.temperature = 0, .repeat_last_n = 0};
    runner_stats st;
    hl_err err = {0};
    hl_status s = runner_generate(r, &req, &st, &err);
    runner_destroy(r);
    model_free(m);
    CHECK_OK(s, &err);
    CHECK_EQ_INT(got[0], 8);
    for (int i = 0; i < 8; i++)
        CHECK_MSG(got[1 + i] == greedy[i], "greedy token %d: %d, golden %d", i, got[1 + i],
                  greedy[i]);
}

/* ---- load errors: the fused tensors are checked like any other ---- */

/* A one-layer phi3 GGUF (n_embd 32, 4 heads, 2 KV heads, n_ff 48, rotary on 4 of 8
 * dims, random weights fixed by their tensor) without the tensor `skip`, with `wide` one
 * row longer, and with attn_qkv written as separate attn_q/k/v when split. */
static hl_status write_phi3(const char *path, const char *skip, const char *wide, bool split,
                            hl_err *err) {
    gguf_writer *w = gguf_writer_create();
    if (!w) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    gguf_writer_set_str(w, "general.architecture", "phi3");
    gguf_writer_set_u32(w, "phi3.context_length", 64);
    gguf_writer_set_u32(w, "phi3.embedding_length", 32);
    gguf_writer_set_u32(w, "phi3.block_count", 1);
    gguf_writer_set_u32(w, "phi3.feed_forward_length", 48);
    gguf_writer_set_u32(w, "phi3.attention.head_count", 4);
    gguf_writer_set_u32(w, "phi3.attention.head_count_kv", 2);
    gguf_writer_set_f32(w, "phi3.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_u32(w, "phi3.rope.dimension_count", 4);
    synth_write_vocab(w, 40);
    static const struct {
        const char *name;
        int64_t ne0, ne1;
    } t[] = {
        {"token_embd.weight", 32, 40},        {"output_norm.weight", 32, 1},
        {"output.weight", 32, 40},            {"rope_factors_long.weight", 2, 1},
        {"rope_factors_short.weight", 2, 1},  {"blk.0.attn_norm.weight", 32, 1},
        {"blk.0.attn_qkv.weight", 32, 64},    {"blk.0.attn_output.weight", 32, 32},
        {"blk.0.ffn_norm.weight", 32, 1},     {"blk.0.ffn_up.weight", 32, 96},
        {"blk.0.ffn_down.weight", 48, 32},
    };
    static float data[32 * 97];
    hl_status st = HL_OK;
    for (size_t i = 0; !st && i < sizeof t / sizeof t[0]; i++) {
        if (skip && strcmp(t[i].name, skip) == 0) continue;
        int64_t ne[2] = {t[i].ne0, t[i].ne1 + (wide && strcmp(t[i].name, wide) == 0)};
        uint32_t x = (uint32_t)i * 2654435761u + 1;
        for (int64_t j = 0; j < ne[0] * ne[1]; j++) {
            x = x * 1103515245u + 12345u;
            float r = (float)((x >> 8) & 0xffff) / 65536.0f - 0.5f; /* [-0.5, 0.5) */
            data[j] = ne[1] == 1 ? 1.0f + 0.5f * r : 0.6f * r;
        }
        if (split && strcmp(t[i].name, "blk.0.attn_qkv.weight") == 0) {
            /* rows [q (32) | k (16) | v (16)] */
            const char *names[3] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                    "blk.0.attn_v.weight"};
            const int64_t rows[3] = {32, 16, 16};
            for (int p = 0, at = 0; !st && p < 3; at += (int)rows[p], p++) {
                if (skip && strcmp(names[p], skip) == 0) continue;
                int64_t pne[2] = {32, rows[p]};
                st = gguf_writer_add_tensor(w, names[p], HL_TYPE_F32, 2, pne, data + at * 32,
                                            sizeof(float) * 32 * (uint64_t)rows[p], err);
            }
            continue;
        }
        st = gguf_writer_add_tensor(w, t[i].name, HL_TYPE_F32, ne[1] == 1 ? 1 : 2, ne, data,
                                    sizeof(float) * (uint64_t)(ne[0] * ne[1]), err);
    }
    if (!st) st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    return st;
}

/* Some phi3-architecture files have separate q/k/v instead of the fused attn_qkv: both
 * give the same logits. */
TEST(arch_phi3_separate_qkv_equals_fused) {
    char path[512];
    hl_err err = {0};
    const int32_t toks[6] = {1, 5, 9, 22, 3, 17};
    float *logits[2] = {NULL, NULL};
    for (int split = 0; split < 2; split++) {
        snprintf(path, sizeof path, "%s/phi3-%d.gguf", test_tmpdir(), split);
        CHECK_OK(write_phi3(path, NULL, NULL, split, &err), &err);
        model *m = NULL;
        model_kv *kv = NULL;
        model_ctx *c = NULL;
        CHECK_OK(model_load(path, NULL, &m, &err), &err);
        CHECK_OK(model_kv_create(m, 16, &kv, &err), &err);
        CHECK_OK(model_ctx_create(m, 1, 0, &c, &err), &err);
        logits[split] = malloc(sizeof(float) * 6 * 40);
        CHECK_OK(model_eval(c, kv, toks, 6, logits[split], &err), &err);
        model_ctx_free(c);
        model_kv_free(kv);
        model_free(m);
    }
    double d = max_diff(logits[0], logits[1], 6 * 40), spread = 0;
    for (int i = 1; i < 6 * 40; i++) spread = fmax(spread, fabs(logits[0][i] - logits[0][0]));
    free(logits[0]);
    free(logits[1]);
    CHECK_MSG(spread > 1e-2, "degenerate logits (spread %g)", spread);
    CHECK_NEAR(d, 0, 1e-5);
}

TEST(arch_phi3_load_errors_name_the_tensor) {
    char path[512];
    snprintf(path, sizeof path, "%s/phi3-bad.gguf", test_tmpdir());
    hl_err err = {0};
    model *m = NULL;
    /* the well-formed file loads (so each error below is the one change's) */
    CHECK_OK(write_phi3(path, NULL, NULL, false, &err), &err);
    CHECK_OK(model_load(path, NULL, &m, &err), &err);
    CHECK_STR(model_get_hparams(m)->arch, "phi3");
    model_free(m);
    m = NULL;
    const struct {
        const char *skip, *wide, *want;
    } cases[] = {
        {"blk.0.attn_qkv.weight", NULL, "missing tensor 'blk.0.attn_qkv.weight'"},
        {"blk.0.ffn_up.weight", NULL, "missing tensor 'blk.0.ffn_up.weight'"},
        {NULL, "blk.0.attn_qkv.weight",
         "tensor 'blk.0.attn_qkv.weight' has shape [32, 65], expected [32, 64]"},
        {NULL, "blk.0.ffn_up.weight",
         "tensor 'blk.0.ffn_up.weight' has shape [32, 97], expected [32, 96]"},
        {NULL, "rope_factors_long.weight",
         "tensor 'rope_factors_long.weight' has shape [2, 2], expected [2]"},
    };
    /* with separate q/k/v, one missing */
    CHECK_OK(write_phi3(path, "blk.0.attn_v.weight", NULL, true, &err), &err);
    CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "missing tensor 'blk.0.attn_qkv.weight'"), "%s", err.msg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(write_phi3(path, cases[i].skip, cases[i].wide, false, &err), &err);
        CHECK_EQ_INT(model_load(path, NULL, &m, &err), HL_ERR_FORMAT);
        CHECK(m == NULL);
        CHECK_MSG(strstr(err.msg, cases[i].want), "case %zu: want \"%s\" in \"%s\"", i,
                  cases[i].want, err.msg);
    }
}
