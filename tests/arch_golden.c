/* arch_golden.c - the architecture-golden checker (see arch_golden.h). */
#include "arch_golden.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test.h"

/*
 * Tolerances. The README of the goldens states what an engine should reach; the numbers
 * below follow it, widened by what the JSON measures about llama.cpp itself:
 *
 * F32 weights: llama.cpp against itself (one token at a time vs one batch) differs by the
 *   noise floor, ~1e-5 for most cases but up to 3e-3 for gemma4. An f32 engine differs
 *   from llama.cpp only in summation order, i.e. by about that much, so top-1 must agree
 *   wherever the margin exceeds 1e-3 (README) or twice the noise floor (a margin moves by
 *   at most the error of two logits), and logits must be within 5e-3 ("a few 1e-3") or
 *   twice the noise floor. A wrong norm, RoPE or softcap moves logits by 1e-1 and more.
 * F16 weights: llama.cpp rounds the activations to f16 before those matmuls; an engine
 *   that does not differs by ~1e-2 (README; dequant_f32_reference measures 7e-3..9e-3).
 *   Error budget e = max(1e-2, noise floor, measured dequant difference); logits within
 *   5e and top-1 where the margin exceeds 5e: 0.05 in practice.
 * Q8_0 / MXFP4 weights: llama.cpp quantises the activations to Q8_0 blocks; an engine
 *   with other activation rounding differs by 0.2 logits and more (dequant_f32_reference
 *   measures 0.13..0.23; MoE routing flips give several logits). Per-logit checks would be
 *   either loose to meaninglessness or flaky, so there are none: e = max(0.2, measured),
 *   top-1 must agree where the margin exceeds 5e (1.0 in practice). The logits themselves
 *   are checked on the F32 file of the same case.
 * Embeddings (unit vectors): 1 - cos = |a - b|^2 / 2. F32: 1 - cos < 1e-4 allows a
 *   per-component error of ~1e-3 over 64 dims, far above f32 noise (~1e-6) and far below
 *   a pooling or norm mistake. F16 (measured max |diff| 2e-4: 1 - cos ~1e-6) gets 1e-3;
 *   Q8_0 (measured 5e-3: 1 - cos up to ~1e-3) gets 1e-2.
 */
static double dmax(double a, double b) { return a > b ? a : b; }

typedef enum { WT_F32, WT_F16, WT_QUANT } weight_kind;

static weight_kind weight_kind_of(const char *w) {
    if (!w) return WT_F32;
    char low[16] = {0};
    for (size_t i = 0; i + 1 < sizeof low && w[i]; i++) low[i] = (char)tolower((unsigned char)w[i]);
    if (strncmp(low, "f16", 3) == 0 || strncmp(low, "bf16", 4) == 0) return WT_F16;
    if (low[0] == 'q' || strncmp(low, "mxfp4", 5) == 0) return WT_QUANT;
    return WT_F32;
}

arch_golden_tol arch_golden_tol_for(const char *weights, double noise_floor, double dequant_diff) {
    arch_golden_tol t;
    switch (weight_kind_of(weights)) {
    case WT_F16: {
        double e = dmax(1e-2, dmax(noise_floor, dequant_diff));
        t = (arch_golden_tol){.logit = 5 * e, .margin = 5 * e, .cos_min = 0.999};
        break;
    }
    case WT_QUANT: {
        double e = dmax(0.2, dequant_diff);
        t = (arch_golden_tol){.logit = 0, .margin = 5 * e, .cos_min = 0.99};
        break;
    }
    default:
        t = (arch_golden_tol){.logit = dmax(5e-3, 2 * noise_floor),
                              .margin = dmax(1e-3, 2 * noise_floor),
                              .cos_min = 0.9999};
    }
    return t;
}

/* ---- JSON helpers ---- */

static double num_at(json_t *o, const char *a, const char *b) {
    json_t *x = json_object_get(o, a);
    if (x && b) x = json_object_get(x, b);
    return json_is_number(x) ? json_number_value(x) : 0.0;
}

/* llama.cpp's own batched vs one-token difference, whichever way the JSON names it. */
static double noise_floor_of(json_t *root) {
    double n = num_at(root, "noise_floor", "prompt_one_by_one_vs_batch_max_abs");
    n = dmax(n, num_at(root, "noise_floor", "greedy_incremental_vs_one_batch_max_abs"));
    n = dmax(n, num_at(root, "noise", "max_abs_diff_one_token_at_a_time_vs_batch"));
    return n;
}

