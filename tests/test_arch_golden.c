/* test_arch_golden.c - the architecture-golden checker (arch_golden.c) checked on goldens
 * it must accept and on doctored ones it must reject. The goldens are written here for a
 * synthetic llama GGUF (model_synth.h) from synth_ref_forward(), the plain reference
 * forward written independently of src/model/forward.c, in the JSON layout of
 * ../shared/testdata/arch. The arch cases themselves (TEST(arch_gemma3) ...) are added as
 * their architectures load. */
#include <jansson.h>
#include <stdlib.h>

#include "arch_golden.h"
#include "model/model.h"
#include "model_synth.h"
#include "test.h"

enum { G_PROMPT = 12, G_GREEDY = 16, G_TOP = 10 };

static int32_t argmax_f(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* [[id, logit] x 10], best first */
static json_t *top10_json(const float *logits, int V) {
    int idx[G_TOP];
    json_t *a = json_array();
    for (int k = 0; k < G_TOP; k++) {
        int best = -1;
        for (int i = 0; i < V; i++) {
            bool used = false;
            for (int j = 0; j < k; j++) used |= idx[j] == i;
            if (!used && (best < 0 || logits[i] > logits[best])) best = i;
        }
        idx[k] = best;
        json_t *p = json_array();
        json_array_append_new(p, json_integer(best));
        json_array_append_new(p, json_real((double)logits[best]));
        json_array_append_new(a, p);
    }
    return a;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The golden of a synthetic model: the prompt's distributions in one reference run, then
 * G_GREEDY greedy tokens, each from a reference run over everything before it. */
static json_t *synth_golden(const synth_model *s, int V, const char *weights) {
    int32_t seq[G_PROMPT + G_GREEDY];
    for (int i = 0; i < G_PROMPT; i++) seq[i] = i == 0 ? 1 : (int32_t)((i * 37 + 11) % V);
    float *out = malloc(sizeof(float) * (size_t)V * (G_PROMPT + G_GREEDY));
    synth_ref_forward(s, seq, G_PROMPT, out);
    json_t *root = json_object(), *ptop = json_array(), *gtop = json_array();
    json_object_set_new(root, "weights", json_string(weights));
    for (int i = 0; i < G_PROMPT; i++) json_array_append_new(ptop, top10_json(out + (size_t)i * V, V));
    int n = G_PROMPT;
    for (int k = 0; k < G_GREEDY; k++) {
        synth_ref_forward(s, seq, n, out);
        const float *last = out + (size_t)(n - 1) * V;
        json_array_append_new(gtop, top10_json(last, V));
        seq[n++] = argmax_f(last, V);
    }
    json_object_set_new(root, "prompt_ids", ids_json(seq, G_PROMPT));
    json_object_set_new(root, "prompt_top10", ptop);
    json_object_set_new(root, "greedy_ids", ids_json(seq + G_PROMPT, G_GREEDY));
    json_object_set_new(root, "greedy_top10", gtop);
    free(out);
    return root;
}

/* n_embd and n_ff are multiples of 32: Q8_0 rows are whole blocks */
static const synth_cfg g_cfg = {.arch = "llama", .n_vocab = 64, .n_embd = 32, .n_layer = 2,
                                .n_ff = 64, .n_head = 4, .n_head_kv = 2, .rope_base = 10000.0f,
                                .wtype = HL_TYPE_F32, .seed = 12};

static char g_gguf[512], g_json[512], g_msg[2048];

/* Writes the synthetic GGUF and returns its golden (NULL on failure). */
static json_t *make_case(hl_type wtype, const char *weights) {
    snprintf(g_gguf, sizeof g_gguf, "%s/synth.gguf", test_tmpdir());
    snprintf(g_json, sizeof g_json, "%s/synth.json", test_tmpdir());
    synth_cfg c = g_cfg;
    c.wtype = wtype;
    synth_model *s = synth_build(&c, g_gguf);
    if (!s) return NULL;
    json_t *root = synth_golden(s, c.n_vocab, weights);
    synth_free(s);
    return root;
}

static bool run_with(json_t *root, const arch_golden_tol *tol) {
    if (json_dump_file(root, g_json, JSON_REAL_PRECISION(9)) != 0) {
        snprintf(g_msg, sizeof g_msg, "could not write %s", g_json);
        return false;
    }
    return arch_golden_run(g_gguf, g_json, tol, 2, g_msg, sizeof g_msg);
}

static double margin_of(json_t *top) {
    return json_real_value(json_array_get(json_array_get(top, 0), 1)) -
           json_real_value(json_array_get(json_array_get(top, 1), 1));
}

TEST(arch_golden_tolerances) {
    arch_golden_tol t = arch_golden_tol_for("f32", 1e-5, 0);
    CHECK_NEAR(t.logit, 5e-3, 1e-12);
    CHECK_NEAR(t.margin, 1e-3, 1e-12);
    t = arch_golden_tol_for("f32", 3e-3, 0); /* gemma4's noise floor widens both */
    CHECK_NEAR(t.logit, 6e-3, 1e-12);
    CHECK_NEAR(t.margin, 6e-3, 1e-12);
    t = arch_golden_tol_for("f16", 5e-3, 9e-3);
    CHECK_NEAR(t.logit, 0.05, 1e-12);
    CHECK_NEAR(t.margin, 0.05, 1e-12);
    CHECK(t.cos_min < 0.9999 && t.cos_min >= 0.999);
    t = arch_golden_tol_for("Q8_0 quantized from x.gguf by llama-quantize", 0, 0);
    CHECK(t.logit <= 0);
    CHECK_NEAR(t.margin, 1.0, 1e-12);
    t = arch_golden_tol_for("MXFP4_MOE quantized", 0, 0.3);
    CHECK_NEAR(t.margin, 1.5, 1e-12);
    t = arch_golden_tol_for("F32 random normal (gen.py)", 0, 0);
    CHECK_NEAR(t.margin, 1e-3, 1e-12);
}

/* The engine against the reference: every prompt position and all greedy tokens. */
TEST(arch_golden_synth_passes) {
    static const struct {
        hl_type t;
        const char *w;
    } types[] = {{HL_TYPE_F32, "f32"}, {HL_TYPE_F16, "f16"}, {HL_TYPE_Q8_0, "q8_0"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        json_t *root = make_case(types[i].t, types[i].w);
        CHECK(root != NULL);
        bool ok = run_with(root, NULL);
        json_decref(root);
        CHECK_MSG(ok, "%s: %s", types[i].w, g_msg);
        fprintf(stderr, "    %s: %s\n", types[i].w, g_msg);
        CHECK_MSG(strstr(g_msg, "16 of 16 tokens agree (all agree)") != NULL, "%s", g_msg);
    }
}

/* One prompt logit moved by 0.1 (20x the f32 tolerance) is reported with its position. */
TEST(arch_golden_rejects_shifted_logit) {
    json_t *root = make_case(HL_TYPE_F32, "f32");
    CHECK(root != NULL);
    json_t *pair = json_array_get(json_array_get(json_object_get(root, "prompt_top10"), 5), 2);
    json_array_set_new(pair, 1, json_real(json_real_value(json_array_get(pair, 1)) + 0.1));
    bool ok = run_with(root, NULL);
    json_decref(root);
    CHECK_MSG(!ok, "accepted: %s", g_msg);
    CHECK_MSG(strstr(g_msg, "prompt position 5") && strstr(g_msg, "golden rank 3"), "%s", g_msg);
}

/* A greedy token changed where the golden margin is clear fails; the same change counts
 * as a legitimate parting when the margin is below the threshold (here: every margin). */
TEST(arch_golden_rejects_changed_greedy_token) {
    json_t *root = make_case(HL_TYPE_F32, "f32");
    CHECK(root != NULL);
    json_t *gids = json_object_get(root, "greedy_ids"), *gtop = json_object_get(root, "greedy_top10");
    size_t k = 0;
    while (k < G_GREEDY && margin_of(json_array_get(gtop, k)) < 0.05) k++;
    CHECK(k < G_GREEDY);
    int32_t was = (int32_t)json_integer_value(json_array_get(gids, k));
    json_array_set_new(gids, k, json_integer((was + 1) % g_cfg.n_vocab));
    bool ok = run_with(root, NULL);
    char want[64];
    snprintf(want, sizeof want, "greedy step %zu (position %zu)", k, G_PROMPT - 1 + k);
    CHECK_MSG(!ok && strstr(g_msg, want) && strstr(g_msg, "generated"), "k=%zu: %s", k, g_msg);
    const arch_golden_tol all_ties = {.logit = 5e-3, .margin = 1e9, .cos_min = 0.9999};
    ok = run_with(root, &all_ties);
    json_decref(root);
    CHECK_MSG(ok, "%s", g_msg);
    CHECK_MSG(strstr(g_msg, "parted at a near-tie"), "%s", g_msg);
}

/* The top-1 of a clear position swapped with the runner-up: reported as a top-1
 * mismatch even with the per-logit check off (as for quantised files). */
TEST(arch_golden_rejects_wrong_top1) {
    json_t *root = make_case(HL_TYPE_F32, "f32");
    CHECK(root != NULL);
    json_t *ptop = json_object_get(root, "prompt_top10");
    size_t i = 0;
    while (i < G_PROMPT && margin_of(json_array_get(ptop, i)) < 0.05) i++;
    CHECK(i < G_PROMPT);
    json_t *top = json_array_get(ptop, i);
    json_t *id0 = json_array_get(json_array_get(top, 0), 0), *id1 = json_array_get(json_array_get(top, 1), 0);
    json_int_t a = json_integer_value(id0), b = json_integer_value(id1);
    json_integer_set(id0, b);
    json_integer_set(id1, a);
    const arch_golden_tol top1_only = {.logit = 0, .margin = 1e-3, .cos_min = 0.99};
    bool ok = run_with(root, &top1_only);
    json_decref(root);
    char want[64];
    snprintf(want, sizeof want, "prompt position %zu", i);
    CHECK_MSG(!ok && strstr(g_msg, want) && strstr(g_msg, "top-1 is"), "%s", g_msg);
}

/* Embedding goldens: the mean of the final hidden states (what model_embed must pool for
 * a GGUF that declares no pooling), L2-normalised here. Accepted as is; one component
 * moved by 0.05 (1 - cos ~1e-3) or a dimension missing is rejected. */
TEST(arch_golden_embeddings) {
    json_t *root = make_case(HL_TYPE_F32, "f32");
    CHECK(root != NULL);
    json_decref(root);
    hl_err err = {0};
    model *m;
    CHECK_OK(model_load(g_gguf, NULL, &m, &err), &err);
    const int E = g_cfg.n_embd;
    static const int32_t p0[] = {1, 5, 9, 33}, p1[] = {1, 40, 2, 7, 7, 63, 12, 30, 8};
    const int32_t *ps[2] = {p0, p1};
    const int ns[2] = {4, 9};
    root = json_object();
    json_object_set_new(root, "weights", json_string("f32"));
    json_t *embs = json_array();
    for (int e = 0; e < 2; e++) {
        model_kv *kv;
        model_ctx *c;
        float hidden[9 * 32];
        CHECK_OK(model_kv_create(m, 16, &kv, &err), &err);
        CHECK_OK(model_ctx_create(m, 2, 0, &c, &err), &err);
        CHECK_OK(model_eval_hidden(c, kv, ps[e], ns[e], hidden, &err), &err);
        model_ctx_free(c);
        model_kv_free(kv);
        double v[32], norm = 0;
        for (int d = 0; d < E; d++) {
            v[d] = 0;
            for (int t = 0; t < ns[e]; t++) v[d] += hidden[t * E + d];
            v[d] /= ns[e];
            norm += v[d] * v[d];
        }
        json_t *vec = json_array();
        for (int d = 0; d < E; d++) json_array_append_new(vec, json_real(v[d] / sqrt(norm)));
        json_t *it = json_object();
        json_object_set_new(it, "prompt_ids", ids_json(ps[e], ns[e]));
        json_object_set_new(it, "embedding", vec);
        json_array_append_new(embs, it);
    }
    model_free(m);
    json_object_set_new(root, "embeddings", embs);
    bool ok = run_with(root, NULL);
    CHECK_MSG(ok, "%s", g_msg);
    fprintf(stderr, "    %s\n", g_msg);

    json_t *vec = json_object_get(json_array_get(embs, 1), "embedding");
    double was = json_real_value(json_array_get(vec, 3));
    json_array_set_new(vec, 3, json_real(was + 0.05));
    ok = run_with(root, NULL);
    CHECK_MSG(!ok && strstr(g_msg, "embeddings[1]") && strstr(g_msg, "dimension 3"), "%s", g_msg);
    json_array_set_new(vec, 3, json_real(was));
    json_array_remove(vec, (size_t)E - 1);
    ok = run_with(root, NULL);
    json_decref(root);
    CHECK_MSG(!ok && strstr(g_msg, "31 dimensions"), "%s", g_msg);
}
