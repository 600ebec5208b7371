/* arch_recurrent.c - checks for recurrent and hybrid architectures (arch_recurrent.h). */
#include "arch_recurrent.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

model *arch_case_model(const char *case_name, int32_t *prompt, int32_t *n_prompt,
                       int32_t *greedy, int32_t *n_greedy) {
    char rel[256];
    snprintf(rel, sizeof rel, "testdata/arch/%s.json", case_name);
    const char *jp = test_shared_path(rel);
    if (!jp) return NULL;
    json_t *root = json_load_file(jp, 0, NULL);
    if (!root) return NULL;
    json_t *p = json_object_get(root, "prompt_ids"), *g = json_object_get(root, "greedy_ids");
    *n_prompt = *n_greedy = 0;
    for (size_t i = 0; i < json_array_size(p) && i < 128; i++)
        prompt[(*n_prompt)++] = (int32_t)json_integer_value(json_array_get(p, i));
    for (size_t i = 0; i < json_array_size(g) && i < 64; i++)
        greedy[(*n_greedy)++] = (int32_t)json_integer_value(json_array_get(g, i));
    json_decref(root);
    snprintf(rel, sizeof rel, "%s.gguf", case_name);
    return arch_load_file(rel);
}

/* Evaluates toks[0..n) into kv in pieces of `step` tokens, logits of every position. */
static hl_status eval_in_steps(model_ctx *c, model_kv *kv, const int32_t *toks, int n, int step,
                               float *logits, int32_t V, hl_err *err) {
    for (int i = 0; i < n; i += step) {
        const int k = n - i < step ? n - i : step;
        hl_status st = model_eval(c, kv, toks + i, k, logits + (size_t)i * V, err);
        if (st) return st;
    }
    return HL_OK;
}

void arch_recurrent_batch_check(const char *case_name, double logit_tol) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_model(case_name, prompt, &n_prompt, greedy, &n_greedy);
    if (!m) SKIP("testdata/arch case not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    const size_t S = model_state_floats(m);
    enum { N = ARCH_RECURRENT_N };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = i < n_prompt ? prompt[i] : (i * 97 + 13) % V;
    float *lg[3];
    model_kv *kv[3] = {NULL, NULL, NULL};
    model_ctx *c = NULL;
    hl_err err = {0};
    const int steps[3] = {N, 7, 1};
    CHECK_MSG(S > 0, "%s keeps no recurrent state", case_name);
    CHECK_OK(model_ctx_create(m, 2, N, &c, &err), &err);
    for (int r = 0; r < 3; r++) {
        lg[r] = malloc(sizeof(float) * (size_t)V * N);
        CHECK_OK(model_kv_create(m, N, &kv[r], &err), &err);
        CHECK_OK(eval_in_steps(c, kv[r], toks, N, steps[r], lg[r], V, &err), &err);
    }
    double d = 0, mx = 0, smax = 0;
    for (int r = 1; r < 3; r++) {
        for (size_t i = 0; i < (size_t)V * N; i++) d = fmax(d, fabs(lg[0][i] - lg[r][i]));
        CHECK_MSG(memcmp(model_kv_state(kv[0]), model_kv_state(kv[r]), S * sizeof(float)) == 0,
                  "%s: the state after %d tokens in steps of %d differs from one batch's",
                  case_name, N, steps[r]);
    }
    for (size_t i = 0; i < (size_t)V * N; i++) mx = fmax(mx, fabs(lg[0][i]));
    for (size_t i = 0; i < S; i++) smax = fmax(smax, fabs(model_kv_state(kv[0])[i]));
    fprintf(stderr, "    %s, %d tokens: max |logit diff| %.3g (|logit| <= %.3g), |state| <= %.3g\n",
            case_name, N, d, mx, smax);
    CHECK_MSG(mx > 0.1 && smax > 0.01, "%s: degenerate logits or state", case_name);
    CHECK_NEAR(d, 0, logit_tol);
    for (int r = 0; r < 3; r++) {
        free(lg[r]);
        model_kv_free(kv[r]);
    }
    model_ctx_free(c);
    model_free(m);
}

static runner *new_runner(model *m) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = (size_t)64 << 20, .n_parallel = 2,
                         .batch_tokens = 32};
    runner *r = NULL;
    return runner_create(m, &cfg, &r, NULL) == HL_OK ? r : NULL;
}

