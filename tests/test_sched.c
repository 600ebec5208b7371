/* test_sched.c - the loaded-model manager and concurrency end to end: `$HEARTH_BIN serve`
 * with a small residency budget or queue in its environment, driven over loopback.
 * Models: stories260K under several names (different Modelfile SYSTEMs) and
 * llama-2-tiny-random. Every server started is stopped, also on failure. */
#define _GNU_SOURCE
#include <dirent.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "server/sched.h"
#include "srvproc.h"
#include "test.h"

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }
static const char *tiny(void) { return test_shared_path("models/llama-2-tiny-random.gguf"); }

#define WITH_SRV(tag, env, body_fn)                                                      \
    do {                                                                                 \
        if (!stories() || !tiny()) SKIP("models/stories260K or llama-2-tiny-random missing"); \
        SP_WITH_SERVER(tag, env, NULL, body_fn);                                         \
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

/* ---------------- runner processes ---------------- */

/* Opens a streaming /api/generate and reads its first line. */
static net_http *stream_open(const srv_proc *p, const char *body, json_t **first) {
    net_http *h;
    if (net_http_open(&p->host, "POST", "/api/generate", "application/json",
                      (int64_t)strlen(body), &h, NULL) != HL_OK)
        return NULL;
    char *line;
    size_t len;
    if (net_http_send(h, body, strlen(body), NULL) != HL_OK || net_http_finish(h, NULL) != HL_OK ||
        net_http_status(h) != 200 || net_http_read_line(h, &line, &len, NULL) != HL_OK || !line) {
        net_http_close(h);
        return NULL;
    }
    *first = json_loadb(line, len, 0, NULL);
    return h;
}

static pid_t only_child(const srv_proc *p) {
    pid_t kids[8];
    int n = sp_children(p->pid, kids, 8);
    return n == 1 ? kids[0] : -n;
}

static void crash_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    pid_t runner = only_child(p);
    CHECK_MSG(runner > 0, "runner processes: %d", -runner);
    /* kill -9 the runner mid-stream: the stream ends with the documented error */
    json_t *first = NULL;
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":500}}",
                              &first);
    CHECK(h != NULL && first && json_object_get(first, "response"));
    json_decref(first);
    if (runner > 0) kill(runner, SIGKILL);
    const char *msg = NULL;
    json_t *last = NULL;
    char *line;
    size_t len;
    uint64_t t0 = hl_time_ns();
    while (h && net_http_read_line(h, &line, &len, NULL) == HL_OK && line) {
        json_decref(last);
        last = json_loadb(line, len, 0, NULL);
    }
    net_http_close(h);
    CHECK_MSG(hl_time_ns() - t0 < 5000000000ULL, "the stream took too long to end");
    msg = json_string_value(json_object_get(last, "error"));
    CHECK_MSG(msg && strstr(msg, "model runner has unexpectedly stopped"), "last line: %s",
              msg ? msg : "(none)");
    json_decref(last);
    /* not listed as loaded once dead; the next request reloads it in a new runner */
    CHECK(!sp_ps_has(p, "a:latest"));
    json_t *j;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\",\"prompt\":\"x\","
                        "\"stream\":false,\"options\":{\"num_predict\":3}}", &j), 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 3);
    json_decref(j);
    pid_t again = only_child(p);
    CHECK(again > 0 && again != runner);
    CHECK(sp_ps_has(p, "a:latest"));
    /* an idle runner that dies: the next request just reloads */
    if (again > 0) kill(again, SIGKILL);
    sp_sleep_ms(100);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\",\"prompt\":\"x\","
                        "\"stream\":false,\"options\":{\"num_predict\":2}}", &j), 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 2);
    json_decref(j);
}

TEST(sched_runner_crash_is_an_error_then_reload) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=20", NULL};
    WITH_SRV("crash", env, crash_api);
}

static void cancel_api(srv_proc *p) {
    CHECK(make_models(p));
    /* one slot: a client that goes away must free it (the runner cancels its sequence) */
    json_t *first = NULL;
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":500}}",
                              &first);
    CHECK(h != NULL && first);
    json_decref(first);
    net_http_close(h);
    uint64_t t0 = hl_time_ns();
    json_t *j;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\",\"prompt\":\"y\","
                        "\"stream\":false,\"options\":{\"num_predict\":3}}", &j), 200);
    json_decref(j);
    /* 500 tokens at 20 ms would take 10 s */
    CHECK_MSG(hl_time_ns() - t0 < 3000000000ULL, "took %.1f s", (hl_time_ns() - t0) / 1e9);
}

