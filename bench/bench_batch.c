/*
 * bench_batch.c - continuous batching on a synthetic llama model: aggregate decode
 * tokens/s with 1, 2, 4 and 8 concurrent requests (threads calling runner_generate at
 * once on one runner with 8 parallel slots), and the speedup over one request.
 *
 * Every request has its own random prompt (no cache hits) and decodes greedily. The rate
 * is measured over the window in which all requests of a run are decoding: from the
 * moment the last of them streamed its first token to the moment the first of them
 * finished, tokens streamed in between / window. Each figure is the median of RUNS
 * runs; the concurrency levels take turns (1, 2, 4, 8, 1, 2, ...) so that the load of a
 * shared machine changes all of them alike. cpu-ms/token is the process CPU time
 * (every thread) per token over the same window: what a token costs, whatever else
 * runs on the machine. The forward pass alone (model_eval_batch
 * with 1..8 single-token sequences) is measured the same way, as the ceiling. The model (8 layers, 1024 embedding, 16/4 heads, Q8_0) is written with the GGUF
 * writer into a temporary file, removed once loaded. The machine may be shared: the
 * load average is printed before and after.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "common/synth.h"
#include "kv/block.h"
#include "gguf/gguf.h"
#include "runner/runner.h"
#include "tensor/types.h"

enum {
    N_VOCAB = 2048, N_EMBD = 1024, N_LAYER = 8, N_FF = 2816, N_HEAD = 16, N_HEAD_KV = 4,
    PROMPT = 32, N_GEN = 40, RUNS = 5, MAX_CONC = 8,
};

/* Shared by the requests of one run. */
typedef struct run_state {
    pthread_mutex_t mu;
    int n_conc, n_started, n_finished;
    long tokens;
    uint64_t t0, t1;
    double c0, c1; /* process CPU seconds at t0, t1 */
    long n0, n1;
} run_state;

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double g_cpu_ms_per_tok; /* of the last run's window */

typedef struct req_state {
    run_state *run;
    runner *r;
    int32_t prompt[PROMPT];
    int n_tok;
} req_state;

