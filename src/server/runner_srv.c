/* runner_srv.c - `hearth runner` (runner_srv.h). */
#define _GNU_SOURCE
#include "server/runner_srv.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/cpu.h"
#include "base/file.h"
#include "kernels/kernels.h"
#include "server/engine.h"
#include "server/internal.h"
#include "server/server.h"

static engine *g_eng; /* the one model this process serves */
static int g_token_delay_ms; /* test hook: $HEARTH_RUNNER_TEST_TOKEN_DELAY_MS */
static int g_stall_after;    /* test hook: $HEARTH_RUNNER_TEST_STALL_AFTER_TOKENS */
static pthread_mutex_t g_active_mu = PTHREAD_MUTEX_INITIALIZER;
static struct comp_ctx *g_active; /* running completions (POST /stop finds them here) */

/* The memory figures the server keeps for /api/ps and /metrics (engine_remote.c). */
static json_t *with_mem(json_t *o, const engine_info *info) {
    json_object_set_new(o, "mem_bytes", json_integer((json_int_t)info->mem_bytes));
    json_object_set_new(o, "kv_ram", json_integer((json_int_t)info->kv_ram_bytes));
    json_object_set_new(o, "kv_compressed", json_integer((json_int_t)info->kv_compressed_bytes));
    json_object_set_new(o, "kv_disk", json_integer((json_int_t)info->kv_disk_bytes));
    return o;
}

static enum MHD_Result handle_health(srv_request *r) {
    engine_info info;
    engine_get_info(g_eng, &info);
    return srv_reply_json(
        r, 200,
        with_mem(json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "status", "ok", "pid",
                           (int)getpid(), "n_ctx", info.n_ctx, "n_ctx_train", info.n_ctx_train,
                           "n_embd", info.n_embd, "n_vocab", info.n_vocab, "n_parallel",
                           info.n_parallel, "pooling", info.pooling, "embedding_only",
                           (int)info.embedding_only),
                 &info));
}

typedef struct comp_ctx {
    struct comp_ctx *next; /* in g_active while it runs */
    int64_t id;            /* the client's, for POST /stop */
    atomic_bool stop;
    int32_t *prompt;
    size_t n_prompt;
    int32_t *snapshot_at; /* engine_request.snapshot_at */
    size_t n_snapshot_at;
    int64_t num_predict;
    sampler_opts sp;
    char *format, *think_open, *think_close; /* engine_request's constraint, or NULL */
    char *trigger, *trigger_end;
    bool in_think, trigger_now;
    srv_stream *s;
    uint64_t last_beat_ns;
    int n_sent;
} comp_ctx;

static void comp_free(void *p) {
    comp_ctx *c = p;
    free(c->prompt);
    free(c->format);
    free(c->think_open);
    free(c->think_close);
    free(c->trigger);
    free(c->trigger_end);
    free(c->snapshot_at);
    free(c);
}

static bool comp_token(void *ud, int32_t token, const sampler_out *so) {
    comp_ctx *c = ud;
    json_t *ev = json_pack("{s:i}", "t", token);
    if (c->sp.logprobs && so) {
        json_object_set_new(ev, "l", json_real(so->logprob));
        json_t *k = json_array();
        for (int32_t i = 0; i < so->n_top; i++)
            json_array_append_new(k, json_pack("[i,f]", so->top_tokens[i], so->top_logprobs[i]));
        json_object_set_new(ev, "k", k);
    }
    srv_stream_send(c->s, ev);
    c->last_beat_ns = hl_time_ns();
    /* a runner stuck mid-generation (alive, still answering /health): the server's stall
     * timeout must end the request and kill this process */
    if (g_stall_after > 0 && ++c->n_sent >= g_stall_after)
        for (;;) sleep(1);
    if (g_token_delay_ms > 0) usleep((useconds_t)g_token_delay_ms * 1000);
    return false;
}

/* Polled while queued and between prefill chunks: the heartbeat lets the server notice
 * its own client leaving (it checks between lines). */
static bool comp_cancelled(void *ud) {
    comp_ctx *c = ud;
    uint64_t now = hl_time_ns();
    if (now - c->last_beat_ns > 100000000ULL) {
        c->last_beat_ns = now;
        srv_stream_send(c->s, json_pack("{s:i}", "p", 1));
    }
    return atomic_load(&c->stop) || srv_stream_cancelled(c->s);
}

