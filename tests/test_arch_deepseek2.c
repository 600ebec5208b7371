/*
 * test_arch_deepseek2.c - deepseek2 (multi-head latent attention, leading dense layers,
 * DeepSeek-routed experts with shared experts) against llama.cpp's goldens
 * (tests/arch_golden.h): the GLM-4.7-Flash-like case in F32 and Q8_0, and expert groups
 * with YaRN. Also: the older file form (one fused kv_b per layer instead of k_b / v_b,
 * full heads cached), made from the golden's weights, passes the same golden; a batch
 * equals its tokens one at a time; the runner (block pool, prefix cache) gives
 * model_eval's tokens; bad router hyperparameters are named; `hearth generate` gives
 * the golden's greedy tokens. A float64 reference (checked against the goldens) covers
 * the forms they lack: a plain wq and the softmax router without renormalisation.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch_golden.h"
#include "arch_recurrent.h"
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
    bool plain_wq;      /* attn_q = q_b q_a instead of q_a, q_a_norm, q_b; no q_lora_rank */
    bool no_norm;       /* expert_weights_norm false */
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
        if (v->plain_wq && strstr(key, ".q_lora_rank")) continue;
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
        case GGUF_TYPE_BOOL:
            st = gguf_writer_set_bool(w, key, *(const uint8_t *)p != 0 &&
                                                  !(v->no_norm && strstr(key, "weights_norm")));
            break;
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
        if (v->plain_wq && (strstr(name, "attn_q_a") || strstr(name, "attn_q_b"))) {
            if (!strstr(name, "attn_q_a.weight")) continue;
            /* attn_q {E, H * dq} = q_b {q_lora, H * dq} after q_a {E, q_lora} */
            char bname[128];
            snprintf(bname, sizeof bname, "%.*sattn_q_b.weight",
                     (int)(strstr(name, "attn_q_a") - name), name);
            const gguf_tensor *tb = gguf_find_tensor(f, bname);
            if (!tb || t->type != HL_TYPE_F32 || tb->type != HL_TYPE_F32) {
                st = hl_fail(err, HL_ERR_FORMAT, "need f32 q_a and q_b");
                break;
            }
            const int64_t E = t->ne[0], QL = t->ne[1], NQ = tb->ne[1];
            const float *A = t->data, *B = tb->data;
            float *wq = calloc((size_t)(E * NQ), sizeof(float));
            for (int64_t r = 0; r < NQ; r++)
                for (int64_t k = 0; k < QL; k++)
                    for (int64_t c = 0; c < E; c++) wq[r * E + c] += B[r * QL + k] * A[k * E + c];
            const int64_t ne[2] = {E, NQ};
            snprintf(bname, sizeof bname, "%.*sattn_q.weight",
                     (int)(strstr(name, "attn_q_a") - name), name);
            st = gguf_writer_add_tensor(w, bname, HL_TYPE_F32, 2, ne, wq,
                                        sizeof(float) * (uint64_t)(E * NQ), err);
            free(wq);
            continue;
        }
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

#define N_TOK 48

/* One batch (tokens grouped by expert, every head's absorbed query in one matmul per
 * head) against the same tokens one at a time: every position's logits within 1e-4. */
