/*
 * test_batch.c - continuous batching: the batched forward pass (several sequences, mixed
 * prefill chunks and decode tokens, one pass) against each sequence alone, and the
 * concurrent runner (many threads calling runner_generate at once).
 */
#include <pthread.h>
#include <stdlib.h>

#include "kv/kvcache.h"
#include "kv/trie.h"
#include "model_synth.h"
#include "runner/runner.h"
#include "test.h"

#define V 64

static model *load_synth_type(hl_type wtype) {
    char path[512];
    snprintf(path, sizeof path, "%s/batch%d.gguf", test_tmpdir(), (int)wtype);
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 64, .n_layer = 2, .n_ff = 96,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = wtype, .seed = 11};
    synth_model *s = synth_build(&c, path);
    if (!s) return NULL;
    synth_free(s);
    model *m = NULL;
    if (model_load(path, NULL, &m, NULL) != HL_OK) return NULL;
    return m;
}

static void fill_prompt(int32_t *p, int n, int seed) {
    uint32_t x = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % (V - 3)); /* never BOS/EOS */
    }
}

/* ---- the batched forward pass ---- */

#define NSEQ 5
static const int seq_cached[NSEQ] = {10, 20, 0, 33, 7};  /* already in the cache */
static const int seq_new[NSEQ] = {7, 1, 5, 1, 12};      /* fed in the batch */

static void view_of(const kv_table *t, model_kv_view *v) {
    *v = (model_kv_view){.blocks = t->data, .n_blocks = t->n_blocks,
                         .block_tokens = kv_pool_layout(t->pool)->block_tokens, .len = t->len,
                         .geom = kv_pool_geom(t->pool)};
}

TEST(batch_forward_mixed_sequences_match_each_alone) {
    hl_type types[] = {HL_TYPE_Q8_0, HL_TYPE_F32};
    for (int ti = 0; ti < 2; ti++) {
        model *m = load_synth_type(types[ti]);
        CHECK(m);
        const model_hparams *hp = model_get_hparams(m);
        model_ctx *c;
        CHECK_OK(model_ctx_create(m, 2, 64, &c, NULL), NULL);
        kv_pool_config pc = {.layout = {hp->n_layer, hp->n_head_kv, hp->head_dim_k,
                                        hp->head_dim_v, 8},
                             .budget_bytes = (size_t)16 << 20};
        kv_pool *pool;
        CHECK_OK(kv_pool_create(&pc, &pool, NULL), NULL);
        int32_t toks[NSEQ][64];
        kv_table alone[NSEQ], batched[NSEQ];
        float alone_logits[NSEQ][V];
        /* each sequence's cached part, then its new tokens alone */
        for (int s = 0; s < NSEQ; s++) {
            fill_prompt(toks[s], seq_cached[s] + seq_new[s], 40 + s);
            kv_table *tabs[2] = {&alone[s], &batched[s]};
            for (int k = 0; k < 2; k++) {
                kv_table_init(tabs[k], pool);
                if (!seq_cached[s]) continue;
                model_kv_view v;
                CHECK_OK(kv_table_reserve(tabs[k], seq_cached[s], NULL), NULL);
                view_of(tabs[k], &v);
                CHECK_OK(model_eval_view(c, &v, toks[s], seq_cached[s], NULL, NULL), NULL);
                kv_table_commit(tabs[k], seq_cached[s]);
            }
            model_kv_view v;
            CHECK_OK(kv_table_reserve(&alone[s], seq_new[s], NULL), NULL);
            view_of(&alone[s], &v);
            CHECK_OK(model_eval_view(c, &v, toks[s] + seq_cached[s], seq_new[s], NULL, NULL),
                     NULL);
            kv_table_commit(&alone[s], seq_new[s]);
            memcpy(alone_logits[s], model_ctx_logits(c), sizeof alone_logits[s]);
        }
        /* all at once: sequence 4 does not want logits */
        model_batch_entry e[NSEQ] = {0};
        for (int s = 0; s < NSEQ; s++) {
            CHECK_OK(kv_table_reserve(&batched[s], seq_new[s], NULL), NULL);
            view_of(&batched[s], &e[s].kv);
            e[s].tokens = toks[s] + seq_cached[s];
            e[s].n_tokens = seq_new[s];
            e[s].want_logits = s != 4;
        }
        float out[NSEQ][V];
        memset(out, 0, sizeof out);
        CHECK_OK(model_eval_batch(c, e, NSEQ, &out[0][0], NULL), NULL);
        /* exact: activations are quantized per token and attention is per token */
        for (int s = 0; s < NSEQ - 1; s++)
            CHECK_MSG(memcmp(out[s], alone_logits[s], sizeof out[s]) == 0,
                      "type %d: sequence %d's logits differ in a batch", ti, s);
        /* and the cache rows written are the same */
        const size_t bb = kv_pool_get_stats(pool).block_bytes;
        for (int s = 0; s < NSEQ; s++) {
            kv_table_commit(&batched[s], seq_new[s]);
            CHECK_EQ_INT(batched[s].n_blocks, alone[s].n_blocks);
            for (int b = 0; b < alone[s].n_blocks; b++) {
                const int rows = alone[s].len - b * 8 < 8 ? alone[s].len - b * 8 : 8;
                for (int l = 0; l < hp->n_layer; l++)
                    for (int h = 0; h < hp->n_head_kv; h++) {
                        const size_t kb = (size_t)rows * (size_t)hp->head_dim_k * sizeof(float);
                        CHECK(memcmp(kv_block_k_row(pool, batched[s].data[b], l, h, 0),
                                     kv_block_k_row(pool, alone[s].data[b], l, h, 0), kb) == 0);
                        CHECK(memcmp(kv_block_v_row(pool, batched[s].data[b], l, h, 0),
                                     kv_block_v_row(pool, alone[s].data[b], l, h, 0), kb) == 0);
                    }
            }
            (void)bb;
        }
        /* bad batches fail before anything runs */
        hl_err err;
        e[1].kv = e[0].kv;
        CHECK(model_eval_batch(c, e, 2, &out[0][0], &err) == HL_ERR_INVALID);
        CHECK(strstr(err.msg, "same block table") != NULL);
        model_batch_entry big = e[0];
        static int32_t many[100];
        big.tokens = many;
        big.n_tokens = 65;
        CHECK(model_eval_batch(c, &big, 1, &out[0][0], &err) != HL_OK);
        CHECK(model_eval_batch(c, e, 0, NULL, &err) == HL_ERR_INVALID);
        for (int s = 0; s < NSEQ; s++) {
            kv_table_free(&alone[s]);
            kv_table_free(&batched[s]);
        }
        kv_pool_destroy(pool);
        model_ctx_free(c);
        model_free(m);
    }
}

