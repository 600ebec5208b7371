/*
 * test_arch_bert.c - the encoder-only embedding architectures (bert: absolute positions,
 * biases, GELU; nomic-bert: fused qkv, RoPE, SwiGLU) against llama.cpp's goldens
 * (tests/arch_golden.h: model_embed of every golden prompt, cosine with llama.cpp's
 * pooled, L2-normalised embedding) for F32, F16 and Q8_0 weights; their embeddings
 * through the runner's batch loop; and serving them over HTTP.
 */
#include <stdlib.h>

#include "arch_golden.h"
#include "model/model.h"
#include "test.h"

TEST(arch_bert) { arch_golden_check("bert"); }
TEST(arch_bert_f16) { arch_golden_check("bert-f16"); }
TEST(arch_bert_q8_0) { arch_golden_check("bert-q8_0"); }
TEST(arch_nomic_bert) { arch_golden_check("nomic-bert"); }
TEST(arch_nomic_bert_f16) { arch_golden_check("nomic-bert-f16"); }
TEST(arch_nomic_bert_q8_0) { arch_golden_check("nomic-bert-q8_0"); }

/* ---- embeddings through the runner's batch loop ---- */

#include <pthread.h>

#include "runner/runner.h"
#include "tok/tok.h"

/* The bert golden's prompts (stories260K ids) and one more, so four run at once. */
static const int32_t k_p0[] = {1, 266, 174, 101, 308, 352, 154, 205, 2};
static const int32_t k_p1[] = {1,   123, 287, 410, 128, 173, 242, 209, 29,  184, 440, 346,
                               503, 251, 238, 442, 48,  395, 155, 45,  488, 239, 2};
static const int32_t k_p2[] = {1, 30, 39, 368, 418, 334, 330, 45, 2, 17, 99, 5};
static const int32_t k_p3[] = {1, 366, 407, 303, 13, 445, 206, 448, 454, 160, 283, 470, 497};
static const int32_t *const k_prompts[] = {k_p0, k_p1, k_p2, k_p3};
static const int32_t k_lens[] = {9, 23, 12, 13};
#define N_PROMPTS 4

typedef struct embed_job {
    runner *r;
    const int32_t *toks;
    int32_t n;
    float out[64];
    hl_status st;
    hl_err err;
} embed_job;

static void *embed_thread(void *arg) {
    embed_job *j = arg;
    j->st = runner_embed(j->r, j->toks, j->n, j->out, &j->err);
    return NULL;
}

static model *load_arch(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "testdata/arch/%s.gguf", name);
    const char *p = test_shared_path(rel);
    model *m = NULL;
    if (p && model_load(p, NULL, &m, NULL) != HL_OK) m = NULL;
    return m;
}

/* Four concurrent embeddings of an encoder share the runner's forward passes and equal
 * model_embed's (each sequence non-causal in its own KV view); generation is refused;
 * an input that cannot be one forward pass is an error, not a hang. */
static void runner_embeds(const char *name) {
    model *m = load_arch(name);
    if (!m) SKIP("testdata/arch gguf not found");
    model_ctx *c = NULL;
    runner *r = NULL;
    runner_config cfg = {.n_threads = 1, .n_parallel = N_PROMPTS, .batch_tokens = 64,
                         .kv_budget_bytes = (size_t)16 << 20, .kv_type = "f32"};
    hl_err err = {0};
    if (model_ctx_create(m, 1, 0, &c, &err) || runner_create(m, &cfg, &r, &err)) {
        model_ctx_free(c);
        model_free(m);
        CHECK_MSG(false, "%s", err.msg);
    }
    embed_job jobs[N_PROMPTS];
    pthread_t th[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        jobs[i] = (embed_job){.r = r, .toks = k_prompts[i], .n = k_lens[i]};
        pthread_create(&th[i], NULL, embed_thread, &jobs[i]);
    }
    for (int i = 0; i < N_PROMPTS; i++) pthread_join(th[i], NULL);
    runner_load load = runner_get_load(r);
    printf("  %s: %d embeddings in %llu forward passes\n", name, N_PROMPTS,
           (unsigned long long)load.steps);
    bool ok = true;
    for (int i = 0; i < N_PROMPTS && ok; i++) {
        float want[64];
        ok = jobs[i].st == HL_OK && model_embed(c, k_prompts[i], k_lens[i], false, want, &err) == HL_OK;
        if (!ok) test_fail_at(__FILE__, __LINE__, "prompt %d: %s", i, jobs[i].st ? jobs[i].err.msg : err.msg);
        for (int j = 0; ok && j < 64; j++)
            if (fabsf(want[j] - jobs[i].out[j]) > 1e-5f * (1 + fabsf(want[j]))) {
                test_fail_at(__FILE__, __LINE__, "prompt %d [%d]: runner %.9g vs model_embed %.9g",
                             i, j, jobs[i].out[j], want[j]);
                ok = false;
            }
    }
    CHECK_EQ_INT((long long)load.step_tokens, 9 + 23 + 12 + 13);
    /* an embedding model cannot generate */
    runner_request gr = {.tokens = k_p0, .n_tokens = 9, .num_predict = 2};
    hl_status gst = ok ? runner_generate(r, &gr, NULL, &err) : HL_OK;
    if (ok && gst != HL_ERR_UNSUPPORTED) {
        test_fail_at(__FILE__, __LINE__, "generate on an embedding model: status %d", gst);
        ok = false;
    }
    /* 65 tokens exceed the batch of 64: the whole input must be one forward pass */
    int32_t big[65];
    for (int i = 0; i < 65; i++) big[i] = 3 + i;
    float v[64];
    hl_status bst = ok ? runner_embed(r, big, 65, v, &err) : HL_OK;
    if (ok && (bst != HL_ERR_INVALID || !strstr(err.msg, "batch size"))) {
        test_fail_at(__FILE__, __LINE__, "oversized input: status %d %s", bst, err.msg);
        ok = false;
    }
    /* ... and the runner still serves */
    if (ok && (runner_embed(r, k_p0, 9, v, &err) != HL_OK || fabsf(v[0] - jobs[0].out[0]) > 1e-6f)) {
        test_fail_at(__FILE__, __LINE__, "embedding after an error: %s", err.msg);
        ok = false;
    }
    runner_destroy(r);
    model_ctx_free(c);
    model_free(m);
}

