/* test_load.c - a bounded load test over loopback: 64 concurrent streaming clients
 * against 3 models (each in its own runner process) with 2 slots and a queue of 8 per
 * runner, a quarter of the clients disconnecting mid-stream. Every request must complete
 * or get a documented error (503 busy), nothing may hang (every socket read has a
 * deadline), and after a second identical round memory is where the first left it:
 * server RSS within a tolerance, each runner's measured size (/api/ps) equal, and
 * exactly one runner process per model (none after unloading). */
#define _GNU_SOURCE
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "srvproc.h"
#include "test.h"

#define N_CLIENTS 64
#define BUSY_MSG "server busy, please try again.  maximum pending requests exceeded"

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }
static const char *tiny(void) { return test_shared_path("models/llama-2-tiny-random.gguf"); }

typedef enum outcome { OUT_NONE, OUT_DONE, OUT_BUSY, OUT_LEFT, OUT_DIED, OUT_BAD } outcome;
#define DIED_MSG "model runner has unexpectedly stopped"

typedef struct client {
    const srv_proc *p;
    int idx;
    const char *model; /* NULL: by index */
    int num_predict;   /* 0: 24 */
    outcome out;
    char detail[200];
} client;

static const char *k_models[3] = {"a", "b", "t"};
static const char *k_prompts[4] = {"Once upon a time", "The cat", "A little girl", "x"};

static void *client_main(void *arg) {
    client *c = arg;
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"%s\",\"options\":{\"num_predict\":%d,"
             "\"temperature\":0}}",
             c->model ? c->model : k_models[c->idx % 3], k_prompts[(c->idx / 3) % 4],
             c->num_predict ? c->num_predict : 24);
    bool leave = c->idx % 4 == 3; /* disconnects after a few lines */
    net_http *h;
    hl_err err;
    c->out = OUT_BAD;
    if (net_http_open(&c->p->host, "POST", "/api/generate", "application/json",
                      (int64_t)strlen(body), &h, &err) != HL_OK) {
        snprintf(c->detail, sizeof c->detail, "connect: %s", err.msg);
        return NULL;
    }
    net_http_set_timeout(h, 20000); /* a hang fails the test instead of blocking it */
    if (net_http_send(h, body, strlen(body), &err) != HL_OK ||
        net_http_finish(h, &err) != HL_OK) {
        snprintf(c->detail, sizeof c->detail, "request: %s", err.msg);
        net_http_close(h);
        return NULL;
    }
    int status = net_http_status(h);
    char *line;
    size_t len;
    int lines = 0;
    json_t *last = NULL;
    while (net_http_read_line(h, &line, &len, &err) == HL_OK && line) {
        json_decref(last);
        last = json_loadb(line, len, 0, NULL);
        if (++lines == 3 && leave && status == 200) {
            c->out = OUT_LEFT;
            break;
        }
    }
    if (c->out != OUT_LEFT) {
        const char *e = json_string_value(json_object_get(last, "error"));
        if (status == 503 && e && !strcmp(e, BUSY_MSG)) {
            c->out = OUT_BUSY;
        } else if ((status == 500 || status == 200) && e && strstr(e, DIED_MSG)) {
            c->out = OUT_DIED; /* documented: the runner crashed under the request */
        } else if (status == 200 && json_is_true(json_object_get(last, "done"))) {
            const char *dr = json_string_value(json_object_get(last, "done_reason"));
            if (dr && (!strcmp(dr, "length") || !strcmp(dr, "stop"))) c->out = OUT_DONE;
            else snprintf(c->detail, sizeof c->detail, "done_reason %s", dr ? dr : "(none)");
        } else {
            snprintf(c->detail, sizeof c->detail, "status %d, %d lines, last error %s (%s)",
                     status, lines, e ? e : "(none)", err.msg);
        }
    }
    json_decref(last);
    net_http_close(h);
    return NULL;
}

static void round_of(const srv_proc *p, int *done, int *busy, int *left) {
    client cl[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        cl[i] = (client){.p = p, .idx = i};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
    *done = *busy = *left = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        CHECK_MSG(cl[i].out != OUT_BAD && cl[i].out != OUT_DIED, "client %d: %s", i,
                  cl[i].out == OUT_DIED ? "runner died" : cl[i].detail);
        *done += cl[i].out == OUT_DONE;
        *busy += cl[i].out == OUT_BUSY;
        *left += cl[i].out == OUT_LEFT;
    }
}

/* Sum of /api/ps sizes once no request runs (a left client's sequence may still be
 * winding down in its runner for a moment). */
static long long ps_total(const srv_proc *p, int *n) {
    json_t *j;
    *n = -1;
    if (sp_req(p, "GET", "/api/ps", NULL, &j) != 200) return -1;
    long long sum = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "models"), i, m) sum += json_integer_value(json_object_get(m, "size"));
    *n = (int)json_array_size(json_object_get(j, "models"));
    json_decref(j);
    return sum;
}

/* Three short requests so that each runner reports its size after the round. */
static void settle(const srv_proc *p) {
    sp_sleep_ms(200);
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"x\",\"stream\":false,"
                 "\"options\":{\"num_predict\":1,\"temperature\":0}}", k_models[i]);
        CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", body, NULL), 200);
    }
}

