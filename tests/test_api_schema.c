/* test_api_schema.c - constrained decoding end to end (src/grammar through the server):
 * JSON schemas in Ollama's `format`, OpenAI's `response_format` and the Responses API's
 * `text.format` on stories260K and
 * llama-2-tiny-random, sampled at temperature 1, several requests in one batch with
 * different schemas; the official npm clients' structured-output helpers; 400s naming
 * an unsupported keyword. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "schema_check.h"
#include "schemas.h"
#include "srvproc.h"
#include "test.h"

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }
static const char *tiny(void) { return test_shared_path("models/llama-2-tiny-random.gguf"); }

enum { EP_GENERATE, EP_CHAT, EP_OAI_CHAT, EP_OAI_COMPLETION, EP_RESPONSES, EP_COUNT };

typedef struct job {
    const char *model;
    size_t schema;
    int seed, ep;
} job;

typedef struct pool {
    const srv_proc *p;
    job *jobs;
    size_t n, next;
    pthread_mutex_t mu;
    char fail[4096]; /* the first failure */
    int n_fail, n_ok;
} pool;

static json_t *request_body(const job *j, const json_t *schema) {
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Once upon a time");
    switch (j->ep) {
    case EP_GENERATE:
        return json_pack("{s:s, s:s, s:O, s:b, s:{s:f, s:i, s:i}}", "model", j->model, "prompt",
                         "Once upon a time", "format", schema, "stream", 0, "options", "temperature",
                         1.0, "seed", j->seed, "num_predict", 3000);
    case EP_CHAT:
        return json_pack("{s:s, s:o, s:O, s:b, s:{s:f, s:i, s:i}}", "model", j->model, "messages",
                         msgs, "format", schema, "stream", 0, "options", "temperature", 1.0, "seed",
                         j->seed, "num_predict", 3000);
    case EP_OAI_CHAT:
        return json_pack("{s:s, s:o, s:{s:s, s:{s:s, s:O, s:b}}, s:f, s:i, s:i}", "model", j->model,
                         "messages", msgs, "response_format", "type", "json_schema", "json_schema",
                         "name", "x", "schema", schema, "strict", 1, "temperature", 1.0, "seed",
                         j->seed, "max_tokens", 3000);
    case EP_RESPONSES: /* no seed in the Responses API: a fresh draw each run */
        json_decref(msgs);
        return json_pack("{s:s, s:s, s:{s:{s:s, s:s, s:O, s:b}}, s:f, s:i}", "model", j->model,
                         "input", "Once upon a time", "text", "format", "type", "json_schema",
                         "name", "x", "schema", schema, "strict", 1, "temperature", 1.0,
                         "max_output_tokens", 3000);
    default:
        json_decref(msgs);
        return json_pack("{s:s, s:s, s:{s:s, s:{s:s, s:O}}, s:f, s:i, s:i}", "model", j->model,
                         "prompt", "Once upon a time", "response_format", "type", "json_schema",
                         "json_schema", "name", "x", "schema", schema, "temperature", 1.0, "seed",
                         j->seed, "max_tokens", 3000);
    }
}

static const char *const k_paths[EP_COUNT] = {"/api/generate", "/api/chat", "/v1/chat/completions",
                                              "/v1/completions", "/v1/responses"};

/* The generated text and how the run ended, per endpoint. */
static void answer(int ep, const json_t *r, const char **text, const char **why) {
    const json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
    switch (ep) {
    case EP_GENERATE:
        *text = json_string_value(json_object_get(r, "response"));
        *why = json_string_value(json_object_get(r, "done_reason"));
        break;
    case EP_CHAT:
        *text = json_string_value(json_object_get(json_object_get(r, "message"), "content"));
        *why = json_string_value(json_object_get(r, "done_reason"));
        break;
    case EP_OAI_CHAT:
        *text = json_string_value(json_object_get(json_object_get(c0, "message"), "content"));
        *why = json_string_value(json_object_get(c0, "finish_reason"));
        break;
    case EP_RESPONSES: {
        size_t i;
        json_t *item;
        json_array_foreach(json_object_get(r, "output"), i, item) {
            const char *type = json_string_value(json_object_get(item, "type"));
            if (!type || strcmp(type, "message")) continue;
            *text = json_string_value(
                json_object_get(json_array_get(json_object_get(item, "content"), 0), "text"));
        }
        const char *st = json_string_value(json_object_get(r, "status"));
        *why = st && !strcmp(st, "completed") ? "stop" : st;
        break;
    }
    default:
        *text = json_string_value(json_object_get(c0, "text"));
        *why = json_string_value(json_object_get(c0, "finish_reason"));
    }
}