TEST(runner_embed_bert_batched) { runner_embeds("bert"); }
TEST(runner_embed_nomic_bert_batched) { runner_embeds("nomic-bert"); }

/* Absolute positions end at the trained context: a longer input is an error. */
TEST(bert_input_longer_than_positions_is_an_error) {
    model *m = load_arch("bert");
    if (!m) SKIP("testdata/arch/bert.gguf not found");
    model_ctx *c = NULL;
    hl_err err = {0};
    int32_t toks[300];
    for (int i = 0; i < 300; i++) toks[i] = 3 + i % 500;
    float v[64];
    hl_status st = model_ctx_create(m, 1, 512, &c, &err);
    if (!st) st = model_embed(c, toks, 300, true, v, &err);
    model_ctx_free(c);
    model_free(m);
    CHECK_EQ_INT(st, HL_ERR_INVALID);
    CHECK(strstr(err.msg, "256 positions") != NULL);
}

/* A decoder's embedding through the runner is chunked like a prefill (chunk 4) while a
 * generation runs beside it, and still equals model_embed's. */
typedef struct gen_job {
    runner *r;
    hl_status st;
} gen_job;

static void *gen_thread(void *arg) {
    gen_job *g = arg;
    runner_request rq = {.tokens = k_p1, .n_tokens = 23, .num_predict = 8,
                         .sampling = {.temperature = 0}};
    g->st = runner_generate(g->r, &rq, NULL, NULL);
    return NULL;
}

TEST(runner_embed_decoder_chunked_beside_generation) {
    const char *p = test_shared_path("models/stories260K/stories260K.gguf");
    if (!p) SKIP("stories260K.gguf not found");
    model *m = NULL;
    model_ctx *c = NULL;
    runner *r = NULL;
    hl_err err = {0};
    runner_config cfg = {.n_threads = 1, .prefill_chunk = 4, .kv_budget_bytes = (size_t)16 << 20,
                         .kv_type = "f32"};
    hl_status st = model_load(p, NULL, &m, &err);
    if (!st) st = model_ctx_create(m, 1, 0, &c, &err);
    if (!st) st = runner_create(m, &cfg, &r, &err);
    float want[64], got[64];
    if (!st) st = model_embed(c, k_p1, 23, false, want, &err);
    gen_job g = {.r = r};
    pthread_t th;
    bool started = !st && pthread_create(&th, NULL, gen_thread, &g) == 0;
    if (!st) st = runner_embed(r, k_p1, 23, got, &err);
    if (started) pthread_join(th, NULL);
    runner_destroy(r);
    model_ctx_free(c);
    model_free(m);
    CHECK_MSG(st == HL_OK, "%s", err.msg);
    CHECK_EQ_INT(g.st, HL_OK);
    for (int j = 0; j < 64; j++) CHECK_NEAR(got[j], want[j], 1e-5 * (1 + fabs(want[j])));
}

/* ---- over HTTP ---- */

#include "srvproc.h"

/* The in-process embedding of text as the server tokenizes it. */
static bool embed_text(model_ctx *c, const model *m, const char *text, bool normalize, float *out) {
    int32_t ids[256];
    size_t n = 0;
    hl_err err;
    if (tok_encode(model_vocab(m), text, strlen(text), true, true, ids, 256, &n, &err) || n > 256)
        return false;
    return model_embed(c, ids, (int32_t)n, normalize, out, &err) == HL_OK;
}

static bool close_to(const json_t *arr, const float *want, int n, double tol) {
    if ((int)json_array_size(arr) != n) return false;
    for (int j = 0; j < n; j++)
        if (fabs(json_number_value(json_array_get(arr, (size_t)j)) - want[j]) > tol) return false;
    return true;
}