static double dequant_diff_of(json_t *root) {
    double d = num_at(root, "dequant_f32_reference", "prompt_max_abs_logit_diff_vs_stock");
    return dmax(d, num_at(root, "dequant_f32_reference",
                          "greedy_max_abs_logit_diff_vs_stock_while_tokens_agree"));
}

/* An array of integer ids; false (with *n = 0) when it is not one. */
static bool ids_of(json_t *a, int32_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(a) || json_array_size(a) == 0) return false;
    size_t k = json_array_size(a);
    int32_t *ids = malloc(k * sizeof *ids);
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) > INT32_MAX) {
            free(ids);
            return false;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    *out = ids;
    *n = k;
    return true;
}

/* One top-10 list: [[id, logit], ...] best first, at least 2 entries. */
typedef struct top_list {
    int n;
    int32_t id[16];
    double logit[16];
} top_list;

static bool top_of(json_t *a, top_list *t) {
    t->n = 0;
    if (!json_is_array(a) || json_array_size(a) < 2) return false;
    for (size_t i = 0; i < json_array_size(a) && t->n < 16; i++) {
        json_t *p = json_array_get(a, i);
        json_t *id = json_array_get(p, 0), *lg = json_array_get(p, 1);
        if (!json_is_integer(id) || !json_is_number(lg)) return false;
        t->id[t->n] = (int32_t)json_integer_value(id);
        t->logit[t->n] = json_number_value(lg);
        t->n++;
    }
    return true;
}

/* ---- the report ---- */

typedef struct report {
    int n_bad;
    char first[768];
} report;

__attribute__((format(printf, 2, 3))) static void bad(report *r, const char *fmt, ...) {
    if (r->n_bad++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof r->first, fmt, ap);
        va_end(ap);
    }
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Checks one distribution against its golden top list. where: "prompt position 5". */
static void check_dist(report *r, const char *where, const float *logits, int32_t n_vocab,
                       const top_list *g, const arch_golden_tol *tol, double *max_diff) {
    double margin = g->logit[0] - g->logit[1];
    int32_t top = argmax(logits, n_vocab);
    if (margin > tol->margin && top != g->id[0])
        bad(r,
            "%s: top-1 is %d (logit %.6g), golden %d (golden logit %.6g, ours %.6g); golden "
            "margin %.4g > %.4g",
            where, top, (double)logits[top], g->id[0], g->logit[0],
            g->id[0] >= 0 && g->id[0] < n_vocab ? (double)logits[g->id[0]] : NAN, margin,
            tol->margin);
    for (int k = 0; k < g->n; k++) {
        int32_t id = g->id[k];
        if (id < 0 || id >= n_vocab) {
            bad(r, "%s: golden id %d is outside the vocabulary (%d)", where, id, n_vocab);
            return;
        }
        double d = fabs((double)logits[id] - g->logit[k]);
        if (d > *max_diff) *max_diff = d;
        if (tol->logit > 0 && !(d <= tol->logit))
            bad(r, "%s: logit of %d (golden rank %d) is %.6g, golden %.6g: |diff| %.4g > %.4g",
                where, id, k + 1, (double)logits[id], g->logit[k], d, tol->logit);
    }
}

typedef struct run_state {
    model *m;
    model_ctx *c;
    model_kv *kv;
    float *all;
    int32_t *ids;
    json_t *root;
} run_state;

static void run_free(run_state *s) {
    model_ctx_free(s->c);
    model_kv_free(s->kv);
    model_free(s->m);
    free(s->all);
    free(s->ids);
    json_decref(s->root);
}