static bool on_event(void *user, const runner_event *ev) {
    req_state *q = user;
    run_state *s = q->run;
    pthread_mutex_lock(&s->mu);
    if (ev->kind == RUNNER_EV_TOKEN) {
        s->tokens++;
        if (q->n_tok++ == 0 && ++s->n_started == s->n_conc) {
            s->t0 = hl_time_ns();
            s->c0 = cpu_s();
            s->n0 = s->tokens;
        }
    } else if (s->n_finished++ == 0) {
        s->t1 = hl_time_ns();
        s->c1 = cpu_s();
        s->n1 = s->tokens;
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}

static void *request_thread(void *arg) {
    req_state *q = arg;
    runner_request req = {.tokens = q->prompt, .n_tokens = PROMPT, .num_predict = N_GEN,
                          .emit = on_event, .user = q};
    hl_err err;
    if (runner_generate(q->r, &req, NULL, &err)) {
        fprintf(stderr, "generate: %s\n", err.msg);
        exit(1);
    }
    return NULL;
}

/* Aggregate decode tokens/s of one run with n concurrent requests (-1: no window). */
static double one_run(runner *r, int n) {
    run_state s = {.n_conc = n};
    pthread_mutex_init(&s.mu, NULL);
    req_state q[MAX_CONC];
    pthread_t th[MAX_CONC];
    for (int i = 0; i < n; i++) {
        q[i] = (req_state){.run = &s, .r = r};
        for (int k = 0; k < PROMPT; k++)
            q[i].prompt[k] = 3 + (int32_t)((bench_frand() + 1.0f) * 0.5f * (N_VOCAB - 4));
        pthread_create(&th[i], NULL, request_thread, &q[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&s.mu);
    if (!s.t0 || s.t1 <= s.t0 || s.n1 <= s.n0) return -1;
    g_cpu_ms_per_tok = (s.c1 - s.c0) * 1e3 / (double)(s.n1 - s.n0);
    return (double)(s.n1 - s.n0) / ((double)(s.t1 - s.t0) / 1e9);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The forward pass alone: model_eval_batch with n single-token decode entries over
 * sequences of CTX_LEN cached positions (what the runner can reach at best). */
enum { CTX_LEN = 64, RAW_PASSES = 15 };
typedef struct raw_bench {
    kv_pool *pool;
    kv_table t[MAX_CONC];
    int32_t tok[MAX_CONC];
} raw_bench;

static bool raw_init(raw_bench *b, const model *m) {
    const model_hparams *hp = model_get_hparams(m);
    kv_pool_config pc = {.layout = {hp->n_layer, hp->n_head_kv, hp->head_dim_k, hp->head_dim_v, 32},
                         .budget_bytes = (size_t)1 << 30};
    if (kv_pool_create(&pc, &b->pool, NULL)) return false;
    for (int i = 0; i < MAX_CONC; i++) {
        kv_table_init(&b->t[i], b->pool);
        if (kv_table_reserve(&b->t[i], CTX_LEN + 1, NULL)) return false;
        kv_table_commit(&b->t[i], CTX_LEN); /* the rows' contents do not matter for timing */
        b->tok[i] = 3 + i;
    }
    return true;
}

static void raw_free(raw_bench *b) {
    for (int i = 0; i < MAX_CONC; i++) kv_table_free(&b->t[i]);
    kv_pool_destroy(b->pool);
}

/* Tokens/s of one pass with n sequences (each writes position CTX_LEN, again and again). */
static double raw_pass(raw_bench *b, model_ctx *c, int n) {
    static float logits[MAX_CONC * N_VOCAB];
    model_batch_entry e[MAX_CONC] = {0};
    for (int i = 0; i < n; i++)
        e[i] = (model_batch_entry){.kv = {.blocks = b->t[i].data, .n_blocks = b->t[i].n_blocks,
                                          .block_tokens = 32, .len = b->t[i].len},
                                   .tokens = &b->tok[i], .n_tokens = 1, .want_logits = true};
    uint64_t t0 = hl_time_ns();
    if (model_eval_batch(c, e, n, logits, NULL)) return -1;
    return n / ((double)(hl_time_ns() - t0) / 1e9);
}

static void print_load(const char *when) {
    FILE *f = fopen("/proc/loadavg", "r");
    char buf[128] = "?";
    if (f) {
        if (!fgets(buf, sizeof buf, f)) snprintf(buf, sizeof buf, "?\n");
        fclose(f);
    }
    printf("load average %s: %s", when, buf);
}

int main(int argc, char **argv) {
    int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const bench_llama shape = {.n_vocab = N_VOCAB, .n_embd = N_EMBD, .n_layer = N_LAYER, .n_ff = N_FF,
                               .n_head = N_HEAD, .n_head_kv = N_HEAD_KV, .n_ctx = 2048};
    model *m = bench_synth_llama(&shape);
    if (!m) return 1;
    hl_err err;
    runner_config cfg = {.n_threads = n_threads, .n_ctx = 512, .n_parallel = MAX_CONC,
                         .kv_budget_bytes = (size_t)1 << 30};
    runner *r;
    if (runner_create(m, &cfg, &r, &err)) {
        fprintf(stderr, "runner: %s\n", err.msg);
        return 1;
    }
    printf("model: llama %d layers, embd %d, %d/%d heads, ff %d, vocab %d, Q8_0 (%.0f MiB); "
           "%d threads; prompt %d, %d tokens each, greedy; median of %d runs\n",
           N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB,
           model_weight_bytes(m) / 1048576.0, n_threads, PROMPT,
           N_GEN, RUNS);
    print_load("before");
    one_run(r, 1); /* warm-up: page the weights in */
    /* the levels take turns, round after round, so load changes hit them alike */
    enum { N_LEVELS = 4 };
    const int conc[N_LEVELS] = {1, 2, 4, 8};
    double rates[N_LEVELS][RUNS], cpu[N_LEVELS][RUNS];
    uint64_t steps[N_LEVELS] = {0};
    for (int k = 0; k < RUNS; k++)
        for (int c = 0; c < N_LEVELS; c++) {
            runner_load l0 = runner_get_load(r);
            rates[c][k] = one_run(r, conc[c]);
            cpu[c][k] = g_cpu_ms_per_tok;
            steps[c] += runner_get_load(r).steps - l0.steps;
        }
    double base = 0, cpu_base = 0;
    for (int c = 0; c < N_LEVELS; c++) {
        qsort(rates[c], RUNS, sizeof rates[c][0], cmp_double);
        qsort(cpu[c], RUNS, sizeof cpu[c][0], cmp_double);
        double med = rates[c][RUNS / 2], cmed = cpu[c][RUNS / 2];
        if (c == 0) base = med, cpu_base = cmed;
        printf("%d concurrent: %7.1f tokens/s aggregate (runs %.1f .. %.1f)  %.2fx vs 1;  "
               "%.2f cpu-ms/token (%.2fx less);  %.2f decode tokens per forward pass\n",
               conc[c], med, rates[c][0], rates[c][RUNS - 1], base > 0 ? med / base : 0, cmed,
               cmed > 0 ? cpu_base / cmed : 0,
               (double)(RUNS * conc[c] * N_GEN) / (double)steps[c]);
    }
    {
        model_ctx *c;
        raw_bench rb;
        if (model_ctx_create(m, n_threads, MAX_CONC, &c, &err) == HL_OK && raw_init(&rb, m)) {
            double raw[N_LEVELS][RAW_PASSES];
            for (int k = 0; k < RAW_PASSES; k++)
                for (int l = 0; l < N_LEVELS; l++) raw[l][k] = raw_pass(&rb, c, conc[l]);
            printf("forward pass alone (model_eval_batch, %d cached positions, median of %d):\n",
                   CTX_LEN, RAW_PASSES);
            double raw1 = 0;
            for (int l = 0; l < N_LEVELS; l++) {
                qsort(raw[l], RAW_PASSES, sizeof raw[l][0], cmp_double);
                double x = raw[l][RAW_PASSES / 2];
                if (l == 0) raw1 = x;
                printf("%d in one pass: %7.1f tokens/s  %.2fx vs 1\n", conc[l], x, x / raw1);
            }
            raw_free(&rb);
            model_ctx_free(c);
        }
    }
    runner_load l = runner_get_load(r);
    printf("%llu forward passes, %.1f tokens each on average\n", (unsigned long long)l.steps,
           l.steps ? (double)l.step_tokens / (double)l.steps : 0);
    print_load("after");
    runner_destroy(r);
    model_free(m);
    return 0;
}