TEST(arch_deepseek2_batch_equals_token_by_token) {
    model *m = arch_load_file("deepseek2-groups-yarn.gguf");
    if (!m) SKIP("testdata/arch/deepseek2-groups-yarn.gguf not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    int32_t toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = (i * 97 + 13) % V;
    arch_steps_check(m, toks, N_TOK, 64, (const int[]){1}, 1, 1e-4);
    model_free(m);
}

/* Through the runner (the server's path: block pool with the latent's K and V rows of
 * different widths, prefix cache): a conversation continued from the cache gives the
 * greedy tokens of model_eval. */
TEST(arch_deepseek2_runner_greedy_matches_model_eval) {
    model *m = arch_load_file("deepseek2.gguf");
    if (!m) SKIP("testdata/arch/deepseek2.gguf not found (HEARTH_SHARED)");
    const int32_t V = model_get_hparams(m)->n_vocab;
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = 3 + (i * 131 + 7) % (V - 3);
    arch_runner_eval_check(m, prompt, 24);
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

/* ---- a float64 reference: deepseek2 as the goldens' notes and llama.cpp's graph describe
 * it, decompressed (every head's k_nope and v computed from the latent, no absorption),
 * one token at a time. Checked against llama.cpp's golden first, then used for the forms
 * the goldens lack (a plain wq, the softmax router without renormalisation). ---- */

typedef struct ref {
    gguf_file *f;
    int E, L, H, V, rope, nope, vd, dq, R, q_lora, n_exp, n_used, n_shared, n_dense;
    int n_group, n_group_used;
    bool sigmoid, norm;
    double scale_w, eps, base, kq_scale, freq_scale, rope_mag, n_ctx_orig;
    bool yarn;
    int max_pos;
    double *K, *Vc; /* [L][max_pos][H][dq], [L][max_pos][H][vd] */
} ref;

static const float *ref_t(const ref *r, const char *fmt, int l) {
    char name[128];
    snprintf(name, sizeof name, fmt, l);
    const gguf_tensor *t = gguf_find_tensor(r->f, name);
    return t && t->type == HL_TYPE_F32 ? t->data : NULL;
}

static int ref_int(const ref *r, const char *suffix, int dflt) {
    char key[128];
    snprintf(key, sizeof key, "deepseek2.%s", suffix);
    uint32_t u;
    bool b;
    if (gguf_get_u32(r->f, key, &u)) return (int)u;
    if (gguf_get_bool(r->f, key, &b)) return b;
    return dflt;
}

static double ref_float(const ref *r, const char *suffix, double dflt) {
    char key[128];
    snprintf(key, sizeof key, "deepseek2.%s", suffix);
    float v;
    return gguf_get_f32(r->f, key, &v) ? v : dflt;
}

static bool ref_open(ref *r, const char *path, int max_pos) {
    memset(r, 0, sizeof *r);
    if (gguf_open(path, &r->f, NULL)) return false;
    r->E = ref_int(r, "embedding_length", 0);
    r->L = ref_int(r, "block_count", 0);
    r->H = ref_int(r, "attention.head_count", 0);
    r->rope = ref_int(r, "rope.dimension_count", 0);
    r->R = ref_int(r, "attention.kv_lora_rank", 0);
    r->q_lora = ref_int(r, "attention.q_lora_rank", 0);
    r->dq = ref_int(r, "attention.key_length_mla", ref_int(r, "attention.key_length", 0));
    r->vd = ref_int(r, "attention.value_length_mla", ref_int(r, "attention.value_length", 0));
    r->nope = r->dq - r->rope;
    r->n_exp = ref_int(r, "expert_count", 0);
    r->n_used = ref_int(r, "expert_used_count", 0);
    r->n_shared = ref_int(r, "expert_shared_count", 0);
    r->n_dense = ref_int(r, "leading_dense_block_count", 0);
    r->n_group = ref_int(r, "expert_group_count", 1);
    r->n_group_used = ref_int(r, "expert_group_used_count", 1);
    r->sigmoid = ref_int(r, "expert_gating_func", 1) == 2;
    r->norm = ref_int(r, "expert_weights_norm", 0);
    r->scale_w = ref_float(r, "expert_weights_scale", 1.0);
    r->eps = ref_float(r, "attention.layer_norm_rms_epsilon", 1e-6);
    r->base = ref_float(r, "rope.freq_base", 10000.0);
    gguf_str type;
    r->yarn = gguf_get_str(r->f, "deepseek2.rope.scaling.type", &type) && gguf_str_eq(type, "yarn");
    r->freq_scale = 1.0;
    r->rope_mag = 1.0;
    double mscale = 1.0;
    if (r->yarn) {
        const double factor = ref_float(r, "rope.scaling.factor", 1.0);
        const double log_mul = ref_float(r, "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
        r->freq_scale = 1.0 / factor;
        r->n_ctx_orig = ref_int(r, "rope.scaling.original_context_length", 0);
        /* with a log multiplier the rotation keeps unit length; the scores get mscale^2 */
        r->rope_mag = log_mul != 0.0 ? 1.0 : 1.0 + 0.1 * log(factor);
        mscale = r->rope_mag * (1.0 + 0.1 * log_mul * log(factor));
    }
    r->kq_scale = mscale * mscale / sqrt((double)r->dq);
    const gguf_tensor *te = gguf_find_tensor(r->f, "token_embd.weight");
    r->V = te ? (int)te->ne[1] : 0;
    r->max_pos = max_pos;
    r->K = calloc((size_t)r->L * max_pos * r->H * r->dq, sizeof(double));
    r->Vc = calloc((size_t)r->L * max_pos * r->H * r->vd, sizeof(double));
    return r->E > 0 && r->V > 0 && r->K && r->Vc;
}

static void ref_close(ref *r) {
    free(r->K);
    free(r->Vc);
    gguf_close(r->f);
}

/* out[rows] = W[rows][n] x */
static void ref_mv(const float *W, const double *x, int rows, int n, double *out) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += (double)W[(size_t)i * n + j] * x[j];
        out[i] = s;
    }
}

static void ref_rms(double *x, int n, const float *w, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * w[i];
}

/* NORM rope (adjacent pairs) over v[0..rope), with YaRN's ramp as ggml computes it */
static void ref_rope(const ref *r, double *v, int pos) {
    double lo = 0, hi = 0;
    if (r->yarn) {
        const double two_pi = 6.283185307179586;
        const double d_fast = r->rope * log(r->n_ctx_orig / (32.0 * two_pi)) / (2 * log(r->base));
        const double d_slow = r->rope * log(r->n_ctx_orig / (1.0 * two_pi)) / (2 * log(r->base));
        lo = fmax(0, floor(d_fast));
        hi = fmin(r->rope - 1, ceil(d_slow));
    }
    for (int i = 0; i < r->rope / 2; i++) {
        const double extrap = pos * pow(r->base, -2.0 * i / r->rope);
        double theta = extrap * r->freq_scale;
        if (r->yarn) {
            const double y = (i - lo) / fmax(0.001, hi - lo);
            const double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            theta = theta * (1 - ramp) + extrap * ramp;
        }
        const double c = cos(theta) * r->rope_mag, s = sin(theta) * r->rope_mag;
        const double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

/* x += down(silu(gate xn) * up xn) for one SwiGLU of F rows */
static void ref_swiglu_add(const float *g, const float *u, const float *d, const double *xn,
                           int E, int F, double wgt, double *x) {
    double *a = malloc(sizeof(double) * F), *b = malloc(sizeof(double) * F);
    double *o = malloc(sizeof(double) * E);
    ref_mv(g, xn, F, E, a);
    ref_mv(u, xn, F, E, b);
    for (int i = 0; i < F; i++) a[i] = a[i] / (1 + exp(-a[i])) * b[i];
    ref_mv(d, a, E, F, o);
    for (int i = 0; i < E; i++) x[i] += wgt * o[i];
    free(a);
    free(b);
    free(o);
}

static void ref_moe(const ref *r, int l, const double *xn, double *x) {
    const int n = r->n_exp, per = n / r->n_group, E = r->E;
    double s[1024], sel[1024];
    bool chosen[1024] = {0}, gkeep[256] = {0};
    ref_mv(ref_t(r, "blk.%d.ffn_gate_inp.weight", l), xn, n, E, s);
    if (r->sigmoid) {
        for (int e = 0; e < n; e++) s[e] = 1 / (1 + exp(-s[e]));
    } else {
        double mx = s[0], sum = 0;
        for (int e = 1; e < n; e++) mx = fmax(mx, s[e]);
        for (int e = 0; e < n; e++) sum += s[e] = exp(s[e] - mx);
        for (int e = 0; e < n; e++) s[e] /= sum;
    }
    const float *bias = ref_t(r, "blk.%d.exp_probs_b.bias", l);
    for (int e = 0; e < n; e++) sel[e] = s[e] + (bias ? bias[e] : 0);
    if (r->n_group > 1) {
        double gs[256];
        for (int g = 0; g < r->n_group; g++) { /* the sum of the group's two best */
            int b1 = -1, b2 = -1;
            for (int i = g * per; i < (g + 1) * per; i++) {
                if (b1 < 0 || sel[i] > sel[b1]) b2 = b1, b1 = i;
                else if (b2 < 0 || sel[i] > sel[b2]) b2 = i;
            }
            gs[g] = sel[b1] + (b2 >= 0 ? sel[b2] : 0);
        }
        for (int k = 0; k < r->n_group_used; k++) {
            int best = -1;
            for (int g = 0; g < r->n_group; g++)
                if (!gkeep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            gkeep[best] = true;
        }
        for (int e = 0; e < n; e++)
            if (!gkeep[e / per]) sel[e] = -INFINITY;
    }
    double wsum = 0;
    for (int k = 0; k < r->n_used; k++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!chosen[e] && (best < 0 || sel[e] > sel[best])) best = e;
        chosen[best] = true;
        wsum += s[best];
    }
    const int F = (int)gguf_find_tensor(r->f, "blk.1.ffn_gate_exps.weight")->ne[1];
    const float *G = ref_t(r, "blk.%d.ffn_gate_exps.weight", l);
    const float *U = ref_t(r, "blk.%d.ffn_up_exps.weight", l);
    const float *D = ref_t(r, "blk.%d.ffn_down_exps.weight", l);
    for (int e = 0; e < n; e++) {
        if (!chosen[e]) continue;
        double w = s[e];
        if (r->norm) w /= fmax(wsum, 6.103515625e-5);
        w *= r->scale_w;
        ref_swiglu_add(G + (size_t)e * F * E, U + (size_t)e * F * E, D + (size_t)e * E * F, xn,
                       E, F, w, x);
    }
    if (r->n_shared)
        ref_swiglu_add(ref_t(r, "blk.%d.ffn_gate_shexp.weight", l),
                       ref_t(r, "blk.%d.ffn_up_shexp.weight", l),
                       ref_t(r, "blk.%d.ffn_down_shexp.weight", l), xn, E, F * r->n_shared, 1.0,
                       x);
}

/* The logits [V] after token tok at position pos (positions fed in order from 0). */
static void ref_step(ref *r, int32_t tok, int pos, float *logits) {
    const int E = r->E, H = r->H, dq = r->dq, vd = r->vd, R = r->R, nope = r->nope;
    double *x = calloc((size_t)E, sizeof(double));
    double *xn = calloc((size_t)E, sizeof(double));
    double *q = calloc((size_t)H * dq, sizeof(double));
    double *a = calloc((size_t)(r->q_lora > 0 ? r->q_lora : 1), sizeof(double));
    double *kv = calloc((size_t)R + r->rope, sizeof(double));
    double *o = calloc((size_t)H * vd, sizeof(double));
    double *sc = calloc((size_t)pos + 1, sizeof(double));
    double *dx = calloc((size_t)E, sizeof(double));
    const float *emb = ref_t(r, "token_embd.weight", 0);
    for (int i = 0; i < E; i++) x[i] = emb[(size_t)tok * E + i];
    for (int l = 0; l < r->L; l++) {
        memcpy(xn, x, sizeof(double) * E);
        ref_rms(xn, E, ref_t(r, "blk.%d.attn_norm.weight", l), r->eps);
        if (r->q_lora) {
            ref_mv(ref_t(r, "blk.%d.attn_q_a.weight", l), xn, r->q_lora, E, a);
            ref_rms(a, r->q_lora, ref_t(r, "blk.%d.attn_q_a_norm.weight", l), r->eps);
            ref_mv(ref_t(r, "blk.%d.attn_q_b.weight", l), a, H * dq, r->q_lora, q);
        } else {
            ref_mv(ref_t(r, "blk.%d.attn_q.weight", l), xn, H * dq, E, q);
        }
        for (int h = 0; h < H; h++) ref_rope(r, q + (size_t)h * dq + nope, pos);
        ref_mv(ref_t(r, "blk.%d.attn_kv_a_mqa.weight", l), xn, R + r->rope, E, kv);
        ref_rms(kv, R, ref_t(r, "blk.%d.attn_kv_a_norm.weight", l), r->eps);
        ref_rope(r, kv + R, pos);
        const float *kb = ref_t(r, "blk.%d.attn_k_b.weight", l);
        const float *vb = ref_t(r, "blk.%d.attn_v_b.weight", l);
        const float *kvb = ref_t(r, "blk.%d.attn_kv_b.weight", l);
        for (int h = 0; h < H; h++) {
            double *K = r->K + (((size_t)l * r->max_pos + pos) * H + h) * dq;
            double *Vv = r->Vc + (((size_t)l * r->max_pos + pos) * H + h) * vd;
            for (int i = 0; i < nope; i++) {
                double s = 0;
                for (int j = 0; j < R; j++)
                    s += (kb ? (double)kb[((size_t)h * R + j) * nope + i]
                             : (double)kvb[((size_t)h * (nope + vd) + i) * R + j]) * kv[j];
                K[i] = s;
            }
            memcpy(K + nope, kv + R, sizeof(double) * r->rope);
            for (int i = 0; i < vd; i++) {
                double s = 0;
                for (int j = 0; j < R; j++)
                    s += (vb ? (double)vb[((size_t)h * vd + i) * R + j]
                             : (double)kvb[((size_t)h * (nope + vd) + nope + i) * R + j]) * kv[j];
                Vv[i] = s;
            }
        }
        for (int h = 0; h < H; h++) {
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos; t++) {
                const double *K = r->K + (((size_t)l * r->max_pos + t) * H + h) * dq;
                double s = 0;
                for (int i = 0; i < dq; i++) s += q[(size_t)h * dq + i] * K[i];
                sc[t] = s * r->kq_scale;
                mx = fmax(mx, sc[t]);
            }
            for (int t = 0; t <= pos; t++) sum += sc[t] = exp(sc[t] - mx);
            for (int i = 0; i < vd; i++) {
                double s = 0;
                for (int t = 0; t <= pos; t++)
                    s += sc[t] * r->Vc[(((size_t)l * r->max_pos + t) * H + h) * vd + i];
                o[(size_t)h * vd + i] = s / sum;
            }
        }
        ref_mv(ref_t(r, "blk.%d.attn_output.weight", l), o, E, H * vd, dx);
        for (int i = 0; i < E; i++) x[i] += dx[i];
        memcpy(xn, x, sizeof(double) * E);
        ref_rms(xn, E, ref_t(r, "blk.%d.ffn_norm.weight", l), r->eps);
        if (l < r->n_dense) {
            const int F = (int)gguf_find_tensor(r->f, "blk.0.ffn_gate.weight")->ne[1];
            ref_swiglu_add(ref_t(r, "blk.%d.ffn_gate.weight", l),
                           ref_t(r, "blk.%d.ffn_up.weight", l),
                           ref_t(r, "blk.%d.ffn_down.weight", l), xn, E, F, 1.0, x);
        } else {
            ref_moe(r, l, xn, x);
        }
    }
    memcpy(xn, x, sizeof(double) * E);
    ref_rms(xn, E, ref_t(r, "output_norm.weight", 0), r->eps);
    const float *out = ref_t(r, "output.weight", 0);
    for (int v = 0; v < r->V; v++) {
        double s = 0;
        for (int i = 0; i < E; i++) s += (double)out[(size_t)v * E + i] * xn[i];
        logits[v] = (float)s;
    }
    double *bufs[] = {x, xn, q, a, kv, o, sc, dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

#define REF_NP 24

/* The golden's prompt (its first REF_NP tokens). */
static int golden_prompt(const char *json_rel, int32_t *ids, json_t **root) {
    const char *jp = test_shared_path(json_rel);
    json_error_t je;
    *root = jp ? json_load_file(jp, 0, &je) : NULL;
    json_t *p = json_object_get(*root, "prompt_ids");
    int n = 0;
    for (; n < REF_NP && (size_t)n < json_array_size(p); n++)
        ids[n] = (int32_t)json_integer_value(json_array_get(p, (size_t)n));
    return n;
}

/* The reference reproduces llama.cpp: every golden top-10 logit of the first REF_NP
 * positions within 1e-3, for the GLM-4.7-Flash-like file and the groups + YaRN one. */
TEST(arch_deepseek2_reference_matches_the_goldens) {
    const char *cases[] = {"deepseek2", "deepseek2-groups-yarn"};
    for (size_t ci = 0; ci < 2; ci++) {
        char rel[128];
        snprintf(rel, sizeof rel, "testdata/arch/%s.json", cases[ci]);
        json_t *root;
        int32_t ids[REF_NP];
        const int n = golden_prompt(rel, ids, &root);
        snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", cases[ci]);
        const char *gp = test_shared_path(rel);
        if (!root || !gp) {
            json_decref(root);
            SKIP("testdata/arch/deepseek2*.json/.gguf not found (HEARTH_SHARED)");
        }
        ref r;
        CHECK(ref_open(&r, gp, REF_NP));
        float *logits = malloc(sizeof(float) * (size_t)r.V);
        double worst = 0;
        json_t *top = json_object_get(root, "prompt_top10");
        for (int i = 0; i < n; i++) {
            ref_step(&r, ids[i], i, logits);
            json_t *row = json_array_get(top, (size_t)i);
            for (size_t k = 0; k < json_array_size(row); k++) {
                json_t *pair = json_array_get(row, k);
                const json_int_t id = json_integer_value(json_array_get(pair, 0));
                worst = fmax(worst, fabs(logits[id] - json_number_value(json_array_get(pair, 1))));
            }
        }
        fprintf(stderr, "    %s: reference vs llama.cpp, %d positions: max |diff| %.3g\n",
                cases[ci], n, worst);
        CHECK_MSG(n == REF_NP && worst < 1e-3, "%s: max diff %g over %d", cases[ci], worst, n);
        free(logits);
        ref_close(&r);
        json_decref(root);
    }
}

/* Forms the goldens lack, against the reference: a plain wq (DeepSeek-V2-Lite: no
 * q_lora), the softmax router without renormalisation (DeepSeek-V2), in the absorbed and
 * the kv_b form; every logit of REF_NP positions, one batch, within 1e-3. */
TEST(arch_deepseek2_plain_wq_and_softmax_router_match_the_reference) {
    json_t *root;
    int32_t ids[REF_NP];
    const int n = golden_prompt("testdata/arch/deepseek2-groups-yarn.json", ids, &root);
    json_decref(root);
    if (n < REF_NP || !test_shared_path("testdata/arch/deepseek2-groups-yarn.gguf"))
        SKIP("testdata/arch/deepseek2-groups-yarn.* not found (HEARTH_SHARED)");
    const variant vs[] = {
        {.plain_wq = true, .gating = 1, .no_norm = true},
        {.legacy = true, .plain_wq = true, .gating = 1, .no_norm = true},
        {.legacy = true, .gating = 1},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/ds2-variant.gguf", test_tmpdir());
    for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++) {
        hl_err err = {0};
        CHECK_OK(write_variant("deepseek2-groups-yarn.gguf", &vs[vi], path, &err), &err);
        model *m = NULL;
        CHECK_OK(model_load(path, NULL, &m, &err), &err);
        const int32_t V = model_get_hparams(m)->n_vocab;
        model_ctx *c = NULL;
        model_kv *kv = NULL;
        float *ours = malloc(sizeof(float) * (size_t)V * REF_NP);
        float *want = malloc(sizeof(float) * (size_t)V);
        CHECK_OK(model_ctx_create(m, 2, REF_NP, &c, NULL), NULL);
        CHECK_OK(model_kv_create(m, REF_NP, &kv, NULL), NULL);
        CHECK_OK(model_eval(c, kv, ids, REF_NP, ours, NULL), NULL);
        ref r;
        CHECK(ref_open(&r, path, REF_NP));
        double worst = 0, mx = 0;
        for (int i = 0; i < REF_NP; i++) {
            ref_step(&r, ids[i], i, want);
            for (int32_t v = 0; v < V; v++) {
                worst = fmax(worst, fabs(ours[(size_t)i * V + v] - want[v]));
                mx = fmax(mx, fabs(want[v]));
            }
        }
        fprintf(stderr, "    variant %zu: max |ours - reference| %.3g (|logit| <= %.3g)\n", vi,
                worst, mx);
        CHECK_MSG(mx > 0.1, "degenerate logits");
        CHECK_MSG(worst < 1e-3, "variant %zu: max diff %g", vi, worst);
        ref_close(&r);
        free(ours);
        free(want);
        model_kv_free(kv);
        model_ctx_free(c);
        model_free(m);
    }
}