TEST(sched_runner_disconnect_cancels) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=20",
                                      "HEARTH_NUM_PARALLEL=1", NULL};
    WITH_SRV("cancel", env, cancel_api);
}

static void output_api(srv_proc *p) {
    CHECK(make_models(p));
    /* the runner prints a 1 MiB line before loading: no deadlock, passed through whole */
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    char *text;
    size_t len;
    CHECK(hl_file_read(p->log, &text, &len, NULL) == HL_OK);
    if (text) {
        size_t run = 0, best = 0;
        for (size_t i = 0; i < len; i++) {
            run = text[i] == 'x' ? run + 1 : 0;
            if (run > best) best = run;
        }
        CHECK_EQ_INT((long long)best, 1 << 20);
        free(text);
    }
}

TEST(sched_runner_output_passthrough_long_line) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_LONG_LINE=1048576", NULL};
    WITH_SRV("output", env, output_api);
}

static void load_fail_api(srv_proc *p) {
    CHECK(make_models(p));
    /* a load that takes longer than HEARTH_LOAD_TIMEOUT: the error, no runner left */
    json_t *j;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\"}", &j), 500);
    const char *e = json_string_value(json_object_get(j, "error"));
    CHECK_MSG(e && strstr(e, "timed out waiting for llama runner to start"), "%s", e ? e : "");
    json_decref(j);
    CHECK_EQ_INT(sp_ps_count(p), 0);
    pid_t kids[4];
    CHECK_EQ_INT(sp_children(p->pid, kids, 4), 0);
}

TEST(sched_runner_load_timeout) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_LOAD_DELAY_MS=3000",
                                      "HEARTH_LOAD_TIMEOUT=1", NULL};
    WITH_SRV("loadto", env, load_fail_api);
}

static void exit_api(srv_proc *p) {
    /* a runner that exits at once: the exit status and its last line (the api tests
     * cover a model the runner cannot load: its "Error: ..." line) */
    CHECK(make_models(p));
    json_t *j;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\"}", &j), 500);
    const char *e = json_string_value(json_object_get(j, "error"));
    CHECK_MSG(e && strstr(e, "llama runner process has terminated: exit status 127") &&
              strstr(e, "cannot execute the runner"), "%s", e ? e : "");
    json_decref(j);
    CHECK_EQ_INT(sp_ps_count(p), 0);
}

TEST(sched_runner_exit_reports_last_line) {
    static const char *const env[] = {"HEARTH_RUNNER_BIN=/nonexistent/hearth", NULL};
    WITH_SRV("exit", env, exit_api);
}

typedef struct timed_req {
    par_req r;
    uint64_t end_ns;
} timed_req;

static void *timed_main(void *arg) {
    timed_req *t = arg;
    par_main(&t->r);
    t->end_ns = hl_time_ns();
    return NULL;
}

static void busy_not_evicted_api(srv_proc *p) {
    CHECK(make_models(p));
    /* a streams (30 tokens at 20 ms); t needs the only place: it waits for a to finish */
    json_t *first = NULL;
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":30}}",
                              &first);
    CHECK(h != NULL && first);
    json_decref(first);
    timed_req t = {.r = {.p = p, .path = "/api/generate"}};
    snprintf(t.r.body, sizeof t.r.body, "{\"model\":\"t\",\"prompt\":\"x\",\"stream\":false,"
             "\"options\":{\"num_predict\":2}}");
    pthread_t th;
    pthread_create(&th, NULL, timed_main, &t);
    json_t *last = NULL;
    char *line;
    size_t len;
    while (h && net_http_read_line(h, &line, &len, NULL) == HL_OK && line) {
        json_decref(last);
        last = json_loadb(line, len, 0, NULL);
    }
    uint64_t a_end = hl_time_ns();
    net_http_close(h);
    pthread_join(th, NULL);
    /* a was not evicted under its request: it finished normally */
    CHECK_MSG(json_is_true(json_object_get(last, "done")) &&
              (int)json_integer_value(json_object_get(last, "eval_count")) == 30,
              "a ended with %s", json_string_value(json_object_get(last, "error")) ?: "?");
    json_decref(last);
    CHECK_EQ_INT(t.r.status, 200);
    CHECK(t.end_ns >= a_end - 50000000ULL); /* t ran after a */
    json_decref(t.r.reply);
    CHECK(sp_ps_has(p, "t:latest") && !sp_ps_has(p, "a:latest"));
}