/* ---- the concurrent runner ---- */

static model *g_model; /* per test process (tests run in forked children) */

static model *batch_model(void) {
    if (!g_model) g_model = load_synth_type(HL_TYPE_Q8_0);
    return g_model;
}

static runner *batch_runner(int n_parallel, int max_queue, int ack_wait_us, size_t budget) {
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .prefill_chunk = 16,
                         .kv_budget_bytes = budget ? budget : (size_t)64 << 20,
                         .n_parallel = n_parallel, .max_queue = max_queue,
                         .batch_tokens = 32, .ack_wait_us = ack_wait_us};
    runner *r = NULL;
    if (runner_create(batch_model(), &cfg, &r, NULL) != HL_OK) return NULL;
    return r;
}

/* An event log shared by the requests of a test (tags in emission order). */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_log[8192];
static int g_log_n;

static void log_event(char tag) {
    pthread_mutex_lock(&g_log_mu);
    if (g_log_n < (int)sizeof g_log - 1) g_log[g_log_n++] = tag;
    pthread_mutex_unlock(&g_log_mu);
}

typedef struct job_run {
    runner *r;
    const int32_t *prompt;
    int n, num_predict;
    sampler_opts so;
    int32_t toks[256];
    int n_tok, n_done, n_error, n_progress;
    char msg[512];
    hl_status st;
    runner_stats stats;
    atomic_bool flag;
    bool use_flag;
    int flag_at;   /* > 0: set the flag after that many tokens */
    const int32_t *stop; /* one extra stop token, or NULL */
    int refuse_at; /* > 0: emit returns false at that token */
    char tag;      /* logged per token ('\0': no log); progress logs 'P' */
    bool hook;     /* logits_hook forces token 3 + (tokens streamed so far) % 5 */
    atomic_int *gate; /* non-NULL: the first token waits until it is 0 */
    atomic_int tokens_seen;
    int max_active;
} job_run;