static void load_body(srv_proc *p) {
    CHECK(sp_create_model(p, "a", stories(), "\"system\":\"a\""));
    CHECK(sp_create_model(p, "b", stories(), "\"system\":\"b\""));
    CHECK(sp_create_model(p, "t", tiny(), ""));
    uint64_t t0 = hl_time_ns();
    int done, busy, left, n;
    round_of(p, &done, &busy, &left); /* warms the caches up to their steady state */
    settle(p);
    long long ps0 = ps_total(p, &n);
    CHECK_EQ_INT(n, 3);
    long rss0 = sp_rss(p->pid);
    pid_t kids[16];
    CHECK_EQ_INT(sp_children(p->pid, kids, 16), 3);
    round_of(p, &done, &busy, &left);
    fprintf(stderr, "    load: %d done, %d busy (503), %d left mid-stream, %.1f s for 2 rounds\n",
            done, busy, left, (double)(hl_time_ns() - t0) / 1e9);
    CHECK(done > 0 && left > 0);
    settle(p);
    long long ps1 = ps_total(p, &n);
    CHECK_EQ_INT(n, 3);
    long rss1 = sp_rss(p->pid);
    fprintf(stderr, "    load: runner memory (ps) %lld -> %lld bytes, server RSS %ld -> %ld bytes\n", ps0,
            ps1, rss0, rss1);
    CHECK_MSG(ps1 <= ps0 + ps0 / 20, "runner memory %lld -> %lld", ps0, ps1);
    CHECK_MSG(rss1 <= rss0 + 16L * 1024 * 1024, "server RSS %ld -> %ld", rss0, rss1);
    CHECK_EQ_INT(sp_children(p->pid, kids, 16), 3);
    /* unloading ends every runner process */
    for (int i = 0; i < 3; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"keep_alive\":0}", k_models[i]);
        CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", body, NULL), 200);
    }
    CHECK_EQ_INT(sp_ps_count(p), 0);
    int left_kids = 0;
    for (int i = 0; i < 40 && (left_kids = sp_children(p->pid, kids, 16)) > 0; i++) sp_sleep_ms(50);
    CHECK_EQ_INT(left_kids, 0);
}

TEST(load_64_streaming_clients_3_models) {
    if (!stories() || !tiny()) SKIP("models/stories260K or llama-2-tiny-random missing");
    /* ASan (make sanitize) would keep freed memory in its quarantine: RSS says nothing */
    static const char *const env[] = {"HEARTH_NUM_PARALLEL=2", "HEARTH_MAX_QUEUE=8",
                                      "ASAN_OPTIONS=quarantine_size_mb=0", NULL};
    srv_proc p;
    int rc = sp_spawn(&p, "load", env);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    if (rc != 0) {
        sp_dump_log(&p);
        sp_stop(&p);
        CHECK_MSG(false, "server did not start");
    }
    load_body(&p);
    bool failed = test_failed();
    int exit_code = sp_stop(&p);
    if (failed || exit_code != 0) sp_dump_log(&p);
    CHECK_EQ_INT(exit_code, 0);
}

/* A runner killed (-9) under 16 streaming clients: each of them ends with a documented
 * outcome and no later than the deadline, and the model serves again right after. */
static void crash_body(srv_proc *p) {
    CHECK(sp_create_model(p, "a", stories(), "\"system\":\"a\""));
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\"}", NULL), 200);
    pid_t kids[4];
    CHECK_EQ_INT(sp_children(p->pid, kids, 4), 1);
    enum { N = 16 };
    client cl[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cl[i] = (client){.p = p, .idx = i, .model = "a", .num_predict = 200};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    sp_sleep_ms(300);
    kill(kids[0], SIGKILL);
    int died = 0, other = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(cl[i].out != OUT_BAD, "client %d: %s", i, cl[i].detail);
        if (cl[i].out == OUT_DIED) died++;
        else other++;
    }
    fprintf(stderr, "    crash: %d runner-died errors, %d other documented outcomes\n", died, other);
    CHECK(died > 0);
    json_t *j;
    CHECK_EQ_INT(sp_req(p, "POST", "/api/generate", "{\"model\":\"a\",\"prompt\":\"x\","
                        "\"stream\":false,\"options\":{\"num_predict\":3}}", &j), 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "eval_count")), 3);
    json_decref(j);
    pid_t now[4];
    CHECK_EQ_INT(sp_children(p->pid, now, 4), 1); /* the new runner only: none leaked */
}

TEST(load_runner_killed_under_16_streams) {
    if (!stories()) SKIP("models/stories260K missing");
    static const char *const env[] = {"HEARTH_NUM_PARALLEL=4", "HEARTH_MAX_QUEUE=8",
                                      "HEARTH_RUNNER_TEST_TOKEN_DELAY_MS=5", NULL};
    srv_proc p;
    int rc = sp_spawn(&p, "crash", env);
    if (rc == 1) SKIP("HEARTH_BIN not set (run through make test)");
    if (rc != 0) {
        sp_dump_log(&p);
        sp_stop(&p);
        CHECK_MSG(false, "server did not start");
    }
    crash_body(&p);
    bool failed = test_failed();
    int exit_code = sp_stop(&p);
    if (failed || exit_code != 0) sp_dump_log(&p);
    CHECK_EQ_INT(exit_code, 0);
}
