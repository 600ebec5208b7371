/*
 * test_arch_deepseek2.c - deepseek2 (multi-head latent attention, leading dense layers,
 * DeepSeek-routed experts with shared experts) against llama.cpp's goldens
 * (tests/arch_golden.h): the GLM-4.7-Flash-like case in F32 and Q8_0, and expert groups
 * with YaRN. Also: the older file form (one fused kv_b per layer instead of k_b / v_b,
 * full heads cached), made from the golden's weights, passes the same golden; a batch
 * equals its tokens one at a time; the runner (block pool, prefix cache) gives
 * model_eval's tokens; bad router hyperparameters are named; `hearth generate` gives
 * the golden's greedy tokens.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "model/model.h"
#include "model_synth.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

TEST(arch_deepseek2) { arch_golden_check("deepseek2"); }
TEST(arch_deepseek2_q8_0) { arch_golden_check("deepseek2-q8_0"); }
TEST(arch_deepseek2_groups_yarn) { arch_golden_check("deepseek2-groups-yarn"); }

typedef struct variant {
    bool legacy;        /* kv_b instead of k_b / v_b, no *_mla keys */
    int group_count;    /* > 0: expert_group_count */
    int gating;         /* > 0: expert_gating_func */
} variant;

/* Copies case's scalar metadata (not the tokenizer's: a synthetic vocabulary of the same
 * size replaces it) and tensors into a new GGUF at path, changed as v says. */
static hl_status write_variant(const char *case_file, const variant *v, const char *path,
                               hl_err *err) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s", case_file);
    const char *src = test_shared_path(rel);
    if (!src) return hl_fail(err, HL_ERR_IO, "%s not found", rel);
    gguf_file *f = NULL;
    hl_status st = gguf_open(src, &f, err);
    if (st) return st;
    gguf_writer *w = gguf_writer_create();
    int32_t n_head = 0, n_vocab = 0;
    for (int64_t i = 0; !st && i < gguf_n_kv(f); i++) {
        gguf_str k = gguf_kv_key(f, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        if (strncmp(key, "tokenizer.", 10) == 0) continue;
        if (v->legacy && strstr(key, "_mla")) continue;
        const void *p = gguf_kv_scalar(f, i);
        switch (gguf_kv_type(f, i)) {
        case GGUF_TYPE_UINT32: {
            uint32_t u;
            memcpy(&u, p, 4);
            if (strstr(key, ".attention.head_count") && !strstr(key, "_kv")) n_head = (int32_t)u;
            if (strstr(key, ".vocab_size")) n_vocab = (int32_t)u;
            if (v->group_count > 0 && strstr(key, ".expert_group_count"))
                u = (uint32_t)v->group_count;
            if (v->gating > 0 && strstr(key, ".expert_gating_func")) u = (uint32_t)v->gating;
            st = gguf_writer_set_u32(w, key, u);
            break;
        }
        case GGUF_TYPE_FLOAT32: {
            float x;
            memcpy(&x, p, 4);
            st = gguf_writer_set_f32(w, key, x);
            break;
        }
        case GGUF_TYPE_BOOL: st = gguf_writer_set_bool(w, key, *(const uint8_t *)p != 0); break;
        case GGUF_TYPE_STRING: {
            gguf_str s = gguf_kv_str(f, i);
            char *c = strndup(s.ptr, s.len);
            st = c ? gguf_writer_set_str(w, key, c) : HL_ERR_NOMEM;
            free(c);
            break;
        }
        default: break;
        }
    }
    if (v->legacy) { /* the older form caches every head */
        char key[64];
        snprintf(key, sizeof key, "deepseek2.attention.head_count_kv");
        if (!st) st = gguf_writer_set_u32(w, key, (uint32_t)n_head);
    }
    if (!st) synth_write_vocab(w, n_vocab);
    for (int64_t i = 0; !st && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        char *kb = strstr(name, "attn_k_b"), *vb = strstr(name, "attn_v_b");
        if (v->legacy && vb) continue;
        if (!(v->legacy && kb)) {
            st = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes,
                                        err);
            continue;
        }
        /* kv_b {R, H * (nope + v)}: per head W_k = k_b_h^T (nope rows), then W_v = v_b_h */
        char vname[128];
        snprintf(vname, sizeof vname, "%.*sattn_v_b.weight", (int)(kb - name), name);
        const gguf_tensor *tv = gguf_find_tensor(f, vname);
        if (!tv || t->type != HL_TYPE_F32 || tv->type != HL_TYPE_F32) {
            st = hl_fail(err, HL_ERR_FORMAT, "need f32 k_b and v_b");
            break;
        }
        const int64_t nope = t->ne[0], R = t->ne[1], H = t->ne[2], vd = tv->ne[1];
        float *kvb = malloc(sizeof(float) * (size_t)(R * H * (nope + vd)));
        const float *K = t->data, *V = tv->data;
        for (int64_t h = 0; h < H; h++) {
            float *o = kvb + h * (nope + vd) * R;
            for (int64_t i2 = 0; i2 < nope; i2++)
                for (int64_t j = 0; j < R; j++) o[i2 * R + j] = K[(h * R + j) * nope + i2];
            memcpy(o + nope * R, V + h * vd * R, sizeof(float) * (size_t)(vd * R));
        }
        const int64_t ne[2] = {R, H * (nope + vd)};
        snprintf(vname, sizeof vname, "%.*sattn_kv_b.weight", (int)(kb - name), name);
        st = gguf_writer_add_tensor(w, vname, HL_TYPE_F32, 2, ne, kvb,
                                    sizeof(float) * (uint64_t)(R * H * (nope + vd)), err);
        free(kvb);
    }
    if (!st) st = gguf_writer_write_file(w, path, err);
    gguf_writer_destroy(w);
    gguf_close(f);
    return st;
}