static bool run_emit(void *user, const runner_event *ev) {
    job_run *j = user;
    if (ev->kind == RUNNER_EV_TOKEN) {
        if (j->n_tok < 256) j->toks[j->n_tok] = ev->token;
        j->n_tok++;
        atomic_fetch_add(&j->tokens_seen, 1);
        if (j->tag) log_event(j->tag);
        runner_load l = runner_get_load(j->r);
        if (l.active > j->max_active) j->max_active = l.active;
        if (j->gate && j->n_tok == 1)
            while (atomic_load(j->gate)) sched_yield();
        if (j->flag_at && j->n_tok == j->flag_at) atomic_store(&j->flag, true);
        if (j->refuse_at && j->n_tok == j->refuse_at) return false;
    } else if (ev->kind == RUNNER_EV_DONE) {
        j->n_done++;
    } else {
        j->n_error++;
        snprintf(j->msg, sizeof j->msg, "%s", ev->message ? ev->message : "");
    }
    return true;
}

static bool run_progress(void *user, int32_t processed, int32_t total) {
    job_run *j = user;
    (void)processed;
    (void)total;
    j->n_progress++;
    if (j->tag) log_event('P');
    return true;
}

/* Reads n_tok, which run_emit writes on the calling thread, without a lock. */
static void force_hook(void *user, float *logits, int32_t n_vocab) {
    job_run *j = user;
    const int32_t want = 3 + j->n_tok % 5;
    for (int32_t i = 0; i < n_vocab; i++) logits[i] = i == want ? 1.0f : -INFINITY;
}