static void check_causal(run_state *s, report *r, const arch_golden_tol *tol, int n_threads,
                         char *summary, size_t cap) {
    hl_err err = {0};
    json_t *root = s->root;
    size_t n_prompt, n_greedy;
    int32_t *greedy;
    json_t *ptop = json_object_get(root, "prompt_top10");
    json_t *gtop = json_object_get(root, "greedy_top10");
    if (!ids_of(json_object_get(root, "prompt_ids"), &s->ids, &n_prompt) ||
        !json_is_array(ptop) || json_array_size(ptop) != n_prompt) {
        bad(r, "golden: prompt_ids / prompt_top10 missing or of different lengths");
        return;
    }
    if (!ids_of(json_object_get(root, "greedy_ids"), &greedy, &n_greedy) ||
        !json_is_array(gtop) || json_array_size(gtop) != n_greedy) {
        free(greedy);
        bad(r, "golden: greedy_ids / greedy_top10 missing or of different lengths");
        return;
    }
    const int32_t V = model_get_hparams(s->m)->n_vocab;
    if (model_kv_create(s->m, (int32_t)(n_prompt + n_greedy), &s->kv, &err) ||
        model_ctx_create(s->m, n_threads, 0, &s->c, &err)) {
        free(greedy);
        bad(r, "setup: %s", err.msg);
        return;
    }
    /* the per-sequence context llama.cpp ran with (phi3 longrope chooses by it) */
    const double n_ctx_seq = num_at(root, "harness", "n_ctx_seq");
    if (n_ctx_seq > 0) model_ctx_set_n_ctx(s->c, (int32_t)n_ctx_seq);
    s->all = malloc(n_prompt * (size_t)V * sizeof(float));
    if (model_eval(s->c, s->kv, s->ids, (int32_t)n_prompt, s->all, &err)) {
        free(greedy);
        bad(r, "model_eval of the %zu-token prompt: %s", n_prompt, err.msg);
        return;
    }
    double max_diff = 0;
    int n_checked_top1 = 0;
    for (size_t i = 0; i < n_prompt; i++) {
        top_list g;
        if (!top_of(json_array_get(ptop, i), &g)) {
            bad(r, "golden: prompt_top10[%zu] is not a list of [id, logit]", i);
            break;
        }
        char where[64];
        snprintf(where, sizeof where, "prompt position %zu (token %d)", i, s->ids[i]);
        check_dist(r, where, s->all + i * (size_t)V, V, &g, tol, &max_diff);
        n_checked_top1 += g.logit[0] - g.logit[1] > tol->margin;
    }
    /* greedy, one token at a time from the last prompt position's logits */
    const float *logits = s->all + (n_prompt - 1) * (size_t)V;
    size_t k = 0;
    const char *stop = "all agree";
    for (; k < n_greedy; k++) {
        top_list g;
        if (!top_of(json_array_get(gtop, k), &g)) {
            bad(r, "golden: greedy_top10[%zu] is not a list of [id, logit]", k);
            break;
        }
        char where[96];
        snprintf(where, sizeof where, "greedy step %zu (position %zu)", k, n_prompt - 1 + k);
        int32_t tok = argmax(logits, V);
        double margin = g.logit[0] - g.logit[1];
        if (tol->logit > 0) { /* the distribution (same context so far) */
            arch_golden_tol logit_only = *tol;
            logit_only.margin = INFINITY;
            check_dist(r, where, logits, V, &g, &logit_only, &max_diff);
        }
        if (tok != greedy[k]) {
            if (margin > tol->margin) {
                stop = "a clear-margin mismatch";
                bad(r,
                    "%s: generated %d (logit %.6g), golden %d (ours %.6g); golden margin "
                    "%.4g > %.4g",
                    where, tok, (double)logits[tok], greedy[k],
                    greedy[k] < V ? (double)logits[greedy[k]] : NAN, margin, tol->margin);
            } else {
                stop = "parted at a near-tie";
            }
            break;
        }
        if (k + 1 == n_greedy) {
            k++;
            break;
        }
        if (model_eval(s->c, s->kv, &tok, 1, NULL, &err)) {
            bad(r, "model_eval of greedy token %zu: %s", k, err.msg);
            break;
        }
        logits = model_ctx_logits(s->c);
    }
    snprintf(summary, cap,
             "%zu prompt positions (top-1 checked at %d), greedy: %zu of %zu tokens agree (%s); "
             "max |logit diff| %.3g; tolerances: logit %.3g%s, margin %.3g",
             n_prompt, n_checked_top1, k, n_greedy, stop, max_diff, tol->logit,
             tol->logit > 0 ? "" : " (off)", tol->margin);
    free(greedy);
}