static void record(pool *pl, const job *j, const char *what, const char *text) {
    pthread_mutex_lock(&pl->mu);
    if (!pl->n_fail++)
        snprintf(pl->fail, sizeof pl->fail, "%s schema %zu seed %d via %s: %s: %.1500s", j->model,
                 j->schema, j->seed, k_paths[j->ep], what, text ? text : "(none)");
    pthread_mutex_unlock(&pl->mu);
}

static void *worker(void *arg) {
    pool *pl = arg;
    for (;;) {
        pthread_mutex_lock(&pl->mu);
        size_t i = pl->next++;
        pthread_mutex_unlock(&pl->mu);
        if (i >= pl->n) return NULL;
        const job *j = &pl->jobs[i];
        json_t *schema = json_loads(k_test_schemas[j->schema], 0, NULL);
        json_t *body = request_body(j, schema);
        char *b = json_dumps(body, JSON_COMPACT);
        json_t *r = NULL;
        int st = sp_req(pl->p, "POST", k_paths[j->ep], b, &r);
        free(b);
        json_decref(body);
        const char *text = NULL, *why = NULL;
        if (st == 200) answer(j->ep, r, &text, &why);
        char msg[600];
        json_error_t je;
        json_t *v = text ? json_loads(text, JSON_DECODE_ANY, &je) : NULL;
        if (st != 200) {
            char *raw = r ? json_dumps(r, JSON_COMPACT) : NULL;
            snprintf(msg, sizeof msg, "HTTP %d %.300s", st, raw ? raw : "");
            free(raw);
            record(pl, j, msg, text);
        } else if (!why || strcmp(why, "stop")) {
            record(pl, j, "did not end by itself", text);
        } else if (!v) {
            snprintf(msg, sizeof msg, "not JSON (%s)", je.text);
            record(pl, j, msg, text);
        } else if (!schema_check(v, schema, schema, msg, sizeof msg)) {
            record(pl, j, msg, text);
        } else {
            if (getenv("HEARTH_TEST_SHOW")) /* to read what the models wrote */
                fprintf(stderr, "    %s #%zu %s: %s\n", j->model, j->schema, k_paths[j->ep], text);
            pthread_mutex_lock(&pl->mu);
            pl->n_ok++;
            pthread_mutex_unlock(&pl->mu);
        }
        json_decref(v);
        json_decref(r);
        json_decref(schema);
    }
}

/* Every schema, two seeds, on both models, spread over the five endpoints; four
 * requests at a time so that sequences with different schemas share batches. */
static void samples_api(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), ""));
    CHECK(sp_create_model(p, "tiny", tiny(), ""));
    const char *models[] = {"s260", "tiny"};
    size_t n = 2 * N_TEST_SCHEMAS * 2;
    job *jobs = calloc(n, sizeof *jobs);
    CHECK(jobs);
    size_t k = 0;
    for (int m = 0; m < 2; m++)
        for (size_t s = 0; s < N_TEST_SCHEMAS; s++)
            for (int seed = 1; seed <= 2; seed++, k++)
                jobs[k] = (job){models[m], s, seed + (int)s * 10, (int)(k % EP_COUNT)};
    pool pl = {.p = p, .jobs = jobs, .n = n};
    pthread_mutex_init(&pl.mu, NULL);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, &pl);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&pl.mu);
    free(jobs);
    CHECK_MSG(pl.n_fail == 0, "%d of %zu failed; first: %s", pl.n_fail, n, pl.fail);
    CHECK_EQ_INT(pl.n_ok, (long long)n);
}

static const char *const k_env4[] = {"HEARTH_NUM_PARALLEL=4", NULL};

TEST(api_schema_samples_validate) {
    if (!stories() || !tiny()) SKIP("models/stories260K or models/llama-2-tiny-random.gguf not found");
    SP_WITH_SERVER("schema", k_env4, NULL, samples_api);
}