TEST(sched_busy_model_not_evicted) {
    static const char *const env[] = {"HEARTH_MAX_LOADED_MODELS=1",
                                      "HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=20", NULL};
    WITH_SRV("busyev", env, busy_not_evicted_api);
}

static void clamp_api(srv_proc *p) {
    CHECK(make_models(p));
    json_t *show;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/show", "{\"model\":\"a\"}", &show), 200);
    long long trained = json_integer_value(
        json_object_get(json_object_get(show, "model_info"), "llama.context_length"));
    json_decref(show);
    CHECK(trained > 0);
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate",
                        "{\"model\":\"a\",\"options\":{\"num_ctx\":10000000}}", NULL), 200);
    json_t *ps;
    CHECK_EQ_INT(sp_req(p, "GET", "/api/ps", NULL, &ps), 200);
    json_t *m = json_array_get(json_object_get(ps, "models"), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(m, "context_length")), trained);
    json_decref(ps);
    /* the in-process engine (HEARTH_RUNNER=inprocess) is covered by the same code path
     * inside the runner; the subprocess default is what every sched_ test runs */
}

TEST(sched_context_clamped_in_ps) {
    static const char *const env[] = {NULL};
    WITH_SRV("clamp", env, clamp_api);
}

static bool process_gone(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] == 'Z';
}

static void orphan_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    pid_t runner = only_child(p);
    CHECK(runner > 0);
    /* the server dies without cleaning up: its runner notices (stdin closes) and exits */
    kill(p->pid, SIGKILL);
    int status;
    waitpid(p->pid, &status, 0);
    p->pid = 0;
    bool gone = false;
    for (int i = 0; i < 100 && runner > 0 && !(gone = process_gone(runner)); i++) sp_sleep_ms(50);
    CHECK_MSG(gone, "runner %d outlived its server", (int)runner);
    if (!gone && runner > 0) kill(runner, SIGKILL);
}

TEST(sched_runner_exits_with_its_server) {
    if (!stories() || !tiny()) SKIP("models/stories260K or llama-2-tiny-random missing");
    srv_proc p;
    int rc = sp_spawn(&p, "orphan", NULL);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    CHECK_MSG(rc == 0, "server did not start");
    if (rc == 0) orphan_api(&p);
    if (p.pid > 0) sp_stop(&p);
}

TEST(sched_inprocess_engine_option) {
    /* HEARTH_RUNNER=inprocess: the same scheduling with the engine in the server */
    static const char *const env[] = {"HEARTH_RUNNER=inprocess", NULL};
    WITH_SRV("inproc", env, resident_api);
}

static void shutdown_api(srv_proc *p) {
    CHECK(make_models(p));
    /* SIGTERM while a runner is still loading: the server exits promptly and cleanly */
    pthread_t th;
    par_req r = {.p = p, .path = "/api/generate"};
    snprintf(r.body, sizeof r.body, "{\"model\":\"a\"}");
    pthread_create(&th, NULL, par_main, &r);
    sp_sleep_ms(300);
    pid_t kids[4];
    CHECK_EQ_INT(sp_children(p->pid, kids, 4), 1);
    uint64_t t0 = hl_time_ns();
    int code = sp_stop(p);
    CHECK_EQ_INT(code, 0);
    CHECK_MSG(hl_time_ns() - t0 < 3000000000ULL, "shutdown took %.1f s", (hl_time_ns() - t0) / 1e9);
    pthread_join(th, NULL);
    json_decref(r.reply);
    /* sp_stop reaped the server; WITH_SRV's own stop then finds nothing to stop */
    p->pid = 0;
}

TEST(sched_shutdown_during_runner_load) {
    if (!stories() || !tiny()) SKIP("models/stories260K or llama-2-tiny-random missing");
    static const char *const env[] = {"HEARTH_RUNNER_TEST_LOAD_DELAY_MS=30000", NULL};
    srv_proc p;
    int rc = sp_spawn(&p, "shut", env);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    CHECK_MSG(rc == 0, "server did not start");
    if (rc == 0) shutdown_api(&p);
    if (test_failed()) sp_dump_log(&p);
    if (p.pid > 0) sp_stop(&p);
}

/* ---------------- stuck runners ---------------- */

/* A whole request with a client-side timeout (a stuck server fails the test instead of
 * hanging it). Returns the HTTP status or -1. */
