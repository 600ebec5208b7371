/* test_sched.c - the loaded-model manager and concurrency end to end: `$HEARTH_BIN serve`
 * with a small residency budget or queue in its environment, driven over loopback.
 * Models: stories260K under several names (different Modelfile SYSTEMs) and
 * llama-2-tiny-random. Every server started is stopped, also on failure. */
#define _GNU_SOURCE
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/http_client.h"
#include "srvproc.h"
#include "test.h"

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }
static const char *tiny(void) { return test_shared_path("models/llama-2-tiny-random.gguf"); }

#define WITH_SRV(tag, env, body_fn)                                                      \
    do {                                                                                 \
        if (!stories() || !tiny()) SKIP("models/stories260K or llama-2-tiny-random missing"); \
        srv_proc p_;                                                                     \
        int rc_ = sp_spawn(&p_, tag, env);                                               \
        if (rc_ == 1) SKIP("HEARTH_BIN not set (run through make test)");                \
        if (rc_ != 0) {                                                                  \
            sp_dump_log(&p_);                                                            \
            sp_stop(&p_);                                                                \
            CHECK_MSG(false, "server did not start");                                    \
        }                                                                                \
        body_fn(&p_);                                                                    \
        bool failed_ = test_failed();                                                    \
        int exit_ = sp_stop(&p_);                                                        \
        if (failed_ || exit_ != 0) sp_dump_log(&p_);                                     \
        CHECK_EQ_INT(exit_, 0);                                                          \
    } while (0)

static int load(const srv_proc *p, const char *model, const char *keep) {
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"keep_alive\":\"%s\"}", model, keep);
    json_t *j;
    int st = sp_req(p, "POST", "/api/generate", body, &j);
    if (st == 200 && strcmp(json_string_value(json_object_get(j, "done_reason")) ?: "", "load"))
        st = -2;
    json_decref(j);
    return st;
}

static bool make_models(const srv_proc *p) {
    return sp_create_model(p, "a", stories(), "\"system\":\"a\"") &&
           sp_create_model(p, "b", stories(), "\"system\":\"b\"") &&
           sp_create_model(p, "t", tiny(), "");
}

static void resident_api(srv_proc *p) {
    CHECK(make_models(p));
    /* three models resident together (the default allows 3) */
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    CHECK_EQ_INT(load(p, "b", "1m"), 200);
    CHECK_EQ_INT(load(p, "t", "5m"), 200);
    CHECK_EQ_INT(sp_ps_count(p), 3);
    CHECK(sp_ps_has(p, "a:latest") && sp_ps_has(p, "b:latest") && sp_ps_has(p, "t:latest"));
    /* each one generates while the others stay loaded */
    const char *models[] = {"a", "b", "t"};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"hi\",\"stream\":false,"
                 "\"options\":{\"num_predict\":5,\"temperature\":0}}", models[i]);
        json_t *j;
        CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", body, &j), 200);
        CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 5);
        json_decref(j);
    }
    CHECK_EQ_INT(sp_ps_count(p), 3);
    /* ps: context clamped to the trained length, measured sizes */
    json_t *ps;
    CHECK_EQ_INT(sp_req(p, "GET", "/api/ps", NULL, &ps), 200);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(ps, "models"), i, m) {
        CHECK(json_integer_value(json_object_get(m, "size")) > 100000);
        CHECK(json_integer_value(json_object_get(m, "context_length")) > 0);
    }
    json_decref(ps);
    /* keep_alive 0 unloads only that one */
    CHECK_EQ_INT(load(p, "b", "0") , -2); /* done_reason "unload" */
    CHECK_EQ_INT(sp_ps_count(p), 2);
    CHECK(!sp_ps_has(p, "b:latest"));
}

TEST(sched_three_models_resident) {
    static const char *const env[] = {NULL};
    WITH_SRV("resident", env, resident_api);
}

static void evict_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    CHECK_EQ_INT(load(p, "b", "1m"), 200);
    CHECK_EQ_INT(sp_ps_count(p), 2);
    /* the third evicts the idle one with the shortest keep_alive (b) */
    CHECK_EQ_INT(load(p, "t", "5m"), 200);
    CHECK_EQ_INT(sp_ps_count(p), 2);
    CHECK(sp_ps_has(p, "a:latest") && sp_ps_has(p, "t:latest") && !sp_ps_has(p, "b:latest"));
    /* b again: now t (5m) is shorter than a (10m) */
    CHECK_EQ_INT(load(p, "b", "20m"), 200);
    CHECK(sp_ps_has(p, "a:latest") && sp_ps_has(p, "b:latest") && !sp_ps_has(p, "t:latest"));
    /* forever outlasts everything: a (10m) goes next */
    CHECK_EQ_INT(load(p, "t", "-1s"), 200);
    CHECK(sp_ps_has(p, "b:latest") && sp_ps_has(p, "t:latest") && !sp_ps_has(p, "a:latest"));
}