typedef struct http_job {
    const srv_proc *p;
    const char *text;
    json_t *res;
    int status;
} http_job;

static void *http_embed_thread(void *arg) {
    http_job *h = arg;
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"bert\",\"input\":\"%s\"}", h->text);
    h->status = sp_req(h->p, "POST", "/api/embed", body, &h->res);
    return NULL;
}

static const char *const k_texts[] = {"Once upon a time", "Lily went home",
                                      "The cat sat on the mat and looked at the sky", "Tom"};

static void bert_http(srv_proc *p) {
    const char *path = test_shared_path("testdata/arch/bert.gguf");
    model *m = NULL;
    model_ctx *c = NULL;
    CHECK(model_load(path, NULL, &m, NULL) == HL_OK);
    if (model_ctx_create(m, 1, 0, &c, NULL) != HL_OK) {
        model_free(m);
        CHECK(false);
    }
    float want[4][64], raw[64];
    bool ok = embed_text(c, m, "Once upon a time", false, raw);
    for (int i = 0; i < 4 && ok; i++) ok = embed_text(c, m, k_texts[i], true, want[i]);
    model_ctx_free(c);
    model_free(m);
    CHECK(ok);
    CHECK(sp_create_model(p, "bert", path, ""));
    json_t *res = NULL;
    /* /api/embed: normalised, CLS-pooled as the model declares */
    CHECK_EQ_INT(sp_req(p, "POST", "/api/embed",
                        "{\"model\":\"bert\",\"input\":[\"Once upon a time\",\"Lily went home\"]}",
                        &res), 200);
    json_t *e = json_object_get(res, "embeddings");
    bool same = close_to(json_array_get(e, 0), want[0], 64, 1e-6) &&
                close_to(json_array_get(e, 1), want[1], 64, 1e-6);
    json_decref(res);
    CHECK_MSG(same, "/api/embed differs from model_embed");
    /* concurrent requests (batched by the runner) each get their own embedding */
    http_job hj[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        hj[i] = (http_job){.p = p, .text = k_texts[i]};
        pthread_create(&th[i], NULL, http_embed_thread, &hj[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    same = true;
    for (int i = 0; i < 4; i++) {
        same = same && hj[i].status == 200 &&
               close_to(json_array_get(json_object_get(hj[i].res, "embeddings"), 0), want[i], 64,
                        1e-6);
        json_decref(hj[i].res);
    }
    CHECK_MSG(same, "concurrent /api/embed differs from model_embed");
    /* /api/embeddings: the pooled vector, not normalised */
    CHECK_EQ_INT(sp_req(p, "POST", "/api/embeddings",
                        "{\"model\":\"bert\",\"prompt\":\"Once upon a time\"}", &res), 200);
    same = close_to(json_object_get(res, "embedding"), raw, 64, 1e-5);
    json_decref(res);
    CHECK_MSG(same, "/api/embeddings differs from model_embed");
    /* /v1/embeddings */
    CHECK_EQ_INT(sp_req(p, "POST", "/v1/embeddings",
                        "{\"model\":\"bert\",\"input\":\"Lily went home\"}", &res), 200);
    same = close_to(json_object_get(json_array_get(json_object_get(res, "data"), 0), "embedding"),
                    want[1], 64, 1e-6);
    json_decref(res);
    CHECK_MSG(same, "/v1/embeddings differs from model_embed");
    /* no generation from an embedding model: Ollama's 400 */
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate",
                        "{\"model\":\"bert\",\"prompt\":\"hi\",\"stream\":false}", &res), 400);
    const char *msg = json_string_value(json_object_get(res, "error"));
    same = msg && strcmp(msg, "\"bert\" does not support generate") == 0;
    json_decref(res);
    CHECK_MSG(same, "generate error: %s", msg ? msg : "(none)");
    CHECK_EQ_INT(sp_req(p, "POST", "/api/chat",
                        "{\"model\":\"bert\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                        &res), 400);
    msg = json_string_value(json_object_get(res, "error"));
    same = msg && strcmp(msg, "\"bert\" does not support chat") == 0;
    json_decref(res);
    CHECK_MSG(same, "chat error: %s", msg ? msg : "(none)");
    CHECK_EQ_INT(sp_req(p, "POST", "/v1/chat/completions",
                        "{\"model\":\"bert\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                        &res), 400);
    json_decref(res);
    /* and the model still embeds */
    CHECK_EQ_INT(sp_req(p, "POST", "/api/embed", "{\"model\":\"bert\",\"input\":\"Tom\"}", &res),
                 200);
    same = close_to(json_array_get(json_object_get(res, "embeddings"), 0), want[3], 64, 1e-6);
    json_decref(res);
    CHECK(same);
}

TEST(api_embed_bert_end_to_end) {
    if (!test_shared_path("testdata/arch/bert.gguf")) SKIP("testdata/arch/bert.gguf not found");
    /* f32 KV: the served vectors equal model_embed's */
    const char *env[] = {"HEARTH_KV_CACHE_TYPE=f32", NULL};
    SP_WITH_SERVER("bert", env, NULL, bert_http);
}