static int req_within(const srv_proc *p, const char *body, int ms, json_t **out) {
    *out = NULL;
    net_http *h;
    if (net_http_open(&p->host, "POST", "/api/generate", "application/json",
                      (int64_t)strlen(body), &h, NULL) != HL_OK)
        return -1;
    net_http_set_timeout(h, ms);
    int status = -1;
    char *resp = NULL;
    size_t len;
    if (net_http_send(h, body, strlen(body), NULL) == HL_OK && net_http_finish(h, NULL) == HL_OK &&
        net_http_read_all(h, 1 << 20, &resp, &len, NULL) == HL_OK) {
        status = net_http_status(h);
        *out = json_loadb(resp, len, 0, NULL);
    }
    free(resp);
    net_http_close(h);
    return status;
}

/* Whether pid still has a /proc entry (a zombie counts: it was not reaped). */
static bool process_exists(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    return access(path, F_OK) == 0;
}

static void stopped_runner_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    pid_t runner = only_child(p);
    CHECK_MSG(runner > 0, "runner processes: %d", -runner);
    if (runner <= 0) return;
    /* alive but stuck: the next request's health check fails (300 ms), the runner is
     * killed and reaped, and the model is loaded anew for the request */
    kill(runner, SIGSTOP);
    uint64_t t0 = hl_time_ns();
    json_t *j;
    int st = req_within(p, "{\"model\":\"a\",\"prompt\":\"x\",\"stream\":false,"
                           "\"options\":{\"num_predict\":3}}", 4000, &j);
    CHECK_EQ_INT(st, 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 3);
    json_decref(j);
    CHECK_MSG(hl_time_ns() - t0 < 3000000000ULL, "took %.1f s", (hl_time_ns() - t0) / 1e9);
    pid_t again = only_child(p);
    CHECK_MSG(again > 0 && again != runner, "runner %d, then %d", (int)runner, (int)again);
    CHECK_MSG(!process_exists(runner), "the stopped runner %d is still there", (int)runner);
    CHECK_EQ_INT(sp_ps_count(p), 1);
    CHECK(sp_ps_has(p, "a:latest"));
    /* a healthy idle runner passes its check and is reused */
    CHECK_EQ_INT(req_within(p, "{\"model\":\"a\",\"prompt\":\"y\",\"stream\":false,"
                               "\"options\":{\"num_predict\":2}}", 4000, &j), 200);
    json_decref(j);
    CHECK_EQ_INT(only_child(p), again);
    if (process_exists(runner)) { /* let it go so that nothing leaks */
        kill(runner, SIGCONT);
        kill(runner, SIGKILL);
    }
}

TEST(sched_stuck_idle_runner_is_replaced) {
    static const char *const env[] = {"HEARTH_RUNNER_HEALTH_TIMEOUT=300ms", NULL};
    WITH_SRV("stuck", env, stopped_runner_api);
}

TEST(sched_health_timeout_env) {
    const char *old = getenv("HEARTH_RUNNER_HEALTH_TIMEOUT");
    char *saved = old ? strdup(old) : NULL;
    unsetenv("HEARTH_RUNNER_HEALTH_TIMEOUT");
    CHECK_EQ_INT(sched_health_timeout_ms(), 10000);
    setenv("HEARTH_RUNNER_HEALTH_TIMEOUT", "3", 1);
    CHECK_EQ_INT(sched_health_timeout_ms(), 3000);
    setenv("HEARTH_RUNNER_HEALTH_TIMEOUT", "250ms", 1);
    CHECK_EQ_INT(sched_health_timeout_ms(), 250);
    setenv("HEARTH_RUNNER_HEALTH_TIMEOUT", "0", 1);
    CHECK_EQ_INT(sched_health_timeout_ms(), 0);
    setenv("HEARTH_RUNNER_HEALTH_TIMEOUT", "bogus", 1);
    CHECK_EQ_INT(sched_health_timeout_ms(), 10000);
    if (saved) setenv("HEARTH_RUNNER_HEALTH_TIMEOUT", saved, 1);
    else unsetenv("HEARTH_RUNNER_HEALTH_TIMEOUT");
    free(saved);
}

