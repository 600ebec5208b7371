/*
 * test_runner.c - the generation pipeline on a small synthetic llama model (context 256,
 * EOS id 2): the forward pass over block tables, cache hits that reproduce cold runs,
 * stats, exact num_predict, context limits, empty prompts, full hits, cancellation in
 * prefill and decode, errors as the final event, memory reporting, paging.
 */
#include <stdlib.h>

#include "kv/trie.h"
#include "model_synth.h"
#include "runner/runner.h"
#include "test.h"

#define V 64

static model *load_synth(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/runner.gguf", test_tmpdir());
    synth_cfg c = {.arch = "llama", .n_vocab = V, .n_embd = 32, .n_layer = 2, .n_ff = 48,
                   .n_head = 4, .n_head_kv = 2, .rope_base = 10000, .wtype = HL_TYPE_F32,
                   .seed = 7};
    return synth_load(&c, path);
}

static runner *new_runner(const model *m, int32_t block, int32_t chunk) {
    runner_config cfg = {.n_threads = 1, .block_tokens = block, .prefill_chunk = chunk,
                         .kv_budget_bytes = (size_t)64 << 20};
    runner *r = NULL;
    if (runner_create(m, &cfg, &r, NULL) != HL_OK) return NULL;
    return r;
}

static void fill_prompt(int32_t *p, int n, int seed) {
    uint32_t x = (uint32_t)seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % (V - 3)); /* never BOS/EOS */
    }
}

typedef struct capture {
    int32_t toks[512];
    int n_tok;
    int n_done, n_error;
    runner_event last;
    char msg[512];
    int cancel_after_tokens; /* > 0: emit returns false after that many */
    atomic_bool *flag;       /* set instead when non-NULL */
    int cancel_after_chunks;
    int chunks;
} capture;

static bool cap_emit(void *user, const runner_event *ev) {
    capture *c = user;
    c->last = *ev;
    if (ev->kind == RUNNER_EV_TOKEN) {
        c->toks[c->n_tok++] = ev->token;
        if (c->cancel_after_tokens && c->n_tok == c->cancel_after_tokens) {
            if (c->flag) atomic_store(c->flag, true);
            else return false;
        }
    } else if (ev->kind == RUNNER_EV_DONE) {
        c->n_done++;
    } else {
        c->n_error++;
        snprintf(c->msg, sizeof c->msg, "%s", ev->message ? ev->message : "");
    }
    return true;
}

static bool cap_progress(void *user, int32_t processed, int32_t total) {
    capture *c = user;
    (void)processed;
    (void)total;
    c->chunks++;
    return !(c->cancel_after_chunks && c->chunks == c->cancel_after_chunks);
}

static hl_status run(runner *r, const int32_t *p, int n, int num_predict, capture *c,
                     runner_stats *st) {
    memset(c->toks, 0, sizeof c->toks);
    c->n_tok = c->n_done = c->n_error = 0;
    c->chunks = 0;
    runner_request req = {.tokens = p, .n_tokens = n, .num_predict = num_predict,
                          .emit = cap_emit, .progress = cap_progress, .user = c,
                          .cancel = c->flag};
    req.sampling = (sampler_opts){.temperature = 0, .repeat_last_n = 0};
    return runner_generate(r, &req, st, NULL);
}