static void *run_thread(void *arg) {
    job_run *j = arg;
    runner_request req = {.tokens = j->prompt, .n_tokens = j->n, .num_predict = j->num_predict,
                          .sampling = j->so, .emit = run_emit, .progress = run_progress,
                          .user = j, .cancel = j->use_flag ? &j->flag : NULL,
                          .stop_tokens = j->stop, .n_stop_tokens = j->stop ? 1 : 0,
                          .logits_hook = j->hook ? force_hook : NULL};
    hl_err err = {0};
    j->st = runner_generate(j->r, &req, &j->stats, &err);
    if (j->st && !j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    return NULL;
}

static void job_init(job_run *j, runner *r, const int32_t *prompt, int n, int num_predict) {
    memset(j, 0, sizeof *j);
    j->r = r;
    j->prompt = prompt;
    j->n = n;
    j->num_predict = num_predict;
    j->so = (sampler_opts){.temperature = 0, .repeat_last_n = 0};
    atomic_init(&j->flag, false);
    atomic_init(&j->tokens_seen, 0);
}

static void run_all(job_run *jobs, int n) {
    pthread_t th[64];
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run_thread, &jobs[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

/* Runs each job alone on a one-slot runner (the reference), returning its tokens. */
static bool run_alone(job_run *jobs, int n, int32_t ref[][256], int *ref_n) {
    runner *solo = batch_runner(1, 0, 0, 0);
    if (!solo) return false;
    for (int i = 0; i < n; i++) {
        job_run j;
        job_init(&j, solo, jobs[i].prompt, jobs[i].n, jobs[i].num_predict);
        j.so = jobs[i].so;
        run_thread(&j);
        if (j.st) return false;
        memcpy(ref[i], j.toks, sizeof j.toks);
        ref_n[i] = j.n_tok;
    }
    runner_destroy(solo);
    return true;
}

static int32_t g_prompts[16][256];

TEST(batch_concurrent_greedy_requests_match_each_alone) {
    CHECK(batch_model());
    enum { N = 6 };
    runner *r = batch_runner(4, 0, 0, 0);
    CHECK(r);
    CHECK_EQ_INT(runner_n_parallel(r), 4);
    job_run jobs[N];
    for (int i = 0; i < N; i++) {
        fill_prompt(g_prompts[i], 20 + 10 * i, 100 + i);
        job_init(&jobs[i], r, g_prompts[i], 20 + 10 * i, 12 + i);
    }
    int32_t ref[N][256];
    int ref_n[N];
    CHECK(run_alone(jobs, N, ref, ref_n));
    run_all(jobs, N);
    int max_active = 0;
    for (int i = 0; i < N; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_done, 1);
        CHECK_EQ_INT(jobs[i].n_tok, ref_n[i]);
        CHECK_EQ_INT(jobs[i].stats.eval_count, jobs[i].n_tok);
        CHECK_EQ_INT(jobs[i].stats.prompt_eval_count, jobs[i].n);
        for (int k = 0; k < ref_n[i]; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
        if (jobs[i].max_active > max_active) max_active = jobs[i].max_active;
    }
    CHECK(max_active >= 2); /* they did run together */
    runner_load l = runner_get_load(r);
    CHECK_EQ_INT(l.active, 0);
    CHECK_EQ_INT(l.queued, 0);
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
}

TEST(batch_logits_hook_applies_to_its_own_sequence_only) {
    CHECK(batch_model());
    enum { N = 3 };
    runner *r = batch_runner(4, 0, 0, 0);
    CHECK(r);
    job_run jobs[N];
    for (int i = 0; i < N; i++) {
        fill_prompt(g_prompts[i], 20 + i, 150 + i);
        job_init(&jobs[i], r, g_prompts[i], 20 + i, 12);
    }
    int32_t ref[N][256];
    int ref_n[N];
    CHECK(run_alone(jobs, N, ref, ref_n));
    jobs[1].hook = true;
    run_all(jobs, N);
    for (int i = 0; i < N; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_tok, 12);
        for (int k = 0; k < 12; k++)
            CHECK_EQ_INT(jobs[i].toks[k], i == 1 ? 3 + k % 5 : ref[i][k]);
    }
    runner_destroy(r);
}

TEST(batch_seeded_sampling_is_the_same_alone_and_batched) {
    CHECK(batch_model());
    enum { N = 4 };
    runner *r = batch_runner(4, 0, 0, 0);
    CHECK(r);
    job_run jobs[N];
    for (int i = 0; i < N; i++) {
        fill_prompt(g_prompts[i], 15 + 7 * i, 200 + i);
        job_init(&jobs[i], r, g_prompts[i], 15 + 7 * i, 16);
        jobs[i].so = sampler_opts_defaults();
        jobs[i].so.seed = 42 + i;
        jobs[i].so.temperature = 1.5f; /* a flat distribution: draws matter */
        jobs[i].so.top_k = 0;
        jobs[i].so.top_p = 1;
        if (i == 3) jobs[i].so.repeat_penalty = 1.3f; /* mixed options: per-slot path */
    }
    int32_t ref[N][256];
    int ref_n[N];
    CHECK(run_alone(jobs, N, ref, ref_n));
    run_all(jobs, N);
    for (int i = 0; i < N; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_tok, ref_n[i]);
        for (int k = 0; k < ref_n[i]; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
    }
    runner_destroy(r);
}

TEST(batch_long_prompt_interleaves_with_decoding) {
    CHECK(batch_model());
    /* ack_wait -1: every step waits for every callback, so the log is in step order */
    runner *r = batch_runner(3, 0, -1, 0);
    CHECK(r);
    job_run jobs[3];
    fill_prompt(g_prompts[0], 10, 300);
    fill_prompt(g_prompts[1], 12, 301);
    fill_prompt(g_prompts[2], 220, 302);
    job_init(&jobs[0], r, g_prompts[0], 10, 80);
    job_init(&jobs[1], r, g_prompts[1], 12, 80);
    job_init(&jobs[2], r, g_prompts[2], 220, 3);
    jobs[0].tag = 'a';
    jobs[1].tag = 'b';
    jobs[2].tag = 'L';
    int32_t ref[3][256];
    int ref_n[3];
    CHECK(run_alone(jobs, 3, ref, ref_n));
    g_log_n = 0;
    pthread_t th[3];
    pthread_create(&th[0], NULL, run_thread, &jobs[0]);
    pthread_create(&th[1], NULL, run_thread, &jobs[1]);
    while (atomic_load(&jobs[0].tokens_seen) < 2 || atomic_load(&jobs[1].tokens_seen) < 2)
        sched_yield();
    pthread_create(&th[2], NULL, run_thread, &jobs[2]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_tok, ref_n[i]);
        for (int k = 0; k < ref_n[i]; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
    }
    /* 219 prompt tokens: 13 chunks of 16, 208-216 (cut at the len-4 snapshot), 216-219 */
    CHECK_EQ_INT(jobs[2].n_progress, 15);
    g_log[g_log_n] = '\0';
    const char *first = strchr(g_log, 'P'), *last = strrchr(g_log, 'P');
    CHECK(first && last);
    int a = 0, b = 0;
    for (const char *p = first; p < last; p++) a += *p == 'a', b += *p == 'b';
    /* both streams decoded one token per step while the prompt was prefilled */
    CHECK_MSG(a >= 13 && b >= 13, "tokens during the prefill: a %d, b %d; log %s", a, b, g_log);
    runner_destroy(r);
}

TEST(batch_full_queue_answers_busy) {
    CHECK(batch_model());
    runner *r = batch_runner(1, 2, 0, 0);
    CHECK(r);
    job_run jobs[3];
    atomic_int gate;
    atomic_init(&gate, 1);
    for (int i = 0; i < 3; i++) {
        fill_prompt(g_prompts[i], 10, 400 + i);
        job_init(&jobs[i], r, g_prompts[i], 10, 4);
    }
    jobs[0].gate = &gate; /* holds the only slot in its first callback */
    pthread_t th[3];
    pthread_create(&th[0], NULL, run_thread, &jobs[0]);
    while (atomic_load(&jobs[0].tokens_seen) < 1) sched_yield();
    pthread_create(&th[1], NULL, run_thread, &jobs[1]);
    pthread_create(&th[2], NULL, run_thread, &jobs[2]);
    while (runner_get_load(r).queued < 2) sched_yield();
    job_run d;
    fill_prompt(g_prompts[3], 10, 403);
    job_init(&d, r, g_prompts[3], 10, 4);
    run_thread(&d);
    CHECK(d.st == HL_ERR_BUSY);
    CHECK_STR(d.msg, "server busy, please try again.  maximum pending requests exceeded");
    CHECK_EQ_INT(d.n_error, 1);
    CHECK_EQ_INT(d.n_tok, 0);
    CHECK_STR(hl_status_str(HL_ERR_BUSY), "busy");
    atomic_store(&gate, 0);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_tok, 4);
    }
    /* room again */
    run_thread(&d);
    CHECK_OK(d.st, NULL);
    runner_destroy(r);
}