static void stall_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    pid_t runner = only_child(p);
    CHECK(runner > 0);
    /* the runner sends 3 tokens and then nothing: after the stall timeout (500 ms) the
     * stream ends with the runner-stopped error and the runner is killed */
    json_t *first = NULL;
    uint64_t t0 = hl_time_ns();
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":50}}",
                              &first);
    CHECK(h != NULL && first && json_object_get(first, "response"));
    json_decref(first);
    if (h) net_http_set_timeout(h, 4000);
    json_t *last = NULL;
    char *line;
    size_t len;
    while (h && net_http_read_line(h, &line, &len, NULL) == HL_OK && line) {
        json_decref(last);
        last = json_loadb(line, len, 0, NULL);
    }
    net_http_close(h);
    CHECK_MSG(hl_time_ns() - t0 < 3000000000ULL, "took %.1f s", (hl_time_ns() - t0) / 1e9);
    const char *msg = json_string_value(json_object_get(last, "error"));
    CHECK_MSG(msg && strstr(msg, "model runner has unexpectedly stopped, this may be due to "
                                 "resource limitations or an internal error"),
              "last line: %s", msg ? msg : "(none)");
    json_decref(last);
    CHECK_MSG(runner <= 0 || !process_exists(runner), "the stalled runner %d is still there",
              (int)runner);
    /* the server is fine: the next request (short of the stall) works in a new runner */
    json_t *j;
    CHECK_EQ_INT(req_within(p, "{\"model\":\"a\",\"prompt\":\"y\",\"stream\":false,"
                               "\"options\":{\"num_predict\":2}}", 4000, &j), 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 2);
    json_decref(j);
    pid_t again = only_child(p);
    CHECK(again > 0 && again != runner);
    CHECK_EQ_INT(sp_ps_count(p), 1);
}

TEST(sched_runner_stall_timeout) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_STALL_AFTER_TOKENS=3",
                                      "HEARTH_RUNNER_STALL_TIMEOUT=500ms", NULL};
    WITH_SRV("stall", env, stall_api);
}

static void stall_disconnect_api(srv_proc *p) {
    CHECK(make_models(p));
    /* a client that leaves a stalled stream frees its model: t (which needs the only
     * place) loads at once, long before the stall timeout (default 5 min) */
    json_t *first = NULL;
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":50}}",
                              &first);
    CHECK(h != NULL && first);
    json_decref(first);
    sp_sleep_ms(200);
    net_http_close(h);
    uint64_t t0 = hl_time_ns();
    json_t *j;
    CHECK_EQ_INT(req_within(p, "{\"model\":\"t\",\"prompt\":\"y\",\"stream\":false,"
                               "\"options\":{\"num_predict\":2}}", 4000, &j), 200);
    json_decref(j);
    CHECK_MSG(hl_time_ns() - t0 < 3000000000ULL, "took %.1f s", (hl_time_ns() - t0) / 1e9);
    CHECK(sp_ps_has(p, "t:latest") && !sp_ps_has(p, "a:latest"));
    pid_t kids[4];
    CHECK_EQ_INT(sp_children(p->pid, kids, 4), 1);
}

TEST(sched_runner_stall_client_leaves) {
    static const char *const env[] = {"HEARTH_RUNNER_TEST_STALL_AFTER_TOKENS=3",
                                      "HEARTH_MAX_LOADED_MODELS=1", NULL};
    WITH_SRV("stalldc", env, stall_disconnect_api);
}

typedef struct bg_req {
    const srv_proc *p;
    const char *body;
    int status;
    json_t *out;
    pthread_t th;
} bg_req;

static void *bg_req_main(void *arg) {
    bg_req *b = arg;
    b->status = req_within(b->p, b->body, 20000, &b->out);
    return NULL;
}

static void sigstop_api(srv_proc *p) {
    CHECK(make_models(p));
    /* mid-decode (a token every 50 ms), the runner is stopped with SIGSTOP: alive, but it
     * sends nothing, not even heartbeats */
    json_t *first = NULL;
    net_http *h = stream_open(p, "{\"model\":\"a\",\"prompt\":\"x\",\"options\":{\"num_predict\":400}}",
                              &first);
    CHECK(h != NULL && first && json_object_get(first, "response"));
    json_decref(first);
    pid_t runner = only_child(p);
    CHECK_MSG(runner > 0, "runner processes: %d", -runner);
    if (!h || runner <= 0) {
        net_http_close(h);
        return;
    }
    kill(runner, SIGSTOP);
    uint64_t t0 = hl_time_ns();
    /* a second request for the model queues on the stopped runner and gets nothing */
    bg_req q = {.p = p, .body = "{\"model\":\"a\",\"prompt\":\"y\",\"stream\":false,"
                                "\"options\":{\"num_predict\":3,\"temperature\":0}}"};
    bool started = pthread_create(&q.th, NULL, bg_req_main, &q) == 0;
    CHECK(started);
    /* the in-flight stream ends with an error line within the stall timeout (2 s) */
    net_http_set_timeout(h, 10000);
    json_t *last = NULL;
    char *line;
    size_t len;
    while (net_http_read_line(h, &line, &len, NULL) == HL_OK && line) {
        json_decref(last);
        last = json_loadb(line, len, 0, NULL);
    }
    net_http_close(h);
    double took = (double)(hl_time_ns() - t0) / 1e9;
    CHECK_MSG(took < 2.0 + 2.5, "the stream ended after %.1f s", took);
    const char *msg = json_string_value(json_object_get(last, "error"));
    CHECK_MSG(msg && strstr(msg, "model runner has unexpectedly stopped") &&
                  strstr(msg, "sent nothing"),
              "last line: %s", msg ? msg : "(none)");
    json_decref(last);
    /* the queued one runs on a fresh runner and succeeds */
    if (started) pthread_join(q.th, NULL);
    CHECK_MSG(q.status == 200, "queued request: %d %s", q.status,
              json_string_value(json_object_get(q.out, "error")) ?: "");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(q.out, "eval_count")), 3);
    json_decref(q.out);
    CHECK_MSG(!process_exists(runner), "the stopped runner %d is still there", (int)runner);
    pid_t again = only_child(p);
    CHECK_MSG(again > 0 && again != runner, "runner %d, then %d", (int)runner, (int)again);
    if (process_exists(runner)) {
        kill(runner, SIGCONT);
        kill(runner, SIGKILL);
    }
}

