/*
 * test_arch_bert.c - the encoder-only embedding architectures (bert, nomic-bert) against
 * llama.cpp's goldens (../shared/testdata/arch/<case>.json): model_embed of every golden
 * prompt must point the way llama.cpp's pooled, L2-normalised embedding does.
 */
#include <jansson.h>
#include <stdlib.h>

#include "model/model.h"
#include "test.h"

/* Loads <name>.gguf and its golden, embeds each golden prompt and returns in *min_cos the
 * lowest cosine and in *max_abs the largest element difference. false: SKIP or failure
 * already reported. */
static bool embed_golden(const char *name, double *min_cos, double *max_abs) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s.json", name);
    const char *jp = test_shared_path(rel);
    if (!jp) {
        test_skip("golden JSON not found under shared/testdata/arch");
        return false;
    }
    json_error_t jerr;
    json_t *root = json_load_file(jp, 0, &jerr);
    if (!root) {
        test_fail_at(__FILE__, __LINE__, "%s: %s", jp, jerr.text);
        return false;
    }
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", name);
    const char *gp = test_shared_path(rel);
    model *m = NULL;
    model_ctx *c = NULL;
    hl_err err = {0};
    bool ok = false;
    float *out = NULL;
    int32_t *ids = NULL;
    *min_cos = 1.0;
    *max_abs = 0.0;
    if (!gp || model_load(gp, NULL, &m, &err) || model_ctx_create(m, 2, 0, &c, &err)) {
        test_fail_at(__FILE__, __LINE__, "%s: %s", name, gp ? err.msg : "gguf missing");
        goto done;
    }
    if (model_has_logits(m)) {
        test_fail_at(__FILE__, __LINE__, "%s: an embedding model must have no logits", name);
        goto done;
    }
    const int64_t E = model_get_hparams(m)->n_embd;
    json_t *embs = json_object_get(root, "embeddings");
    out = malloc((size_t)E * sizeof *out);
    if (!json_is_array(embs) || json_array_size(embs) == 0 || !out) {
        test_fail_at(__FILE__, __LINE__, "%s: no embeddings in the golden", name);
        goto done;
    }
    size_t i;
    json_t *e;
    json_array_foreach(embs, i, e) {
        json_t *pj = json_object_get(e, "prompt_ids"), *ej = json_object_get(e, "embedding");
        const int32_t n = (int32_t)json_array_size(pj);
        if (n == 0 || (int64_t)json_array_size(ej) != E) {
            test_fail_at(__FILE__, __LINE__, "%s: malformed golden entry %zu", name, i);
            goto done;
        }
        free(ids);
        ids = malloc((size_t)n * sizeof *ids);
        for (int32_t t = 0; t < n; t++) ids[t] = (int32_t)json_integer_value(json_array_get(pj, (size_t)t));
        if (model_embed(c, ids, n, true, out, &err)) {
            test_fail_at(__FILE__, __LINE__, "%s: model_embed: %s", name, err.msg);
            goto done;
        }
        double dot = 0, na = 0, nb = 0;
        for (int64_t j = 0; j < E; j++) {
            const double g = json_number_value(json_array_get(ej, (size_t)j));
            dot += g * out[j];
            na += g * g;
            nb += (double)out[j] * out[j];
            if (fabs(g - out[j]) > *max_abs) *max_abs = fabs(g - out[j]);
        }
        const double cs = dot / sqrt(na * nb);
        if (!(cs >= *min_cos)) *min_cos = cs;
    }
    printf("  %s: min cosine %.9f, max |diff| %.3g\n", name, *min_cos, *max_abs);
    ok = true;
done:
    free(ids);
    free(out);
    model_ctx_free(c);
    model_free(m);
    json_decref(root);
    return ok;
}

#define GOLDEN_TEST(fn, name, cos_min, abs_max)                                          \
    TEST(fn) {                                                                           \
        double cs, mx;                                                                   \
        if (!embed_golden(name, &cs, &mx)) return;                                       \
        CHECK_MSG(cs > (cos_min), "%s: cosine %.9f <= %g", name, cs, (double)(cos_min)); \
        CHECK_MSG(mx < (abs_max), "%s: max |diff| %.3g >= %g", name, mx, (double)(abs_max)); \
    }

/* F16: llama.cpp rounds activations to f16 before those matmuls, we do not (~1e-4 off);
 * Q8_0: both quantise activations to Q8_0 blocks the same way. */
GOLDEN_TEST(arch_bert_golden, "bert", 0.9999, 1e-4)
GOLDEN_TEST(arch_bert_f16_golden, "bert-f16", 0.9999, 2e-3)
GOLDEN_TEST(arch_bert_q8_0_golden, "bert-q8_0", 0.9999, 1e-3)
GOLDEN_TEST(arch_nomic_bert_golden, "nomic-bert", 0.9999, 1e-4)
GOLDEN_TEST(arch_nomic_bert_f16_golden, "nomic-bert-f16", 0.9999, 2e-3)
GOLDEN_TEST(arch_nomic_bert_q8_0_golden, "nomic-bert-q8_0", 0.9999, 1e-3)