static void comp_run(srv_stream *s, void *ctx) {
    comp_ctx *c = ctx;
    c->s = s;
    c->last_beat_ns = hl_time_ns();
    pthread_mutex_lock(&g_active_mu);
    c->next = g_active;
    g_active = c;
    pthread_mutex_unlock(&g_active_mu);
    hl_err err = {0};
    engine_stats stats = {0};
    engine_request req = {.prompt = c->prompt, .n_prompt = c->n_prompt, .sp = c->sp,
                          .num_predict = c->num_predict, .on_token = comp_token,
                          .cancelled = comp_cancelled, .format = c->format,
                          .think_open = c->think_open, .think_close = c->think_close,
                          .in_think = c->in_think, .trigger = c->trigger,
                          .trigger_end = c->trigger_end, .trigger_now = c->trigger_now,
                          .ud = c, .snapshot_at = c->snapshot_at,
                          .n_snapshot_at = c->n_snapshot_at};
    hl_status st = engine_generate(g_eng, &req, &stats, &err);
    pthread_mutex_lock(&g_active_mu);
    for (comp_ctx **pp = &g_active; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    pthread_mutex_unlock(&g_active_mu);
    if (srv_stream_cancelled(s)) return;
    /* stopped by the server (a stop string matched there): the stats still go back */
    if (st == HL_ERR_CANCELLED && atomic_load(&c->stop)) st = HL_OK;
    if (st) {
        srv_stream_send(s, json_pack("{s:s, s:i}", "error", err.msg, "code", (int)st));
        return;
    }
    engine_info info;
    engine_get_info(g_eng, &info);
    srv_stream_send(
        s, with_mem(json_pack("{s:b, s:{s:i, s:I, s:i, s:i, s:i, s:i, s:I, s:i}}", "done", 1,
                              "stats", "prompt_eval_count", stats.prompt_eval_count,
                              "prompt_eval_ns", (json_int_t)stats.prompt_eval_ns, "cached_tokens",
                              stats.cached_tokens, "cached_disk", stats.cached_disk,
                              "cached_remote", stats.cached_remote, "eval_count",
                              stats.eval_count, "eval_ns", (json_int_t)stats.eval_ns, "done",
                              (int)stats.done),
                    &info));
}

static double num(const json_t *o, const char *k, double dflt) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static int32_t *token_array(const json_t *a, size_t *n) {
    *n = json_array_size(a);
    int32_t *t = malloc((*n ? *n : 1) * sizeof *t);
    if (!t) return NULL;
    for (size_t i = 0; i < *n; i++) t[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return t;
}

static enum MHD_Result handle_completion(srv_request *r) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    comp_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(req);
        return srv_reply_error(r, 500, "out of memory");
    }
    c->prompt = token_array(json_object_get(req, "prompt"), &c->n_prompt);
    c->snapshot_at = token_array(json_object_get(req, "snapshot_at"), &c->n_snapshot_at);
    c->num_predict = (int64_t)num(req, "num_predict", 0);
    const char *const strs[] = {"format", "think_open", "think_close", "trigger", "trigger_end"};
    char **dst[] = {&c->format, &c->think_open, &c->think_close, &c->trigger, &c->trigger_end};
    bool oom = false;
    for (int i = 0; i < 5; i++) {
        const char *v = json_string_value(json_object_get(req, strs[i]));
        if (v && !(*dst[i] = strdup(v))) oom = true;
    }
    c->in_think = json_is_true(json_object_get(req, "in_think"));
    c->trigger_now = json_is_true(json_object_get(req, "trigger_now"));
    c->id = (int64_t)num(req, "id", 0);
    const json_t *o = json_object_get(req, "options");
    sampler_opts *sp = &c->sp;
    sp->temperature = (float)num(o, "temperature", 0);
    sp->top_k = (int32_t)num(o, "top_k", 0);
    sp->top_p = (float)num(o, "top_p", 0);
    sp->min_p = (float)num(o, "min_p", 0);
    sp->repeat_penalty = (float)num(o, "repeat_penalty", 0);
    sp->repeat_last_n = (int32_t)num(o, "repeat_last_n", 0);
    sp->presence_penalty = (float)num(o, "presence_penalty", 0);
    sp->frequency_penalty = (float)num(o, "frequency_penalty", 0);
    sp->seed = (int64_t)num(o, "seed", 0);
    sp->logprobs = json_is_true(json_object_get(o, "logprobs"));
    sp->top_logprobs = (int32_t)num(o, "top_logprobs", 0);
    sp->order = (sampler_order)num(o, "order", 0);
    json_decref(req);
    if (!c->prompt || !c->snapshot_at || oom) {
        comp_free(c);
        return srv_reply_error(r, 500, "out of memory");
    }
    return srv_stream_run(r, true, comp_run, c, comp_free);
}

static enum MHD_Result handle_embedding(srv_request *r) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    size_t n;
    int32_t *toks = token_array(json_object_get(req, "tokens"), &n);
    json_decref(req);
    engine_info info;
    engine_get_info(g_eng, &info);
    float *vec = malloc((size_t)info.n_embd * sizeof *vec);
    hl_err err = {0};
    hl_status st = toks && vec ? engine_embed(g_eng, toks, n, vec, &err)
                               : hl_fail(&err, HL_ERR_NOMEM, "out of memory");
    free(toks);
    json_t *out;
    if (st) {
        out = json_pack("{s:s, s:i}", "error", err.msg, "code", (int)st);
    } else {
        json_t *a = json_array();
        for (int32_t i = 0; i < info.n_embd; i++) json_array_append_new(a, json_real(vec[i]));
        engine_get_info(g_eng, &info);
        out = with_mem(json_pack("{s:o}", "embedding", a), &info);
    }
    free(vec);
    return srv_reply_json(r, 200, out);
}