TEST(runner_model_view_matches_contiguous) {
    model *m = load_synth();
    CHECK(m);
    const int N = 23, Vn = V;
    int32_t toks[23];
    fill_prompt(toks, N, 1);
    float *a = malloc(sizeof(float) * (size_t)N * Vn), *b = malloc(sizeof(float) * (size_t)N * Vn);
    model_kv *kv;
    model_ctx *c;
    CHECK_OK(model_kv_create(m, 64, &kv, NULL), NULL);
    CHECK_OK(model_ctx_create(m, 1, 0, &c, NULL), NULL);
    CHECK_OK(model_eval(c, kv, toks, N, a, NULL), NULL);
    /* the same through a table of 5-token blocks, in uneven pieces */
    kv_pool_config pc = {.layout = {2, 2, 8, 8, 5}, .budget_bytes = (size_t)1 << 20};
    kv_pool *pool;
    CHECK_OK(kv_pool_create(&pc, &pool, NULL), NULL);
    kv_table t;
    kv_table_init(&t, pool);
    int pieces[] = {7, 1, 9, 6};
    for (int i = 0, at = 0; i < 4; at += pieces[i], i++) {
        CHECK_OK(kv_table_reserve(&t, pieces[i], NULL), NULL);
        model_kv_view view = {.blocks = t.data, .n_blocks = t.n_blocks, .block_tokens = 5,
                              .len = t.len, .geom = kv_pool_geom(pool)};
        CHECK_OK(model_eval_view(c, &view, toks + at, pieces[i], b + (size_t)at * Vn, NULL), NULL);
        kv_table_commit(&t, pieces[i]);
    }
    float maxd = 0;
    for (size_t i = 0; i < (size_t)N * Vn; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d > maxd) maxd = d;
    }
    CHECK_NEAR(maxd, 0, 1e-4);
    /* a full table is refused before anything is written */
    model_kv_view full = {.blocks = t.data, .n_blocks = t.n_blocks, .block_tokens = 5,
                          .len = t.n_blocks * 5};
    hl_err err;
    CHECK(model_eval_view(c, &full, toks, 1, NULL, &err) == HL_ERR_KV_FULL);
    kv_table_free(&t);
    kv_pool_destroy(pool);
    model_ctx_free(c);
    model_kv_free(kv);
    free(a);
    free(b);
    model_free(m);
}