static void check_embed(run_state *s, report *r, const arch_golden_tol *tol, int n_threads,
                        char *summary, size_t cap) {
    hl_err err = {0};
    json_t *embs = json_object_get(s->root, "embeddings");
    if (!json_is_array(embs) || json_array_size(embs) == 0) {
        bad(r, "golden: embeddings is not a non-empty array");
        return;
    }
    const int32_t E = model_get_hparams(s->m)->n_embd;
    if (model_ctx_create(s->m, n_threads, 0, &s->c, &err)) {
        bad(r, "setup: %s", err.msg);
        return;
    }
    s->all = malloc((size_t)E * sizeof(float));
    double min_cos = 2;
    for (size_t e = 0; e < json_array_size(embs); e++) {
        json_t *it = json_array_get(embs, e), *vec = json_object_get(it, "embedding");
        size_t n;
        free(s->ids);
        if (!ids_of(json_object_get(it, "prompt_ids"), &s->ids, &n) || !json_is_array(vec)) {
            bad(r, "golden: embeddings[%zu] lacks prompt_ids or embedding", e);
            return;
        }
        if (json_array_size(vec) != (size_t)E) {
            bad(r, "embeddings[%zu]: the golden has %zu dimensions, the model %d", e,
                json_array_size(vec), E);
            continue;
        }
        if (model_embed(s->c, s->ids, (int32_t)n, true, s->all, &err)) {
            bad(r, "embeddings[%zu]: model_embed of %zu tokens: %s", e, n, err.msg);
            continue;
        }
        double dot = 0, na = 0, nb = 0, worst = 0;
        size_t worst_i = 0;
        for (int32_t i = 0; i < E; i++) {
            double a = s->all[i], b = json_number_value(json_array_get(vec, (size_t)i));
            dot += a * b;
            na += a * a;
            nb += b * b;
            if (fabs(a - b) > worst) worst = fabs(a - b), worst_i = (size_t)i;
        }
        double cos = na > 0 && nb > 0 ? dot / sqrt(na * nb) : 0;
        if (cos < min_cos) min_cos = cos;
        if (!(cos > tol->cos_min))
            bad(r,
                "embeddings[%zu] (%zu tokens): cosine %.7f <= %.7f; largest difference at "
                "dimension %zu: %.6g vs golden %.6g; |ours| %.6g",
                e, n, cos, tol->cos_min, worst_i, (double)s->all[worst_i],
                json_number_value(json_array_get(vec, worst_i)), sqrt(na));
    }
    snprintf(summary, cap, "%zu embeddings, min cosine %.7f (must exceed %.7f)",
             json_array_size(embs), min_cos, tol->cos_min);
}

/* The golden's state_check: after the prompt the sequence's state is saved and n_after
 * greedy tokens are fed; then the state is restored and the same tokens fed again: every
 * logit must be bitwise that of the first pass. A model with a recurrent state: a second
 * model_kv that evaluated the same prompt (its KV rows below the prompt's length are then
 * the same: only the state differs), its state overwritten with the later one so that only
 * the restore can make it right, gets the saved state. A KV-only model: the restore is the
 * rewind to the prompt's length (model_kv_truncate). */
