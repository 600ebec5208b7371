/* arch_state.c - state checks of the architecture goldens (see arch_state.h). */
#include "arch_state.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner/runner.h"
#include "runner_greedy.h"
#include "test.h"

model *arch_case_load(const char *case_name, int32_t prompt[128], int32_t *n_prompt,
                      int32_t greedy[64], int32_t *n_greedy) {
    char rel[256], gp[1024];
    *n_prompt = *n_greedy = 0;
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", case_name);
    const char *p = test_shared_path(rel);
    if (!p) return NULL;
    snprintf(gp, sizeof gp, "%s", p);
    snprintf(rel, sizeof rel, "testdata/arch/%s.json", case_name);
    const char *jp = test_shared_path(rel);
    json_t *root = jp ? json_load_file(jp, 0, NULL) : NULL;
    if (!root) return NULL;
    json_t *pi = json_object_get(root, "prompt_ids"), *gi = json_object_get(root, "greedy_ids");
    for (size_t i = 0; i < json_array_size(pi) && i < 128; i++)
        prompt[(*n_prompt)++] = (int32_t)json_integer_value(json_array_get(pi, i));
    for (size_t i = 0; i < json_array_size(gi) && i < 64; i++)
        greedy[(*n_greedy)++] = (int32_t)json_integer_value(json_array_get(gi, i));
    json_decref(root);
    model *m = NULL;
    if (model_load(gp, NULL, &m, NULL) != HL_OK) return NULL;
    return m;
}

static void skip_absent(const char *case_name) {
    static char why[256];
    snprintf(why, sizeof why, "testdata/arch/%s.{gguf,json} not found (HEARTH_SHARED)",
             case_name);
    test_skip(why);
}

#define N_AFTER 8

/* The check without the test harness: a message on failure, "" on success. */
static void state_check(model *m, const int32_t *prompt, int32_t n_prompt,
                        const int32_t *greedy, int32_t n_greedy, char *msg, size_t cap) {
    const int32_t V = model_get_hparams(m)->n_vocab;
    const size_t S = model_state_floats(m);
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    float *saved = malloc((S ? S : 1) * sizeof(float));
    float *first = malloc(sizeof(float) * (size_t)V * N_AFTER);
    msg[0] = 0;
    if (n_greedy < N_AFTER + 1 || S == 0) {
        snprintf(msg, cap, "the case has %d greedy ids and %zu state floats", n_greedy, S);
        goto out;
    }
    if (model_ctx_create(m, 1, 256, &c, NULL) || model_kv_create(m, 256, &a, NULL) ||
        model_kv_create(m, 256, &b, NULL) || !saved || !first ||
        model_eval(c, a, prompt, n_prompt, NULL, NULL)) {
        snprintf(msg, cap, "setup or the prompt's eval failed");
        goto out;
    }
    memcpy(saved, model_kv_state(a), S * sizeof(float));
    for (int i = 0; i < N_AFTER; i++) {
        if (model_eval(c, a, &greedy[i], 1, NULL, NULL)) {
            snprintf(msg, cap, "eval of greedy token %d failed", i);
            goto out;
        }
        memcpy(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V);
    }
    if (memcmp(saved, model_kv_state(a), S * sizeof(float)) == 0) {
        snprintf(msg, cap, "8 more tokens left the state unchanged");
        goto out;
    }
    if (model_eval(c, b, prompt, n_prompt, NULL, NULL)) {
        snprintf(msg, cap, "the second prompt eval failed");
        goto out;
    }
    memcpy(model_kv_state(b), model_kv_state(a), S * sizeof(float)); /* a later state */
    memcpy(model_kv_state(b), saved, S * sizeof(float));
    for (int i = 0; i < N_AFTER; i++) {
        if (model_eval(c, b, &greedy[i], 1, NULL, NULL) ||
            memcmp(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V) != 0) {
            snprintf(msg, cap, "token %d after the restore differs", i);
            goto out;
        }
    }
    for (int i = 0; i < N_AFTER; i++) { /* the golden's tokens follow from the logits */
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (first[(size_t)i * V + v] > first[(size_t)i * V + best]) best = v;
        if (best != greedy[i + 1]) {
            snprintf(msg, cap, "after greedy token %d: argmax %d, golden %d", i, best,
                     greedy[i + 1]);
            goto out;
        }
    }
out:
    free(saved);
    free(first);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
}