/* {"id":N}: ends that completion as if finished (its final line carries the stats). */
static enum MHD_Result handle_stop(srv_request *r) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    int64_t id = (int64_t)num(req, "id", 0);
    json_decref(req);
    bool found = false;
    pthread_mutex_lock(&g_active_mu);
    for (comp_ctx *c = g_active; c; c = c->next)
        if (c->id == id) {
            atomic_store(&c->stop, true);
            found = true;
        }
    pthread_mutex_unlock(&g_active_mu);
    return srv_reply_json(r, 200, json_pack("{s:b}", "stopped", found));
}

static const srv_route k_routes[] = {
    {"/stop", false, "POST", handle_stop, false},
    {"/health", false, "GET", handle_health, false},
    {"/completion", false, "POST", handle_completion, false},
    {"/embedding", false, "POST", handle_embedding, false},
};

/* stdin is the server's lifeline pipe: end of file means the server is gone (a
 * parent-death signal would follow the thread that spawned us, not the server). */
static void *lifeline_main(void *arg) {
    (void)arg;
    char buf[64];
    for (;;) {
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    kill(getpid(), SIGTERM);
    return NULL;
}

static int usage(void) {
    fprintf(stderr, "Error: usage: hearth runner --model PATH --port P [--ctx N] [--batch N] "
                    "[--threads N] [--mmap 0|1]\n");
    return 2;
}

int runner_srv_main(int argc, char **argv) {
    hl_log_init_from_env();
    const char *model = NULL;
    int port = 0;
    engine_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--ctx")) cfg.num_ctx = atoi(v);
        else if (!strcmp(a, "--batch")) cfg.num_batch = atoi(v);
        else if (!strcmp(a, "--threads")) cfg.n_threads = atoi(v);
        else if (!strcmp(a, "--mmap")) cfg.use_mmap = atoi(v) != 0;
        else if (!strcmp(a, "--kv-type")) cfg.kv_type = v;
        else return usage();
        i++;
    }
    if (!model || port <= 0 || port > 65535) return usage();
    const char *sv = getenv(RUNNER_SECRET_ENV);
    if (!sv || strlen(sv) < 16 || strlen(sv) > 64) {
        fprintf(stderr, "Error: %s must hold the secret the server passes its runners\n",
                RUNNER_SECRET_ENV);
        return 2;
    }
    char secret[72];
    snprintf(secret, sizeof secret, "%s", sv);
    unsetenv(RUNNER_SECRET_ENV);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t life;
    if (pthread_create(&life, NULL, lifeline_main, NULL) == 0) pthread_detach(life);
    /* test hooks: slow tokens (crash and cancel tests), a generation that stops after N
     * tokens (stall timeout), a slow load (load timeout), one huge output line (the
     * server must keep draining the pipe) */
    const char *v = getenv("HEARTH_RUNNER_TEST_TOKEN_DELAY_MS");
    g_token_delay_ms = v ? atoi(v) : 0;
    v = getenv("HEARTH_RUNNER_TEST_STALL_AFTER_TOKENS");
    g_stall_after = v ? atoi(v) : 0;
    v = getenv("HEARTH_RUNNER_TEST_LOAD_DELAY_MS");
    if (v && atoi(v) > 0) usleep((useconds_t)atoi(v) * 1000);
    v = getenv("HEARTH_RUNNER_TEST_LONG_LINE");
    if (v && atoi(v) > 0) {
        size_t n = (size_t)atoi(v);
        char *line = malloc(n + 1);
        if (line) {
            memset(line, 'x', n);
            line[n] = '\n';
            fwrite(line, 1, n + 1, stderr);
            fflush(stderr);
            free(line);
        }
    }
    hl_err err = {0};
    if (engine_open_local(model, &cfg, &g_eng, &err) != HL_OK) {
        fprintf(stderr, "Error: %s\n", err.msg);
        return 1;
    }
    server_config sc = {.quiet = 1, .extra_routes = k_routes,
                        .n_extra_routes = sizeof k_routes / sizeof k_routes[0],
                        .route_secret = secret};
    net_host_parse("127.0.0.1", &sc.bind, NULL);
    sc.bind.port = port;
    hl_server *srv;
    if (server_start(&sc, &srv, &err) != HL_OK) {
        fprintf(stderr, "Error: %s\n", err.msg);
        engine_close(g_eng);
        return 1;
    }
    /* what decides speed, for whoever reads the server log (the pool's default when
     * --threads is 0) */
    const int threads = cfg.n_threads > 0 ? cfg.n_threads : hl_cpu_default_threads();
    engine_info info;
    engine_get_info(g_eng, &info);
    HL_INFO("runner: serving %s on 127.0.0.1:%d (pid %d, %d threads, %s kernels, %s KV cache, "
            "%d parallel)",
            model, port, (int)getpid(), threads, kern_variant(),
            hl_type_name(engine_kv_type(g_eng)), (int)info.n_parallel);
    int sig = 0;
    sigwait(&set, &sig);
    server_stop(srv);
    engine_close(g_eng);
    return 0;
}