TEST(sched_sigstopped_runner_fails_inflight_retries_queued) {
    static const char *const env[] = {"HEARTH_RUNNER_STALL_TIMEOUT=2s",
                                      "HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=50", NULL};
    WITH_SRV("sigstop", env, sigstop_api);
}

static void queued_beats_api(srv_proc *p) {
    CHECK(make_models(p));
    /* one slot, a token every 100 ms: b waits ~3 s in the runner's queue behind a, twice
     * the stall timeout; the runner's heartbeats keep both alive */
    bg_req a = {.p = p, .body = "{\"model\":\"a\",\"prompt\":\"x\",\"stream\":false,"
                                "\"options\":{\"num_predict\":30}}"};
    bg_req b = {.p = p, .body = "{\"model\":\"a\",\"prompt\":\"z\",\"stream\":false,"
                                "\"options\":{\"num_predict\":2}}"};
    CHECK_EQ_INT(load(p, "a", "10m"), 200);
    pid_t runner = only_child(p);
    bool sa = pthread_create(&a.th, NULL, bg_req_main, &a) == 0;
    sp_sleep_ms(300);
    bool sb = pthread_create(&b.th, NULL, bg_req_main, &b) == 0;
    if (sa) pthread_join(a.th, NULL);
    if (sb) pthread_join(b.th, NULL);
    CHECK_MSG(a.status == 200, "a: %d %s", a.status,
              json_string_value(json_object_get(a.out, "error")) ?: "");
    CHECK_MSG(b.status == 200, "b: %d %s", b.status,
              json_string_value(json_object_get(b.out, "error")) ?: "");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(a.out, "eval_count")), 30);
    json_decref(a.out);
    json_decref(b.out);
    CHECK_EQ_INT(only_child(p), runner); /* never killed */
}

TEST(sched_runner_queue_heartbeats) {
    static const char *const env[] = {"HEARTH_RUNNER_STALL_TIMEOUT=1500ms",
                                      "HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=100",
                                      "HEARTH_NUM_PARALLEL=1", NULL};
    WITH_SRV("beats", env, queued_beats_api);
}

/* ---- one memory budget (HEARTH_MAX_MEMORY) with KV paged to disk ---- */

#define MEM_N_CONV 10
static const char *const k_mem_models[] = {"t", "a", "b"}; /* the largest first */
static char g_mem_env[64];
static uint64_t g_mem_budget;

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Three models resident together, each left with a KV share of ~1.5 MiB (sched.h). */
static void mem_budget_env(void) {
    uint64_t files = file_bytes(tiny()) + 2 * file_bytes(stories());
    g_mem_budget = SCHED_SERVER_RESERVE + files + 3 * SCHED_RUNNER_OVERHEAD +
                   3 * (SCHED_KV_MIN + ((uint64_t)512 << 10));
    snprintf(g_mem_env, sizeof g_mem_env, "HEARTH_MAX_MEMORY=%" PRIu64, g_mem_budget);
}