static void check_state(run_state *s, report *r, int n_threads, char *summary, size_t cap) {
    json_t *sc = json_object_get(s->root, "state_check");
    const size_t S = model_state_floats(s->m);
    if (!sc) return;
    hl_err err = {0};
    size_t n_prompt, n_greedy;
    int32_t *prompt = NULL, *greedy = NULL;
    const int n_after = (int)num_at(sc, "n_tokens_after_snapshot", NULL);
    const int32_t V = model_get_hparams(s->m)->n_vocab;
    model_ctx *c = NULL;
    model_kv *a = NULL, *b = NULL;
    float *saved = malloc((S ? S : 1) * sizeof(float));
    float *later = malloc((S ? S : 1) * sizeof(float));
    float *first = malloc(sizeof(float) * (size_t)V * (size_t)(n_after > 0 ? n_after : 1));
    int n_diff = 0;
    if (!ids_of(json_object_get(s->root, "prompt_ids"), &prompt, &n_prompt) ||
        !ids_of(json_object_get(s->root, "greedy_ids"), &greedy, &n_greedy) || n_after < 1 ||
        (size_t)n_after > n_greedy) {
        bad(r, "golden: state_check needs prompt_ids and n_tokens_after_snapshot greedy_ids");
        goto done;
    }
    if (!saved || !later || !first || model_ctx_create(s->m, n_threads, 0, &c, &err) ||
        model_kv_create(s->m, (int32_t)(n_prompt + n_greedy), &a, &err) ||
        (S > 0 && model_kv_create(s->m, (int32_t)(n_prompt + n_greedy), &b, &err))) {
        bad(r, "state check setup: %s", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    if (model_eval(c, a, prompt, (int32_t)n_prompt, NULL, &err)) goto eval_fail;
    if (S == 0) { /* KV only: the rewind is the restore */
        for (int i = 0; i < n_after; i++) {
            if (model_eval(c, a, &greedy[i], 1, NULL, &err)) goto eval_fail;
            memcpy(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V);
        }
        if (model_kv_truncate(a, (int32_t)n_prompt, &err)) goto eval_fail;
        b = a, a = NULL;
        goto replay;
    }
    memcpy(saved, model_kv_state(a), S * sizeof(float));
    for (int i = 0; i < n_after; i++) {
        if (model_eval(c, a, &greedy[i], 1, NULL, &err)) goto eval_fail;
        memcpy(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V);
    }
    memcpy(later, model_kv_state(a), S * sizeof(float));
    if (memcmp(saved, later, S * sizeof(float)) == 0) {
        bad(r, "state check: %d more tokens left the recurrent state unchanged", n_after);
        goto done;
    }
    if (model_eval(c, b, prompt, (int32_t)n_prompt, NULL, &err)) goto eval_fail;
    memcpy(model_kv_state(b), later, S * sizeof(float));
    memcpy(model_kv_state(b), saved, S * sizeof(float)); /* the restore */
replay:
    for (int i = 0; i < n_after; i++) {
        if (model_eval(c, b, &greedy[i], 1, NULL, &err)) goto eval_fail;
        if (memcmp(first + (size_t)i * V, model_ctx_logits(c), sizeof(float) * (size_t)V) != 0 &&
            n_diff++ == 0)
            bad(r, "state check: token %d after the restore gives other logits", i);
    }
    if (n_diff == 0) {
        size_t o = strlen(summary);
        if (S)
            snprintf(summary + o, cap - o, "; state restore: %d tokens bitwise equal (%zu floats)",
                     n_after, S);
        else
            snprintf(summary + o, cap - o, "; state restore (KV rewind): %d tokens bitwise equal",
                     n_after);
    }
    goto done;
eval_fail:
    bad(r, "state check model_eval: %s", err.msg);
done:
    free(prompt);
    free(greedy);
    free(saved);
    free(later);
    free(first);
    model_kv_free(a);
    model_kv_free(b);
    model_ctx_free(c);
}

bool arch_golden_run(const char *gguf_path, const char *json_path, const arch_golden_tol *tol,
                     int n_threads, char *msg, size_t cap) {
    report r = {0};
    run_state s = {0};
    char summary[512] = "";
    json_error_t jerr;
    if (n_threads <= 0) n_threads = 2;
    s.root = json_load_file(json_path, 0, &jerr);
    if (!s.root) {
        snprintf(msg, cap, "%s: line %d: %s", json_path, jerr.line, jerr.text);
        return false;
    }
    arch_golden_tol t;
    if (tol) {
        t = *tol;
    } else {
        const char *w = json_string_value(json_object_get(s.root, "weights"));
        t = arch_golden_tol_for(w, noise_floor_of(s.root), dequant_diff_of(s.root));
    }
    hl_err err = {0};
    if (model_load(gguf_path, NULL, &s.m, &err)) {
        snprintf(msg, cap, "model_load(%s): %s", gguf_path, err.msg);
        run_free(&s);
        return false;
    }
    if (json_object_get(s.root, "embeddings"))
        check_embed(&s, &r, &t, n_threads, summary, sizeof summary);
    else
        check_causal(&s, &r, &t, n_threads, summary, sizeof summary);
    if (!r.n_bad) check_state(&s, &r, n_threads, summary, sizeof summary);
    if (r.n_bad)
        snprintf(msg, cap, "%d mismatch%s; first: %s\n    (%s)", r.n_bad, r.n_bad > 1 ? "es" : "",
                 r.first, summary);
    else
        snprintf(msg, cap, "%s", summary);
    run_free(&s);
    return r.n_bad == 0;
}

void arch_golden_check_at(const char *case_name, const char *file, int line) {
    char rel[256], gguf[1024];
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", case_name);
    const char *p = test_shared_path(rel);
    if (!p) {
        snprintf(gguf, sizeof gguf, "%s not found (HEARTH_SHARED)", rel);
        test_skip(gguf);
        return;
    }
    snprintf(gguf, sizeof gguf, "%s", p);
    snprintf(rel, sizeof rel, "testdata/arch/%s.json", case_name);
    const char *j = test_shared_path(rel);
    if (!j) {
        snprintf(gguf, sizeof gguf, "%s not found (HEARTH_SHARED)", rel);
        test_skip(gguf);
        return;
    }
    static char msg[2048];
    bool ok = arch_golden_run(gguf, j, NULL, 0, msg, sizeof msg);
    if (ok)
        fprintf(stderr, "    %s: %s\n", case_name, msg);
    else
        test_fail_at(file, line, "arch golden %s: %s", case_name, msg);
}