/* The older form (kv_b; full K and V heads in the cache, no absorption) computes the same
 * function: llama.cpp's golden for the absorbed file holds for it too. */
TEST(arch_deepseek2_kv_b_form_passes_the_golden) {
    const char *json = test_shared_path("testdata/arch/deepseek2-groups-yarn.json");
    if (!json) SKIP("testdata/arch/deepseek2-groups-yarn.json not found (HEARTH_SHARED)");
    char json_path[512], path[512];
    snprintf(json_path, sizeof json_path, "%s", json);
    snprintf(path, sizeof path, "%s/ds2-kv_b.gguf", test_tmpdir());
    hl_err err = {0};
    const variant v = {.legacy = true};
    CHECK_OK(write_variant("deepseek2-groups-yarn.gguf", &v, path, &err), &err);
    model *m = NULL;
    CHECK_OK(model_load(path, NULL, &m, &err), &err);
    /* full heads: 4 KV heads of 48 / 32 per layer, not the latent's 1 of 48 / 32 */
    const kv_geom *g = model_kv_geom(m);
    CHECK_EQ_INT(g->dims[0].n_head_kv, 4);
    model_free(m);
    char msg[2048];
    const bool ok = arch_golden_run(path, json_path, NULL, 2, msg, sizeof msg);
    fprintf(stderr, "    kv_b form: %s\n", msg);
    CHECK_MSG(ok, "%s", msg);
}

TEST(arch_deepseek2_bad_router_hparams_are_named) {
    if (!test_shared_path("testdata/arch/deepseek2-groups-yarn.gguf"))
        SKIP("testdata/arch/deepseek2-groups-yarn.gguf not found (HEARTH_SHARED)");
    char path[512];
    snprintf(path, sizeof path, "%s/ds2-bad.gguf", test_tmpdir());
    const struct {
        variant v;
        const char *want;
    } cases[] = {
        {{.group_count = 3}, "expert_group_count 3"},
        {{.gating = 3}, "expert_gating_func 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hl_err err = {0};
        CHECK_OK(write_variant("deepseek2-groups-yarn.gguf", &cases[i].v, path, &err), &err);
        model *m = NULL;
        CHECK_MSG(model_load(path, NULL, &m, &err) != HL_OK, "case %zu loaded", i);
        CHECK(m == NULL);
        CHECK_MSG(strstr(err.msg, cases[i].want), "case %zu: want \"%s\" in \"%s\"", i,
                  cases[i].want, err.msg);
    }
}

static model *load_case(const char *file) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s", file);
    const char *p = test_shared_path(rel);
    model *m = NULL;
    if (p && model_load(p, NULL, &m, NULL) != HL_OK) m = NULL;
    return m;
}

static int32_t argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

#define N_TOK 48

/* One batch (tokens grouped by expert, every head's absorbed query in one matmul per
 * head) against the same tokens one at a time: every position's logits within 1e-4. */