/* A schema the grammar cannot enforce is refused before any work, naming the keyword. */
static void errors_api(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), ""));
    static const char *const bodies[] = {
        "{\"model\":\"s260\",\"prompt\":\"a\",\"format\":{\"type\":\"object\",\"properties\":"
        "{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}}",
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"format\":"
        "{\"not\":{\"type\":\"null\"}}}",
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":"
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"array\","
        "\"uniqueItems\":true}}}}",
        "{\"model\":\"s260\",\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"number\",\"multipleOf\":2}}}}",
    };
    static const char *const paths[] = {"/api/generate", "/api/chat", "/v1/chat/completions",
                                        "/v1/completions"};
    static const char *const words[] = {
        "\"pattern\" (only (?: ) groups are supported) at #/properties/a", "\"not\"",
        "\"uniqueItems\"", "\"multipleOf\""};
    for (int i = 0; i < 4; i++) {
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", paths[i], bodies[i], &r), 400);
        const json_t *e = json_object_get(r, "error");
        const char *msg = json_is_string(e) ? json_string_value(e)
                                            : json_string_value(json_object_get(e, "message"));
        CHECK_MSG(msg && strstr(msg, words[i]), "%s: %s", paths[i], msg ? msg : "(no message)");
        json_decref(r);
    }
}

/* Anthropic's structured outputs (output_format, or output_config.format). */
static void anthropic_api(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), ""));
    for (int i = 0; i < 4; i++) {
        const char *schema = k_test_schemas[i == 0 ? 0 : i == 1 ? 9 : i == 2 ? 16 : 19];
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"model\":\"s260\",\"max_tokens\":3000,\"temperature\":1,\"messages\":[{\"role\":"
                 "\"user\",\"content\":\"Once upon a time\"}],%s%s}}%s",
                 i % 2 ? "\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":"
                       : "\"output_format\":{\"type\":\"json_schema\",\"schema\":",
                 schema, i % 2 ? "}" : "");
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/v1/messages", body, &r), 200);
        const char *text = json_string_value(
            json_object_get(json_array_get(json_object_get(r, "content"), 0), "text"));
        json_t *sj = json_loads(schema, 0, NULL), *v = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
        char why[512] = "not JSON";
        bool ok = v && schema_check(v, sj, sj, why, sizeof why);
        CHECK_MSG(ok, "%s: %s", why, text ? text : "(no text)");
        CHECK_MSG(!strcmp(json_string_value(json_object_get(r, "stop_reason")), "end_turn"), "%s",
                  json_string_value(json_object_get(r, "stop_reason")));
        json_decref(v);
        json_decref(sj);
        json_decref(r);
    }
    json_t *r = NULL;
    CHECK_EQ_INT(sp_req(p, "POST", "/v1/messages",
                        "{\"model\":\"s260\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
                        "\"content\":\"a\"}],\"output_format\":{\"type\":\"json_schema\",\"schema\":"
                        "{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}", &r), 400);
    const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
    CHECK_MSG(msg && strstr(msg, "\"pattern\""), "%s", msg ? msg : "(none)");
    json_decref(r);
}

TEST(api_schema_anthropic_output_format) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("schema_anth", NULL, NULL, anthropic_api);
}

TEST(api_schema_unsupported_keyword_400) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    SP_WITH_SERVER("schema_err", NULL, NULL, errors_api);
}

/* The official clients' structured-output helpers (tests/npm/structured.mjs). */
static void npm_api(srv_proc *p) {
    CHECK(sp_create_model(p, "s260", stories(), ""));
    char *text = NULL;
    bool ok = sp_run_node(p, "tests/npm/structured.mjs", "s260", NULL, &text);
    CHECK_MSG(ok, "node: %s", text ? text : "(no output)");
    free(text);
}

TEST(api_npm_structured_outputs) {
    if (!stories()) SKIP("models/stories260K/stories260K.gguf not found");
    if (!sp_node_available()) SKIP("node is not installed (the npm client test needs Node.js)");
    if (access("tests/npm/node_modules/zod/package.json", R_OK) != 0)
        SKIP("tests/npm/node_modules is missing: run `npm ci` in tests/npm (.ci/run does)");
    SP_WITH_SERVER("schema_npm", NULL, NULL, npm_api);
}