TEST(sched_evicts_shortest_keep_alive_first) {
    static const char *const env[] = {"HEARTH_MAX_LOADED_MODELS=2", NULL};
    WITH_SRV("evict", env, evict_api);
}

static void budget_api(srv_proc *p) {
    CHECK(make_models(p));
    /* a budget smaller than any model: the first always loads, each next one replaces it */
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    CHECK_EQ_INT(load(p, "t", "10m"), 200);
    CHECK_EQ_INT(sp_ps_count(p), 1);
    CHECK(sp_ps_has(p, "t:latest"));
}

TEST(sched_memory_budget_evicts) {
    static const char *const env[] = {"HEARTH_MAX_MEMORY=64K", NULL};
    WITH_SRV("budget", env, budget_api);
}

typedef struct par_req {
    const srv_proc *p;
    const char *path;
    char body[512];
    int status;
    json_t *reply;
} par_req;

static void *par_main(void *arg) {
    par_req *r = arg;
    r->status = sp_req(r->p, "POST", r->path, r->body, &r->reply);
    return NULL;
}

#define BUSY_MSG "server busy, please try again.  maximum pending requests exceeded"

static void run_parallel(par_req *rq, int n) {
    pthread_t th[64];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, par_main, &rq[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void busy_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    enum { N = 16 };
    par_req rq[N];
    for (int i = 0; i < N; i++) {
        rq[i] = (par_req){.p = p};
        if (i % 3 == 0) {
            rq[i].path = "/v1/chat/completions";
            snprintf(rq[i].body, sizeof rq[i].body, "{\"model\":\"a\",\"max_tokens\":400,"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
        } else if (i % 3 == 1) {
            rq[i].path = "/v1/messages";
            snprintf(rq[i].body, sizeof rq[i].body, "{\"model\":\"a\",\"max_tokens\":400,"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
        } else {
            rq[i].path = "/api/generate";
            snprintf(rq[i].body, sizeof rq[i].body, "{\"model\":\"a\",\"prompt\":\"x\","
                     "\"stream\":false,\"options\":{\"num_predict\":400}}");
        }
    }
    run_parallel(rq, N);
    int ok = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        if (rq[i].status == 200) ok++;
        if (rq[i].status == 503) {
            busy++;
            json_t *e = json_object_get(rq[i].reply, "error");
            const char *msg = json_is_string(e) ? json_string_value(e)
                                                : json_string_value(json_object_get(e, "message"));
            CHECK_STR(msg ?: "", BUSY_MSG);
            if (i % 3 == 0) /* OpenAI error shape */
                CHECK(json_is_object(e) && json_object_get(e, "type"));
            if (i % 3 == 1) { /* Anthropic error shape */
                CHECK_STR(json_string_value(json_object_get(rq[i].reply, "type")) ?: "", "error");
                CHECK_STR(json_string_value(json_object_get(e, "type")) ?: "", "overloaded_error");
            }
        }
        CHECK_MSG(rq[i].status == 200 || rq[i].status == 503, "request %d: %d", i, rq[i].status);
        json_decref(rq[i].reply);
    }
    CHECK(ok >= 2); /* one active + one queued at least */
    CHECK_MSG(busy >= 1, "no 503 among %d concurrent requests", N);
    /* the server still serves */
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
}

TEST(sched_busy_queue_503) {
    static const char *const env[] = {"HEARTH_NUM_PARALLEL=1", "HEARTH_MAX_QUEUE=1", NULL};
    WITH_SRV("busy", env, busy_api);
}

static void concurrent_api(srv_proc *p) {
    CHECK(make_models(p));
    /* 12 requests over 3 models with room for 1 resident at a time: all served */
    enum { N = 12 };
    par_req rq[N];
    const char *models[] = {"a", "b", "t"};
    for (int i = 0; i < N; i++) {
        rq[i] = (par_req){.p = p, .path = "/api/generate"};
        snprintf(rq[i].body, sizeof rq[i].body, "{\"model\":\"%s\",\"prompt\":\"x\","
                 "\"stream\":false,\"options\":{\"num_predict\":20}}", models[i % 3]);
    }
    run_parallel(rq, N);
    for (int i = 0; i < N; i++) {
        CHECK_MSG(rq[i].status == 200, "request %d: %d", i, rq[i].status);
        CHECK_EQ_INT((int)json_integer_value(json_object_get(rq[i].reply, "eval_count")), 20);
        json_decref(rq[i].reply);
    }
    CHECK_EQ_INT(sp_ps_count(p), 1);
}

TEST(sched_swaps_under_concurrency) {
    static const char *const env[] = {"HEARTH_MAX_LOADED_MODELS=1", NULL};
    WITH_SRV("swap", env, concurrent_api);
}