TEST(arch_deepseek2_batch_equals_token_by_token) {
    model *m = load_case("deepseek2-groups-yarn.gguf");
    if (!m) SKIP("testdata/arch/deepseek2-groups-yarn.gguf not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 97 + 13) % V;
    float *batch = malloc(sizeof(float) * (size_t)V * N_TOK);
    float *step = malloc(sizeof(float) * (size_t)V * N_TOK);
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    CHECK_OK(model_ctx_create(m, 2, N_TOK, &c, NULL), NULL);
    CHECK_OK(model_kv_create(m, 64, &a, NULL), NULL);
    CHECK_OK(model_kv_create(m, 64, &b, NULL), NULL);
    CHECK_OK(model_eval(c, a, toks, N_TOK, batch, NULL), NULL);
    for (int i = 0; i < N_TOK; i++)
        CHECK_OK(model_eval(c, b, &toks[i], 1, step + (size_t)i * V, NULL), NULL);
    double d = 0, mx = 0;
    for (size_t i = 0; i < (size_t)V * N_TOK; i++) {
        d = fmax(d, fabs(batch[i] - step[i]));
        mx = fmax(mx, fabs(batch[i]));
    }
    fprintf(stderr, "    %d tokens: max |logit diff| %.3g (|logit| <= %.3g)\n", N_TOK, d, mx);
    CHECK_MSG(mx > 0.1, "degenerate logits");
    CHECK_NEAR(d, 0, 1e-4);
    free(batch);
    free(step);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
    model_free(m);
}

/* Through the runner (the server's path: block pool with the latent's K and V rows of
 * different widths, prefix cache): a conversation continued from the cache gives the
 * greedy tokens of model_eval. */
TEST(arch_deepseek2_runner_greedy_matches_model_eval) {
    model *m = load_case("deepseek2.gguf");
    if (!m) SKIP("testdata/arch/deepseek2.gguf not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = (size_t)64 << 20, .n_parallel = 2,
                         .batch_tokens = 32};
    runner *r = NULL;
    CHECK_OK(runner_create(m, &cfg, &r, NULL), NULL);
    int32_t conv[96];
    int n = 0;
    for (int i = 0; i < 24; i++) conv[n++] = 3 + (i * 131 + 7) % (V - 3);
    collect c1, c2;
    runner_stats s1, s2;
    CHECK_OK(runner_greedy(r, conv, n, 12, &c1, &s1), NULL);
    CHECK_EQ_INT(c1.n, 12);
    for (int i = 0; i < c1.n; i++) conv[n++] = c1.toks[i];
    for (int i = 0; i < 6; i++) conv[n++] = 40 + i;
    CHECK_OK(runner_greedy(r, conv, n, 12, &c2, &s2), NULL);
    CHECK_MSG(s2.cached_tokens >= 30, "cached %d of %d", (int)s2.cached_tokens, n);
    CHECK_EQ_INT(c2.n, 12);
    model_ctx *ctx;
    model_kv *kv;
    CHECK_OK(model_ctx_create(m, 1, 64, &ctx, NULL), NULL);
    CHECK_OK(model_kv_create(m, 96, &kv, NULL), NULL);
    CHECK_OK(model_eval(ctx, kv, conv, n, NULL, NULL), NULL);
    for (int i = 0; i < c2.n; i++) {
        int32_t best = argmax(model_ctx_logits(ctx), V);
        CHECK_EQ_INT(best, c2.toks[i]);
        CHECK_OK(model_eval(ctx, kv, &best, 1, NULL, NULL), NULL);
    }
    model_kv_free(kv);
    model_ctx_free(ctx);
    runner_destroy(r);
    model_free(m);
}

/* From the CLI (`hearth generate`, the default f16 KV cache): the golden prompt's greedy
 * continuation is llama.cpp's. */
TEST(arch_deepseek2_cli_generate_gives_the_golden_tokens) {
    const char *bin = getenv("HEARTH_BIN");
    const char *gp = test_shared_path("testdata/arch/deepseek2.gguf");
    const char *jp = test_shared_path("testdata/arch/deepseek2.json");
    if (!bin || !gp || !jp) SKIP("HEARTH_BIN or testdata/arch/deepseek2.* missing");
    json_error_t je;
    json_t *root = json_load_file(jp, 0, &je);
    CHECK_MSG(root, "%s: %s", jp, je.text);
    json_t *prompt = json_object_get(root, "prompt_ids");
    json_t *greedy = json_object_get(root, "greedy_ids");
    CHECK(json_array_size(prompt) > 0 && json_array_size(greedy) >= 8);
    char cmd[4096];
    size_t o = (size_t)snprintf(cmd, sizeof cmd, "%s generate -m %s -n 8 --temp 0 --top-logits 1 "
                                "-t 1 --prompt-ids ", bin, gp);
    for (size_t i = 0; i < json_array_size(prompt) && o < sizeof cmd; i++)
        o += (size_t)snprintf(cmd + o, sizeof cmd - o, "%s%lld", i ? "," : "",
                              (long long)json_integer_value(json_array_get(prompt, i)));
    CHECK(o < sizeof cmd - 16);
    snprintf(cmd + o, sizeof cmd - o, " 2>/dev/null");
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    char line[1024];
    int n_gen = 0, n_bad = 0;
    const int n_prompt = (int)json_array_size(prompt);
    while (fgets(line, sizeof line, p)) {
        json_t *l = json_loads(line, 0, &je);
        const int pos = (int)json_integer_value(json_object_get(l, "pos"));
        if (l && pos >= n_prompt) {
            const json_int_t want =
                json_integer_value(json_array_get(greedy, (size_t)(pos - n_prompt)));
            if (json_integer_value(json_object_get(l, "token")) != want && n_bad++ == 0)
                fprintf(stderr, "    pos %d: %s    want token %lld\n", pos, line, (long long)want);
            n_gen++;
        }
        json_decref(l);
    }
    CHECK_EQ_INT(pclose(p), 0);
    json_decref(root);
    CHECK_EQ_INT(n_gen, 8);
    CHECK_EQ_INT(n_bad, 0);
}