TEST(batch_parallel_and_queue_from_the_environment) {
    CHECK(batch_model());
    setenv("HEARTH_NUM_PARALLEL", "3", 1);
    setenv("HEARTH_MAX_QUEUE", "1", 1);
    runner_config cfg = {.n_threads = 1};
    runner *r = NULL;
    CHECK_OK(runner_create(batch_model(), &cfg, &r, NULL), NULL);
    CHECK_EQ_INT(runner_n_parallel(r), 3);
    runner_destroy(r);
    /* Ollama's names count too; hearth's win when both are set */
    setenv("OLLAMA_NUM_PARALLEL", "2", 1);
    CHECK_OK(runner_create(batch_model(), &cfg, &r, NULL), NULL);
    CHECK_EQ_INT(runner_n_parallel(r), 3);
    runner_destroy(r);
    unsetenv("HEARTH_NUM_PARALLEL");
    unsetenv("HEARTH_MAX_QUEUE");
    CHECK_OK(runner_create(batch_model(), &cfg, &r, NULL), NULL);
    CHECK_EQ_INT(runner_n_parallel(r), 2);
    runner_destroy(r);
    unsetenv("OLLAMA_NUM_PARALLEL");
    CHECK_OK(runner_create(batch_model(), &cfg, &r, NULL), NULL);
    CHECK_EQ_INT(runner_n_parallel(r), RUNNER_NUM_PARALLEL);
    runner_destroy(r);
}