/* A long conversation of its own for each i (no shared prefix beyond a few tokens). */
static void mem_prompt(int i, char *out, size_t cap) {
    static const char *const words[] = {"cat", "dog", "sun", "tree", "ball", "girl", "boy",
                                        "park", "red", "big", "happy", "run", "jump", "sky"};
    size_t n = (size_t)snprintf(out, cap, "Story %d:", i);
    unsigned x = 2654435761u * (unsigned)(i + 1);
    for (int w = 0; w < 110 && n + 16 < cap; w++) {
        x = x * 1103515245u + 12345u;
        n += (size_t)snprintf(out + n, cap - n, " %s", words[(x >> 16) % 14]);
    }
}

/* Runs every conversation on every model; resp[m][i] gets the answers (malloc'd). */
static bool mem_run_all(const srv_proc *p, char *resp[3][MEM_N_CONV]) {
    bool ok = true;
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < MEM_N_CONV; i++) {
            char prompt[2048], body[4096];
            mem_prompt(i, prompt, sizeof prompt);
            snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s\",\"stream\":false,"
                     "\"keep_alive\":\"10m\",\"options\":{\"num_predict\":24,"
                     "\"temperature\":0,\"num_ctx\":512}}", k_mem_models[m], prompt);
            json_t *j = NULL;
            int st = sp_req(p, "POST", "/api/generate", body, &j);
            const char *r = json_string_value(json_object_get(j, "response"));
            if (st != 200 || !r) {
                test_fail_at(__FILE__, __LINE__, "%s #%d: %d %s", k_mem_models[m], i, st,
                             json_string_value(json_object_get(j, "error")) ?: "");
                ok = false;
            }
            resp[m][i] = strdup(r ? r : "");
            json_decref(j);
        }
    return ok;
}

static void mem_free_all(char *resp[3][MEM_N_CONV]) {
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < MEM_N_CONV; i++) free(resp[m][i]);
}

static int g_spill_files;
static int count_file(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)path, (void)ftw;
    if (flag == FTW_F && S_ISREG(sb->st_mode) && sb->st_size > 0) g_spill_files++;
    return 0;
}

static int spill_files(const srv_proc *p) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/kvspill", p->models);
    g_spill_files = 0;
    nftw(dir, count_file, 16, FTW_PHYS);
    return g_spill_files;
}

static int spill_dirs(const srv_proc *p) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/kvspill", p->models);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* ASan's shadow memory and quarantine inflate every process's RSS: the budget bounds
 * what hearth allocates, so the RSS checks run in builds without it. */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_CHECKED 0
#endif
#endif
#ifndef RSS_CHECKED
#define RSS_CHECKED 1
#endif

/* VmRSS of the server and its runners together. */
static uint64_t total_rss(const srv_proc *p) {
    pid_t kids[16];
    int n = sp_children(p->pid, kids, 16);
    uint64_t sum = (uint64_t)sp_rss(p->pid);
    for (int i = 0; i < n; i++) sum += (uint64_t)sp_rss(kids[i]);
    return sum;
}

static char *g_ample[3][MEM_N_CONV];

static void mem_ample_api(srv_proc *p) {
    CHECK(make_models(p));
    CHECK(mem_run_all(p, g_ample));
}

static void mem_tight_api(srv_proc *p) {
    CHECK(make_models(p));
    char *first[3][MEM_N_CONV] = {{0}}, *again[3][MEM_N_CONV] = {{0}};
    CHECK(mem_run_all(p, first));
    /* all three stay loaded, and the server with its runners stays under the budget */
    CHECK_EQ_INT(sp_ps_count(p), 3);
    CHECK_EQ_INT(sp_children(p->pid, (pid_t[8]){0}, 8), 3);
    uint64_t rss = total_rss(p);
    CHECK_MSG(rss > 0 && (!RSS_CHECKED || rss < g_mem_budget),
              "RSS %" PRIu64 " KiB, budget %" PRIu64 " KiB", rss >> 10, g_mem_budget >> 10);
    /* the cached conversations did not fit in the KV budgets: paged out to disk */
    CHECK_EQ_INT(spill_dirs(p), 3);
    int files = spill_files(p);
    CHECK_MSG(files > 0, "no KV spilled under %s/kvspill", p->models);
    /* every conversation again: their KV comes back from the disk with the same result */
    CHECK(mem_run_all(p, again));
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < MEM_N_CONV; i++) {
            CHECK_MSG(first[m][i] && again[m][i] && !strcmp(first[m][i], again[m][i]),
                      "%s #%d: \"%s\" then \"%s\"", k_mem_models[m], i, first[m][i],
                      again[m][i]);
            CHECK_MSG(first[m][i] && g_ample[m][i] && !strcmp(first[m][i], g_ample[m][i]),
                      "%s #%d: \"%s\" with an ample budget, \"%s\" under a tight one",
                      k_mem_models[m], i, g_ample[m][i], first[m][i]);
        }
    rss = total_rss(p);
    CHECK_MSG(!RSS_CHECKED || rss < g_mem_budget, "RSS %" PRIu64 " KiB, budget %" PRIu64 " KiB",
              rss >> 10, g_mem_budget >> 10);
    /* an unloaded model's runner leaves no spill directory behind */
    CHECK_EQ_INT(load(p, "a", "0"), -2);
    for (int i = 0; i < 100 && spill_dirs(p) != 2; i++) sp_sleep_ms(20);
    CHECK_EQ_INT(spill_dirs(p), 2);
    mem_free_all(first);
    mem_free_all(again);
}