void arch_state_check_at(const char *case_name, const char *file, int line) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_load(case_name, prompt, &n_prompt, greedy, &n_greedy);
    if (!m) {
        skip_absent(case_name);
        return;
    }
    char msg[256];
    state_check(m, prompt, n_prompt, greedy, n_greedy, msg, sizeof msg);
    if (msg[0]) test_fail_at(file, line, "%s state check: %s", case_name, msg);
    else fprintf(stderr, "    %s: state of %zu floats restored, 8 tokens bitwise equal\n",
                 case_name, model_state_floats(m));
    model_free(m);
}

static runner *new_runner(model *m) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = (size_t)64 << 20, .n_parallel = 2,
                         .batch_tokens = 32};
    runner *r = NULL;
    return runner_create(m, &cfg, &r, NULL) == HL_OK ? r : NULL;
}

static void runner_check(model *m, const int32_t *prompt, int32_t n_prompt,
                         const int32_t *greedy, int32_t n_greedy, char *msg, size_t cap) {
    int32_t conv[200];
    int n = 0;
    msg[0] = 0;
    for (int i = 0; i < n_prompt && n < 128; i++) conv[n++] = prompt[i];
    runner *warm = new_runner(m), *fresh = new_runner(m);
    collect c1, c2, cold;
    runner_stats s1, s2, s3;
    if (!warm || !fresh || n_greedy < 16) {
        snprintf(msg, cap, "runner setup failed or fewer than 16 greedy ids");
    } else if (runner_greedy(warm, conv, n, 16, &c1, &s1) || c1.n != 16) {
        snprintf(msg, cap, "the prompt's generation failed");
    } else {
        for (int i = 0; i < 16 && !msg[0]; i++)
            if (c1.toks[i] != greedy[i])
                snprintf(msg, cap, "runner token %d is %d, golden %d", i, c1.toks[i], greedy[i]);
        for (int i = 0; i < c1.n; i++) conv[n++] = c1.toks[i];
        for (int i = 0; i < 10; i++) conv[n++] = 100 + i;
        if (msg[0]) {
        } else if (runner_greedy(warm, conv, n, 12, &c2, &s2) ||
                   runner_greedy(fresh, conv, n, 12, &cold, &s3)) {
            snprintf(msg, cap, "the continued conversation failed");
        } else if (s2.cached_tokens < n_prompt || s3.cached_tokens != 0) {
            snprintf(msg, cap, "cached %d of %d tokens (cold run: %d)", (int)s2.cached_tokens, n,
                     (int)s3.cached_tokens);
        } else if (cold.n != c2.n) {
            snprintf(msg, cap, "%d tokens from the cache, %d cold", c2.n, cold.n);
        } else {
            for (int i = 0; i < cold.n && !msg[0]; i++)
                if (c2.toks[i] != cold.toks[i])
                    snprintf(msg, cap, "token %d: %d from the cache, %d cold", i, c2.toks[i],
                             cold.toks[i]);
        }
    }
    runner_destroy(warm);
    runner_destroy(fresh);
}

void arch_runner_continue_check_at(const char *case_name, const char *file, int line) {
    int32_t prompt[128], greedy[64], n_prompt, n_greedy;
    model *m = arch_case_load(case_name, prompt, &n_prompt, greedy, &n_greedy);
    if (!m) {
        skip_absent(case_name);
        return;
    }
    char msg[256];
    runner_check(m, prompt, n_prompt, greedy, n_greedy, msg, sizeof msg);
    if (msg[0]) test_fail_at(file, line, "%s through the runner: %s", case_name, msg);
    model_free(m);
}