TEST(batch_cancel_one_of_several) {
    CHECK(batch_model());
    enum { N = 4 };
    runner *r = batch_runner(4, 0, 0, 0);
    CHECK(r);
    job_run jobs[N];
    for (int i = 0; i < N; i++) {
        fill_prompt(g_prompts[i], 30 + i, 500 + i);
        job_init(&jobs[i], r, g_prompts[i], 30 + i, 20);
    }
    int32_t ref[N][256];
    int ref_n[N];
    CHECK(run_alone(jobs, N, ref, ref_n));
    jobs[1].use_flag = true;
    jobs[1].flag_at = 3; /* another thread's flag, set after the third token */
    jobs[2].refuse_at = 5; /* the client goes away at the fifth token */
    run_all(jobs, N);
    CHECK(jobs[1].st == HL_ERR_CANCELLED);
    CHECK_EQ_INT(jobs[1].n_tok, 3);
    CHECK_STR(jobs[1].msg, "request cancelled");
    CHECK(jobs[2].st == HL_ERR_CANCELLED);
    CHECK_EQ_INT(jobs[2].n_tok, 5);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(jobs[i].n_done + jobs[i].n_error, 1);
        for (int k = 0; k < jobs[i].n_tok; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
        if (i == 0 || i == 3) {
            CHECK_OK(jobs[i].st, NULL);
            CHECK_EQ_INT(jobs[i].n_tok, ref_n[i]);
        }
    }
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    /* the cancelled request's computed tokens are in the cache */
    int32_t next[64];
    memcpy(next, g_prompts[1], 31 * sizeof(int32_t));
    memcpy(next + 31, jobs[1].toks, 2 * sizeof(int32_t));
    next[33] = jobs[1].toks[2] == 5 ? 6 : 5;
    job_run again;
    job_init(&again, r, next, 34, 2);
    run_thread(&again);
    CHECK_OK(again.st, NULL);
    CHECK_EQ_INT(again.stats.cached_tokens, 33);
    /* cancelled before it starts: nothing runs, and its stats are its own */
    job_run early;
    job_init(&early, r, g_prompts[2], 20, 5);
    early.use_flag = true;
    atomic_store(&early.flag, true);
    run_thread(&early);
    CHECK(early.st == HL_ERR_CANCELLED);
    CHECK_EQ_INT(early.n_tok, 0);
    CHECK_EQ_INT(early.n_progress, 0);
    CHECK_EQ_INT(early.stats.eval_count, 0);
    CHECK_EQ_INT(early.stats.prompt_eval_count, 20);
    CHECK_EQ_INT(early.stats.cached_tokens, 0);
    runner_destroy(r);
}

/* Every block alive is held by trie snapshots only, exactly as many times as they name it
 * (no live table or leaked reference): the pool is back to its idle baseline. */
typedef struct block_ref {
    kv_block *b;
    int n;
} block_ref;

static int collect_refs(const kv_node *n, block_ref *refs, int n_refs, int cap) {
    if (n->snaps && n->snaps[0]) {
        const kv_block_snap *s = n->snaps[0];
        for (int32_t i = 0; i < s->n; i++) {
            int k = 0;
            while (k < n_refs && refs[k].b != s->blocks[i]) k++;
            if (k == n_refs) {
                if (n_refs == cap) return -1;
                refs[n_refs++] = (block_ref){s->blocks[i], 0};
            }
            refs[k].n++;
        }
    }
    for (int32_t i = 0; i < n->n_children && n_refs >= 0; i++)
        n_refs = collect_refs(n->children[i], refs, n_refs, cap);
    return n_refs;
}

static bool pool_at_baseline(runner *r, char *why, size_t why_len) {
    static block_ref refs[4096];
    int n = collect_refs(kv_prefix_root(runner_prefix_cache(r)), refs, 0, 4096);
    if (n < 0) return snprintf(why, why_len, "too many blocks"), false;
    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    if ((size_t)n != ps.n_blocks)
        return snprintf(why, why_len, "%zu blocks alive, the trie holds %d", ps.n_blocks, n), false;
    for (int i = 0; i < n; i++)
        if (kv_block_refs(refs[i].b) != refs[i].n)
            return snprintf(why, why_len, "a block has %d references, the trie holds %d",
                            kv_block_refs(refs[i].b), refs[i].n),
                   false;
    return true;
}