TEST(sched_memory_budget_pages_kv_to_disk) {
    static const char *const ample[] = {"HEARTH_KV_SPILL_DIR=off", NULL};
    WITH_SRV("memample", ample, mem_ample_api);
    mem_budget_env();
    const char *const tight[] = {g_mem_env, NULL};
    WITH_SRV("memtight", tight, mem_tight_api);
    mem_free_all(g_ample);
}

TEST(sched_memory_budget_env) {
    CHECK_EQ_INT(sched_parse_bytes("4GiB"), (uint64_t)4 << 30);
    CHECK_EQ_INT(sched_parse_bytes("512MiB"), (uint64_t)512 << 20);
    CHECK_EQ_INT(sched_parse_bytes("512M"), (uint64_t)512 << 20);
    CHECK_EQ_INT(sched_parse_bytes("1.5G"), (uint64_t)3 << 29);
    CHECK_EQ_INT(sched_parse_bytes("64K"), 65536);
    CHECK_EQ_INT(sched_parse_bytes("123"), 123);
    CHECK_EQ_INT(sched_parse_bytes("2TB"), (uint64_t)2 << 40);
    CHECK_EQ_INT(sched_parse_bytes("lots"), 0);
    CHECK_EQ_INT(sched_parse_bytes("4GiBs"), 0);
    CHECK_EQ_INT(sched_parse_bytes("-1G"), 0);
    const char *old = getenv("HEARTH_MAX_MEMORY");
    char *saved = old ? strdup(old) : NULL;
    setenv("HEARTH_MAX_MEMORY", "3GiB", 1);
    CHECK_EQ_INT(sched_memory_budget(), (uint64_t)3 << 30);
    /* the default: 90% of the machine's memory less a margin, never all of it */
    unsetenv("HEARTH_MAX_MEMORY");
    uint64_t dflt = sched_memory_budget();
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    uint64_t total = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    CHECK(dflt >= ((uint64_t)256 << 20));
    CHECK_MSG(total == 0 || dflt < total, "default %" PRIu64 " of %" PRIu64, dflt, total);
    if (saved) setenv("HEARTH_MAX_MEMORY", saved, 1);
    free(saved);
}

/* A starting server removes the spill directories of servers that are gone, not those of
 * live ones (two servers may share a models directory). */
TEST(sched_removes_stale_spill_dirs) {
    char root[1024], dead[1200], live[1200], file[1300];
    snprintf(root, sizeof root, "%s/stale-models", test_tmpdir());
    snprintf(dead, sizeof dead, "%s/kvspill", root);
    mkdir(root, 0700);
    mkdir(dead, 0700);
    snprintf(live, sizeof live, "%s/kvspill/%d-1", root, (int)getpid());
    snprintf(dead, sizeof dead, "%s/kvspill/2147483600-1", root); /* past any pid_max */
    CHECK(mkdir(live, 0700) == 0 && mkdir(dead, 0700) == 0);
    snprintf(file, sizeof file, "%s/block-0", dead);
    CHECK(hl_file_write(file, "kv", 2, NULL) == HL_OK);
    const char *old = getenv("HEARTH_KV_SPILL_DIR");
    char *saved = old ? strdup(old) : NULL;
    unsetenv("HEARTH_KV_SPILL_DIR");
    sched *s = NULL;
    hl_status st = sched_create(root, &s, NULL);
    if (saved) setenv("HEARTH_KV_SPILL_DIR", saved, 1);
    free(saved);
    CHECK(st == HL_OK);
    sched_destroy(s);
    CHECK_MSG(access(dead, F_OK) != 0, "%s is still there", dead);
    CHECK_MSG(access(live, F_OK) == 0, "%s was removed", live);
}