TEST(runner_cache_hit_reproduces_cold_generation) {
    model *m = load_synth();
    CHECK(m);
    runner *r = new_runner(m, 8, 16), *cold = new_runner(m, 8, 16);
    CHECK(r && cold);
    int32_t sys[120];
    fill_prompt(sys, 120, 2);
    capture c = {0};
    runner_stats st;
    /* turn 1 */
    CHECK_OK(run(r, sys, 100, 6, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    int32_t turn2[200];
    memcpy(turn2, sys, 100 * sizeof *sys);
    memcpy(turn2 + 100, c.toks, 6 * sizeof *sys);
    fill_prompt(turn2 + 106, 10, 3);
    /* turn 2 extends the conversation: only the new part is computed */
    CHECK_OK(run(r, turn2, 116, 8, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 105); /* the last generated token was never forwarded */
    CHECK_EQ_INT(st.prompt_eval_count, 116);
    int32_t hot[8];
    memcpy(hot, c.toks, sizeof hot);
    CHECK_OK(run(cold, turn2, 116, 8, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 0);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(hot[i], c.toks[i]);
    /* a second conversation diverging inside a block, then back to the first */
    int32_t other[116];
    memcpy(other, turn2, sizeof other);
    fill_prompt(other + 50, 66, 9);
    CHECK_OK(run(r, other, 116, 4, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 50);
    CHECK_OK(run(r, turn2, 116, 8, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 115); /* fully cached: the last token is re-evaluated */
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(hot[i], c.toks[i]);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
    runner_destroy(cold);
    model_free(m);
}

TEST(runner_stats_and_exact_num_predict) {
    model *m = load_synth();
    runner *r = new_runner(m, 16, 2048);
    CHECK(r);
    int32_t p[40];
    fill_prompt(p, 40, 4);
    capture c = {0};
    runner_stats st;
    for (int np = 1; np <= 9; np += 4) {
        CHECK_OK(run(r, p, 40, np, &c, &st), NULL);
        CHECK_EQ_INT(c.n_done, 1);
        CHECK_EQ_INT(c.n_error, 0);
        CHECK_EQ_INT(c.last.kind, RUNNER_EV_DONE);
        CHECK_EQ_INT(st.done_reason, RUNNER_DONE_LENGTH);
        CHECK_EQ_INT(st.eval_count, np);
        CHECK_EQ_INT(c.n_tok, np);
        CHECK_EQ_INT(st.prompt_eval_count, 40);
        CHECK(st.prompt_eval_duration_ns > 0);
        CHECK(st.eval_duration_ns >= 0);
        CHECK_EQ_INT(c.last.stats.eval_count, np);
    }
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_stop_token_ends_without_streaming_it) {
    model *m = load_synth();
    runner *r = new_runner(m, 16, 2048);
    int32_t p[30];
    fill_prompt(p, 30, 5);
    capture c = {0};
    runner_stats st;
    CHECK_OK(run(r, p, 30, 5, &c, &st), NULL);
    int32_t third = c.toks[2];
    /* the same run with the third token as a stop token */
    runner_request req = {.tokens = p, .n_tokens = 30, .num_predict = 5, .emit = cap_emit,
                          .user = &c, .stop_tokens = &third, .n_stop_tokens = 1};
    c.n_tok = c.n_done = 0;
    CHECK_OK(runner_generate(r, &req, &st, NULL), NULL);
    int first = c.toks[0] == third ? 0 : c.toks[1] == third ? 1 : 2;
    CHECK_EQ_INT(c.n_tok, first);
    CHECK_EQ_INT(st.eval_count, first);
    CHECK_EQ_INT(st.done_reason, RUNNER_DONE_STOP);
    CHECK_EQ_INT(c.n_done, 1);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_context_limit_and_empty_prompt) {
    model *m = load_synth();
    runner *r = new_runner(m, 16, 64);
    CHECK_EQ_INT(runner_n_ctx(r), 256);
    static int32_t p[300];
    fill_prompt(p, 300, 6);
    capture c = {0};
    runner_stats st;
    hl_err err;
    runner_request req = {.tokens = p, .n_tokens = 256, .emit = cap_emit, .user = &c};
    CHECK(runner_generate(r, &req, &st, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg,
              "input length (256 tokens) exceeds the model's maximum context length (256 tokens)");
    CHECK_EQ_INT(c.n_error, 1);
    CHECK_EQ_INT(c.last.kind, RUNNER_EV_ERROR);
    CHECK_STR(c.msg, err.msg);
    /* 250 tokens: num_predict 0 and 100 both stop at the context end */
    CHECK_OK(run(r, p, 250, 0, &c, &st), NULL);
    CHECK(st.eval_count <= 6);
    if (st.done_reason == RUNNER_DONE_LENGTH) CHECK_EQ_INT(st.eval_count, 6);
    CHECK_OK(run(r, p, 255, 100, &c, &st), NULL);
    CHECK(st.eval_count <= 1);
    if (st.done_reason == RUNNER_DONE_LENGTH) CHECK_EQ_INT(st.eval_count, 1);
    /* empty prompt */
    req.n_tokens = 0;
    c.n_error = 0;
    CHECK(runner_generate(r, &req, &st, &err) == HL_ERR_INVALID);
    CHECK_STR(err.msg, "empty prompt");
    CHECK_EQ_INT(c.n_error, 1);
    /* a token outside the vocabulary is an error event too, and nothing is cached */
    int32_t bad[3] = {5, V + 3, 7};
    req.tokens = bad;
    req.n_tokens = 3;
    CHECK(runner_generate(r, &req, &st, &err) == HL_ERR_INVALID);
    CHECK(strstr(c.msg, "outside the vocabulary") != NULL);
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_cancel_in_decode_stops_at_once_and_keeps_cache) {
    model *m = load_synth();
    runner *r = new_runner(m, 8, 2048);
    int32_t p[60];
    fill_prompt(p, 60, 7);
    atomic_bool flag = false;
    capture c = {.cancel_after_tokens = 3, .flag = &flag};
    runner_stats st;
    hl_err err;
    runner_request req = {.tokens = p, .n_tokens = 60, .num_predict = 50, .emit = cap_emit,
                          .user = &c, .cancel = &flag};
    CHECK(runner_generate(r, &req, &st, &err) == HL_ERR_CANCELLED);
    CHECK_STR(err.msg, "request cancelled");
    CHECK_EQ_INT(c.n_tok, 3);
    CHECK_EQ_INT(c.n_error, 1);
    CHECK_EQ_INT(c.n_done, 0);
    CHECK_EQ_INT(sampler_n_slots(runner_sampler(r)), 0);
    /* a callback refusing a token cancels the same way */
    capture c2 = {.cancel_after_tokens = 2};
    req.emit = cap_emit;
    req.user = &c2;
    req.cancel = NULL;
    CHECK(runner_generate(r, &req, &st, &err) == HL_ERR_CANCELLED);
    CHECK_EQ_INT(c2.n_tok, 2);
    /* the trie holds what was computed: the prompt and the forwarded tokens */
    int32_t next[70];
    memcpy(next, p, sizeof p);
    memcpy(next + 60, c2.toks, 2 * sizeof(int32_t));
    fill_prompt(next + 62, 5, 8);
    capture c3 = {0};
    CHECK_OK(run(r, next, 67, 2, &c3, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 62); /* the first request had forwarded 2 tokens */
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_cancel_in_prefill_keeps_computed_chunks) {
    model *m = load_synth();
    runner *r = new_runner(m, 8, 16);
    int32_t p[100];
    fill_prompt(p, 100, 10);
    capture c = {.cancel_after_chunks = 2};
    runner_stats st;
    CHECK(run(r, p, 100, 4, &c, &st) == HL_ERR_CANCELLED);
    CHECK_EQ_INT(c.chunks, 2);
    CHECK_EQ_INT(c.n_tok, 0);
    CHECK_EQ_INT(c.n_error, 1);
    CHECK_STR(c.msg, "request cancelled");
    /* a retry resumes after the two chunks */
    capture c2 = {0};
    CHECK_OK(run(r, p, 100, 4, &c2, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 32);
    CHECK_EQ_INT(c2.chunks, 5); /* 32-48-64-80-96 (cut at the len-4 snapshot) -99 */
    /* a flag set before the request: nothing runs */
    atomic_bool flag = true;
    capture c3 = {.flag = &flag};
    int32_t q[20];
    fill_prompt(q, 20, 11);
    CHECK(run(r, q, 20, 4, &c3, &st) == HL_ERR_CANCELLED);
    CHECK_EQ_INT(c3.chunks, 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
    model_free(m);
}

static kv_node *find_end(kv_node *n, int32_t end) {
    if (n->end == end && n->parent) return n;
    for (int32_t i = 0; i < n->n_children; i++) {
        kv_node *f = find_end(n->children[i], end);
        if (f) return f;
    }
    return NULL;
}

TEST(runner_snapshot_near_prompt_end_allows_retry) {
    model *m = load_synth();
    runner *r = new_runner(m, 8, 2048);
    int32_t p[80];
    fill_prompt(p, 80, 12);
    capture c = {0};
    runner_stats st;
    CHECK_OK(run(r, p, 80, 3, &c, &st), NULL);
    kv_node *n = find_end(kv_prefix_root(runner_prefix_cache(r)), 76);
    CHECK(n && n->user);
    /* a retry with a different ending after the first 78 tokens recomputes 2 */
    int32_t q[80];
    memcpy(q, p, sizeof q);
    q[78] = 5, q[79] = 6;
    CHECK_OK(run(r, q, 80, 3, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 78);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_memory_sharing_and_paging) {
    model *m = load_synth();
    runner *r = new_runner(m, 8, 2048);
    runner_memory mem0 = runner_get_memory(r);
    CHECK(mem0.weights > (size_t)V * 32 * 4);
    CHECK(mem0.scratch > 0);
    CHECK_EQ_INT(mem0.total, mem0.weights + mem0.kv + mem0.scratch);
    int32_t a[150], b[150];
    fill_prompt(a, 150, 13);
    memcpy(b, a, sizeof b);
    fill_prompt(a + 100, 50, 14);
    fill_prompt(b + 100, 50, 15);
    capture c = {0};
    runner_stats st;
    CHECK_OK(run(r, a, 150, 2, &c, &st), NULL);
    size_t blocks_a = kv_pool_get_stats(runner_kv_pool(r)).n_blocks;
    CHECK_OK(run(r, b, 150, 2, &c, &st), NULL);
    size_t blocks_ab = kv_pool_get_stats(runner_kv_pool(r)).n_blocks;
    CHECK_EQ_INT(st.cached_tokens, 100);
    /* b shares the 12 full blocks of the 100-token prefix */
    CHECK_EQ_INT(blocks_ab - blocks_a, (151 + 7) / 8 - 12);
    runner_memory mem = runner_get_memory(r);
    CHECK(mem.kv >= blocks_ab * kv_pool_get_stats(runner_kv_pool(r)).block_bytes);
    int32_t before[4];
    CHECK_OK(run(r, a, 150, 4, &c, &st), NULL);
    memcpy(before, c.toks, sizeof before);
    /* idle: page everything cold out, then come back to a */
    size_t kv_before = runner_get_memory(r).kv;
    runner_page_out_idle(r);
    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    CHECK(ps.n_compressed > 0);
    CHECK(runner_get_memory(r).kv < kv_before);
    CHECK_OK(run(r, b, 150, 4, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 149);
    CHECK_OK(run(r, a, 150, 4, &c, &st), NULL);
    CHECK_EQ_INT(st.cached_tokens, 149);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(c.toks[i], before[i]);
    CHECK(kv_pool_get_stats(runner_kv_pool(r)).n_paged_in > 0);
    runner_destroy(r);
    model_free(m);
}

TEST(runner_bad_sampling_options_are_an_error_event) {
    model *m = load_synth();
    runner *r = new_runner(m, 8, 2048);
    int32_t p[10];
    fill_prompt(p, 10, 16);
    capture c = {0};
    runner_request req = {.tokens = p, .n_tokens = 10, .num_predict = 2, .emit = cap_emit,
                          .user = &c};
    req.sampling.temperature = -1;
    runner_stats st;
    CHECK(runner_generate(r, &req, &st, NULL) == HL_ERR_INVALID);
    CHECK_EQ_INT(c.n_error, 1);
    CHECK(c.msg[0] != '\0');
    runner_destroy(r);
    model_free(m);
}

TEST(runner_spills_to_disk_under_a_tight_budget_and_restores_exactly) {
    model *m = load_synth();
    const char *dir = test_tmpdir();
    /* budget: 6 blocks of 8 tokens; three conversations of ~90 tokens cannot stay in RAM */
    runner_config cfg = {.n_threads = 1, .block_tokens = 8, .spill_dir = dir};
    runner *probe = NULL, *cold = new_runner(m, 8, 2048);
    CHECK_OK(runner_create(m, &cfg, &probe, NULL), NULL);
    size_t bb = kv_pool_get_stats(runner_kv_pool(probe)).block_bytes;
    runner_destroy(probe);
    cfg.kv_budget_bytes = 6 * bb;
    runner *r = NULL;
    CHECK_OK(runner_create(m, &cfg, &r, NULL), NULL);
    int32_t conv[3][120];
    for (int k = 0; k < 3; k++) {
        fill_prompt(conv[k], 120, 20);
        fill_prompt(conv[k] + 30, 90, 21 + k); /* 30 shared tokens */
    }
    capture c = {0}, cc = {0};
    runner_stats st;
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 3; k++) {
            int n = 80 + 10 * round;
            CHECK_OK(run(r, conv[k], n, 3, &c, &st), NULL);
            if (round == 1) CHECK_EQ_INT(st.cached_tokens, 80); /* restored from disk/RAM */
            CHECK_OK(run(cold, conv[k], n, 3, &cc, &st), NULL);
            for (int i = 0; i < 3; i++) CHECK_EQ_INT(c.toks[i], cc.toks[i]);
        }
    kv_pool_stats ps = kv_pool_get_stats(runner_kv_pool(r));
    CHECK(ps.n_paged_out > 0);
    CHECK(ps.n_paged_in > 0);
    CHECK(ps.n_spilled > 0);
    runner_memory mem = runner_get_memory(r);
    CHECK(mem.kv_disk > 0);
    CHECK_OK(kv_trie_check(runner_prefix_cache(r), NULL), NULL);
    runner_destroy(r);
    runner_destroy(cold);
    model_free(m);
}