void arch_recurrent_runner_check(const char *case_name) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_model(case_name, prompt, &n_prompt, greedy, &n_greedy);
    if (!m) SKIP("testdata/arch case not found (HEARTH_SHARED)");
    CHECK(n_greedy >= 16);
    int32_t conv[200];
    int n = 0;
    for (int i = 0; i < n_prompt; i++) conv[n++] = prompt[i];
    runner *warm = new_runner(m), *fresh = new_runner(m);
    CHECK(warm && fresh);
    collect c1, c2, cold;
    runner_stats s1, s2, s3;
    CHECK_OK(runner_greedy(warm, conv, n, 16, &c1, &s1), NULL);
    CHECK_EQ_INT(c1.n, 16);
    for (int i = 0; i < 16; i++)
        CHECK_MSG(c1.toks[i] == greedy[i], "%s: greedy token %d is %d, golden %d", case_name, i,
                  c1.toks[i], greedy[i]);
    for (int i = 0; i < c1.n; i++) conv[n++] = c1.toks[i];
    for (int i = 0; i < 10; i++) conv[n++] = 100 + i;
    CHECK_OK(runner_greedy(warm, conv, n, 12, &c2, &s2), NULL);
    CHECK_MSG(s2.cached_tokens > 0, "%s: cached %d of %d", case_name, (int)s2.cached_tokens, n);
    CHECK_OK(runner_greedy(fresh, conv, n, 12, &cold, &s3), NULL);
    CHECK_EQ_INT(s3.cached_tokens, 0);
    CHECK_EQ_INT(cold.n, c2.n);
    for (int i = 0; i < cold.n; i++)
        CHECK_MSG(c2.toks[i] == cold.toks[i], "%s: token %d after the cache hit is %d, cold %d",
                  case_name, i, c2.toks[i], cold.toks[i]);
    fprintf(stderr, "    %s: continued conversation of %d tokens, %d from the cache\n", case_name,
            n, (int)s2.cached_tokens);
    runner_destroy(warm);
    runner_destroy(fresh);
    model_free(m);
}

model *arch_load_file(const char *file) {
    char rel[256];
    snprintf(rel, sizeof rel, "testdata/arch/%s", file);
    const char *p = test_shared_path(rel);
    model *m = NULL;
    if (p && model_load(p, NULL, &m, NULL) != HL_OK) m = NULL;
    return m;
}

void arch_steps_check(model *m, const int32_t *toks, int n, int n_ctx, const int *steps,
                      int n_steps, double tol) {
    const int32_t V = model_get_hparams(m)->n_vocab;
    const size_t nl = (size_t)V * (size_t)n;
    float *batch = malloc(sizeof(float) * nl), *lg = malloc(sizeof(float) * nl);
    model_ctx *c = NULL;
    model_kv *kv = NULL;
    hl_err err = {0};
    CHECK(batch && lg);
    CHECK_OK(model_ctx_create(m, 2, n_ctx, &c, &err), &err);
    CHECK_OK(model_kv_create(m, n_ctx, &kv, &err), &err);
    CHECK_OK(model_eval(c, kv, toks, n, batch, &err), &err);
    double mx = 0;
    for (size_t i = 0; i < nl; i++) mx = fmax(mx, fabs(batch[i]));
    CHECK_MSG(mx > 0.1, "degenerate logits");
    for (int k = 0; k < n_steps; k++) {
        model_kv_free(kv);
        kv = NULL;
        CHECK_OK(model_kv_create(m, n_ctx, &kv, &err), &err);
        CHECK_OK(eval_in_steps(c, kv, toks, n, steps[k], lg, V, &err), &err);
        double d = 0;
        for (size_t i = 0; i < nl; i++) d = fmax(d, fabs(batch[i] - lg[i]));
        fprintf(stderr, "    %d tokens in steps of %d: max |logit diff| %.3g (|logit| <= %.3g)\n",
                n, steps[k], d, mx);
        CHECK_NEAR(d, 0, tol);
    }
    free(batch);
    free(lg);
    model_kv_free(kv);
    model_ctx_free(c);
}

static int32_t argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t v = 1; v < n; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

void arch_runner_eval_check(model *m, const int32_t *prompt, int n) {
    const int32_t V = model_get_hparams(m)->n_vocab;
    runner *r = new_runner(m);
    CHECK(r && n <= 48);
    int32_t conv[96];
    memcpy(conv, prompt, sizeof(int32_t) * (size_t)n);
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
}