TEST(batch_shared_system_prompt_hits_the_cache_and_shares_blocks) {
    CHECK(batch_model());
    enum { N = 4, SYS = 60, Q = 10 };
    runner *r = batch_runner(4, 0, 0, 0);
    CHECK(r);
    static int32_t conv[N + 1][SYS + Q];
    for (int i = 0; i <= N; i++) {
        fill_prompt(conv[i], SYS, 600);
        fill_prompt(conv[i] + SYS, Q, 601 + i);
        conv[i][SYS] = 10 + i; /* the questions differ from their first token */
    }
    job_run warm;
    job_init(&warm, r, conv[0], SYS + Q, 4);
    run_thread(&warm);
    CHECK_OK(warm.st, NULL);
    size_t blocks_warm = kv_pool_get_stats(runner_kv_pool(r)).n_blocks;
    CHECK_EQ_INT(blocks_warm, (SYS + Q + 3 + 7) / 8);
    job_run jobs[N];
    for (int i = 0; i < N; i++) job_init(&jobs[i], r, conv[i + 1], SYS + Q, 4);
    int32_t ref[N][256];
    int ref_n[N];
    CHECK(run_alone(jobs, N, ref, ref_n));
    run_all(jobs, N);
    for (int i = 0; i < N; i++) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].stats.cached_tokens, SYS);
        for (int k = 0; k < ref_n[i]; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
    }
    /* each conversation owns only the blocks from the one where it diverged (56..72):
     * 3 blocks, not the 10 of a private copy */
    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    CHECK_EQ_INT(ps.n_blocks, blocks_warm + N * 3);
    CHECK(ps.n_cow >= N);
    char why[128];
    CHECK_MSG(pool_at_baseline(r, why, sizeof why), "%s", why);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
}

/* ---- stress ---- */

typedef struct stress_arg {
    runner *r;
    int id;
    int n_ok, n_cancelled, n_other;
    char other[256];
} stress_arg;

static void *stress_thread(void *arg) {
    stress_arg *a = arg;
    uint32_t x = 977u * (uint32_t)a->id + 13;
    int32_t prompt[160];
    for (int k = 0; k < 8; k++) {
        x = x * 1103515245u + 12345u;
        /* a few shared prefixes so conversations branch off each other */
        int n = 5 + (int)((x >> 8) % 120);
        fill_prompt(prompt, n, 700 + (int)((x >> 20) % 3));
        int tail = (int)((x >> 4) % 8);
        if (tail > n) tail = n;
        fill_prompt(prompt + n - tail, tail, 800 + a->id * 8 + k);
        job_run j;
        job_init(&j, a->r, prompt, n, 1 + (int)((x >> 12) % 20));
        switch ((x >> 16) % 5) {
        case 0: j.use_flag = true, j.flag_at = 1 + (int)(x % 4); break;
        case 1: j.refuse_at = 1 + (int)(x % 4); break;
        case 2: j.use_flag = true, atomic_store(&j.flag, true); break; /* before it starts */
        default: break;
        }
        if ((x >> 24) % 4 == 0) {
            j.so = sampler_opts_defaults();
            j.so.seed = a->id;
        }
        run_thread(&j);
        if (j.n_done + j.n_error != 1) a->n_other++;
        if (j.st == HL_OK) a->n_ok++;
        else if (j.st == HL_ERR_CANCELLED) a->n_cancelled++;
        else {
            a->n_other++;
            snprintf(a->other, sizeof a->other, "%s", j.msg);
        }
    }
    return NULL;
}

TEST(batch_stress_random_cancellation_leaves_consistent_state) {
    CHECK(batch_model());
    /* a tight KV budget: paging and eviction run while sequences are live */
    runner *probe = batch_runner(1, 0, 0, 0);
    CHECK(probe);
    size_t bb = kv_pool_get_stats(runner_kv_pool(probe)).block_bytes;
    runner_destroy(probe);
    runner *r = batch_runner(4, 0, 0, 60 * bb);
    CHECK(r);
    stress_arg args[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (stress_arg){.r = r, .id = i};
        pthread_create(&th[i], NULL, stress_thread, &args[i]);
    }
    int ok = 0, cancelled = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(args[i].n_other == 0, "thread %d: unexpected result: %s", i, args[i].other);
        ok += args[i].n_ok;
        cancelled += args[i].n_cancelled;
    }
    CHECK_EQ_INT(ok + cancelled, 64);
    CHECK(ok > 0 && cancelled > 0);
    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    CHECK(ps.n_paged_out > 0 || kv_prefix_evictions(runner_prefix_cache(r)) > 0);
    printf("    stress: %d ok, %d cancelled, %llu steps, %llu paged out, %llu evicted\n", ok,
           cancelled, (unsigned long long)runner_get_load(r).steps,
           (unsigned long long)ps.n_paged_out,
           (unsigned long long)kv_prefix_evictions(runner_prefix_cache(r)));
    runner_load l = runner_get_load(r);
    CHECK_EQ_INT(l.active, 0);
    CHECK_EQ_INT(l.queued, 0);
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    char why[128];
    CHECK_MSG(pool_at_baseline(r, why, sizeof why), "%s", why);
    /* and it still computes what a fresh runner computes */
    int32_t p[50];
    fill_prompt(p, 50, 700);
    job_run a, b;
    job_init(&a, r, p, 50, 6);
    run_thread(&a);
    runner *fresh = batch_runner(1, 0, 0, 0);
    job_init(&b, fresh, p, 50, 6);
    run_thread(&b);
    CHECK_OK(a.st, NULL);
    CHECK_OK(b.st, NULL);
    for (int k = 0; k < 6; k++) CHECK_EQ_INT(a.toks[k], b.toks[k]);
    runner_destroy(fresh);
    runner_destroy(r);
}

/* ---- errors ---- */

/* The F32 model with token 60's embedding set to NaN: a sequence that contains it gets
 * logits with no finite value (a sampler error), the others are untouched. */
static model *load_poisoned(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/poison.gguf", test_tmpdir());
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 64, .n_layer = 2, .n_ff = 96,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = HL_TYPE_F32,
                   .seed = 11};
    synth_model *s = synth_build(&c, path);
    if (!s) return NULL;
    synth_free(s);
    gguf_file *f;
    if (gguf_open(path, &f, NULL)) return NULL;
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    long off = t ? (long)(gguf_data_offset(f) + t->offset + 60 * 64 * sizeof(float)) : -1;
    gguf_close(f);
    FILE *fp = fopen(path, "r+b");
    if (off < 0 || !fp) return NULL;
    float nan[64];
    for (int i = 0; i < 64; i++) nan[i] = NAN;
    fseek(fp, off, SEEK_SET);
    fwrite(nan, sizeof nan, 1, fp);
    fclose(fp);
    model *m = NULL;
    if (model_load(path, NULL, &m, NULL) != HL_OK) return NULL;
    return m;
}

TEST(batch_error_ends_only_the_affected_sequence) {
    model *m = load_poisoned();
    CHECK(m);
    model *shared = g_model; /* kept for later tests when they run in-process (-n) */
    g_model = m;
    enum { N = 3 };
    static const int32_t stop = 60; /* the good ones never forward the poisoned token */
    job_run jobs[N];
    for (int i = 0; i < N; i++) {
        fill_prompt(g_prompts[i], 40, 900 + i);
        for (int k = 0; k < 40; k++)
            if (g_prompts[i][k] == 60) g_prompts[i][k] = 61;
    }
    g_prompts[1][25] = 60;
    int32_t ref[N][256];
    int ref_n[N];
    runner *solo = batch_runner(1, 0, 0, 0);
    CHECK(solo);
    for (int i = 0; i < N; i++) {
        job_init(&jobs[i], solo, g_prompts[i], 40, 10);
        jobs[i].stop = &stop;
        run_thread(&jobs[i]);
        CHECK(jobs[i].st == (i == 1 ? HL_ERR_INVALID : HL_OK));
        memcpy(ref[i], jobs[i].toks, sizeof jobs[i].toks);
        ref_n[i] = jobs[i].n_tok;
    }
    runner_destroy(solo);
    runner *r = batch_runner(4, 0, -1, 0); /* -1: all three share every step */
    CHECK(r);
    for (int i = 0; i < N; i++) {
        job_init(&jobs[i], r, g_prompts[i], 40, 10);
        jobs[i].stop = &stop;
    }
    run_all(jobs, N);
    CHECK(jobs[1].st == HL_ERR_INVALID);
    CHECK_MSG(strstr(jobs[1].msg, "finite") != NULL, "message: %s", jobs[1].msg);
    CHECK_EQ_INT(jobs[1].n_error, 1);
    CHECK_EQ_INT(jobs[1].n_tok, 0);
    for (int i = 0; i < N; i += 2) {
        CHECK_OK(jobs[i].st, NULL);
        CHECK_EQ_INT(jobs[i].n_tok, ref_n[i]);
        for (int k = 0; k < ref_n[i]; k++) CHECK_EQ_INT(jobs[i].toks[k], ref[i][k]);
    }
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    char why[128];
    CHECK_MSG(pool_at_baseline(r, why, sizeof why), "%s", why);
    runner_destroy(r);
    model_free(m);
    g_model = shared;
}
