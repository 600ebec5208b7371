/*
 * runner.c - the generation pipeline (see runner.h and research/mlxrunner-internals.md
 * section 4): validate, match the prefix trie, chunked prefill cut at snapshot offsets,
 * decode with the slot sampler, one final event, cleanup on every path.
 */
#include "runner/runner.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "kv/kvcache.h"
#include "kv/trie.h"
#include "tok/tok.h"

/* The runner serialises requests, so the pipeline always uses one sampler slot. */
#define PIPELINE_SLOT 0

struct runner {
    const model *m;
    model_ctx *ctx;
    kv_pool *pool;
    kv_table table; /* the live sequence */
    kv_cache cache;
    kv_prefix *pc;
    sampler *smp;
    int32_t n_ctx;
    int32_t chunk;
};

hl_status runner_create(const model *m, const runner_config *cfg, runner **out, hl_err *err) {
    *out = NULL;
    const model_hparams *hp = model_get_hparams(m);
    runner *r = calloc(1, sizeof *r);
    if (!r) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    r->m = m;
    r->n_ctx = cfg->n_ctx > 0 ? cfg->n_ctx : hp->n_ctx_train;
    if (r->n_ctx <= 0) r->n_ctx = 2048;
    r->chunk = cfg->prefill_chunk > 0 ? cfg->prefill_chunk : RUNNER_PREFILL_CHUNK;
    kv_pool_config pc = {
        .layout = {.n_layer = hp->n_layer, .n_head_kv = hp->n_head_kv,
                   .head_dim_k = hp->head_dim_k, .head_dim_v = hp->head_dim_v,
                   .block_tokens = cfg->block_tokens > 0 ? cfg->block_tokens : RUNNER_BLOCK_TOKENS},
        .budget_bytes = cfg->kv_budget_bytes,
        .spill_dir = cfg->spill_dir,
        .spill_max_bytes = cfg->spill_max_bytes,
    };
    hl_status st = kv_pool_create(&pc, &r->pool, err);
    if (!st) {
        kv_table_init(&r->table, r->pool);
        r->cache = (kv_cache){&kv_block_cache_ops, &r->table};
        kv_prefix_config tc = {.caches = &r->cache, .n_caches = 1,
                               .over_budget = kv_pool_over_budget, .budget_ctx = r->pool,
                               .page_out_on_close = true};
        st = kv_prefix_create(&tc, &r->pc, err);
    }
    if (!st) st = model_ctx_create(m, cfg->n_threads, 0, &r->ctx, err);
    if (!st) st = sampler_create(hp->n_vocab, r->n_ctx, &r->smp, err);
    if (st) {
        runner_destroy(r);
        return st;
    }
    *out = r;
    return HL_OK;
}

void runner_destroy(runner *r) {
    if (!r) return;
    sampler_destroy(r->smp);
    model_ctx_free(r->ctx);
    kv_prefix_destroy(r->pc); /* releases the trie's blocks */
    if (r->pool) kv_table_free(&r->table);
    kv_pool_destroy(r->pool);
    free(r);
}

int32_t runner_n_ctx(const runner *r) { return r->n_ctx; }
kv_pool *runner_kv_pool(runner *r) { return r->pool; }
sampler *runner_sampler(runner *r) { return r->smp; }
struct kv_prefix *runner_prefix_cache(runner *r) { return r->pc; }

hl_status runner_prepare(const runner *r, const runner_request *req, int32_t *num_predict,
                         hl_err *err) {
    if (req->n_tokens <= 0 || !req->tokens) return hl_fail(err, HL_ERR_INVALID, "empty prompt");
    if (req->n_tokens >= r->n_ctx)
        return hl_fail(err, HL_ERR_INVALID,
                       "input length (%d tokens) exceeds the model's maximum context length (%d "
                       "tokens)",
                       req->n_tokens, r->n_ctx);
    const int32_t n_vocab = model_get_hparams(r->m)->n_vocab;
    for (int32_t i = 0; i < req->n_tokens; i++)
        if (req->tokens[i] < 0 || req->tokens[i] >= n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "token %d (at index %d) is outside the vocabulary [0, %d)",
                           req->tokens[i], i, n_vocab);
    hl_status st = sampler_validate_opts(&req->sampling, err);
    if (st) return st;
    int32_t room = r->n_ctx - req->n_tokens;
    *num_predict = req->num_predict <= 0 || req->num_predict > room ? room : req->num_predict;
    return HL_OK;
}

/* Computes tokens at the live sequence's end and commits them to its block table. */
static hl_status forward(runner *r, const int32_t *tokens, int32_t n, hl_err *err) {
    hl_status st = kv_table_reserve(&r->table, n, err);
    if (st) return st;
    model_kv_view view = {.blocks = r->table.data, .n_blocks = r->table.n_blocks,
                          .block_tokens = kv_pool_layout(r->pool)->block_tokens,
                          .len = r->table.len};
    st = model_eval_view(r->ctx, &view, tokens, n, NULL, err);
    if (st) return st;
    kv_table_commit(&r->table, n);
    return HL_OK;
}

static bool cancelled(const runner_request *req) {
    return req->cancel && atomic_load_explicit(req->cancel, memory_order_relaxed);
}

static bool is_stop(const runner *r, const runner_request *req, int32_t tok) {
    const tok_vocab *v = model_vocab(r->m);
    if (v && tok_is_eog(v, tok)) return true;
    for (int32_t i = 0; i < req->n_stop_tokens; i++)
        if (req->stop_tokens[i] == tok) return true;
    return false;
}

static int64_t since(uint64_t t0) { return (int64_t)(hl_time_ns() - t0); }

hl_status runner_generate(runner *r, const runner_request *req, runner_stats *stats, hl_err *err) {
    runner_stats rs = {0};
    hl_err e = {0};
    kv_session sess = {0};
    bool have_slot = false;
    float *hooked = NULL; /* the logits row a logits_hook may edit */
    int32_t num_predict = 0;
    const int32_t n = req->n_tokens, slot = PIPELINE_SLOT;
    const int32_t n_vocab = model_get_hparams(r->m)->n_vocab;
    uint64_t t_prompt = hl_time_ns(), t_eval = 0;

    hl_status st = runner_prepare(r, req, &num_predict, &e);
    if (st) goto out;
    rs.prompt_eval_count = n;
    st = kv_prefix_begin(r->pc, req->tokens, n, &sess, &e);
    if (st) goto out;
    rs.cached_tokens = sess.prefix;
    kv_session_schedule_prefill(&sess);
    /* decode must not allocate per token: size the bookkeeping for the whole request */
    if ((st = kv_session_reserve_outputs(&sess, num_predict, &e))) goto out;
    if ((st = kv_table_prealloc(&r->table, n + num_predict, &e))) goto out;
    st = sampler_add(r->smp, slot, &req->sampling, req->tokens, (size_t)n, &e);
    if (st) goto out;
    have_slot = true;

    /* Prefill everything but the last prompt token, which seeds decoding. */
    int32_t done = sess.prefix;
    while (n - done > 1) {
        if (cancelled(req)) {
            st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
            goto out;
        }
        int32_t chunk = n - done - 1 < r->chunk ? n - done - 1 : r->chunk;
        int32_t next = kv_session_next_snapshot(&sess);
        if (next > done && next < done + chunk) chunk = next - done;
        st = forward(r, req->tokens + done, chunk, &e);
        if (st) goto out;
        done += chunk;
        if (next >= 0 && done >= next && (st = kv_session_snapshot(&sess, &e))) goto out;
        if (req->progress && !req->progress(req->user, done, n)) {
            st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
            goto out;
        }
    }
    if (cancelled(req)) {
        st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
        goto out;
    }
    st = forward(r, req->tokens + done, n - done, &e);
    if (st) goto out;

    rs.done_reason = RUNNER_DONE_LENGTH;
    if (req->logits_hook) { /* once per request, not per token */
        hooked = malloc((size_t)n_vocab * sizeof *hooked);
        if (!hooked) {
            st = hl_fail(&e, HL_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (int32_t i = 0; i < num_predict; i++) {
        if (cancelled(req)) {
            st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
            goto out;
        }
        sampler_out so;
        const float *row = model_ctx_logits(r->ctx);
        if (hooked) {
            memcpy(hooked, row, (size_t)n_vocab * sizeof *hooked);
            req->logits_hook(req->user, hooked, n_vocab);
            row = hooked;
        }
        st = sampler_sample(r->smp, &slot, 1, row, (size_t)n_vocab, &so, &e);
        if (st) goto out;
        if (i == 0) {
            rs.prompt_eval_duration_ns = since(t_prompt);
            t_eval = hl_time_ns();
        }
        /* recorded even when it is a stop token: the trie may keep it */
        if ((st = kv_session_add_outputs(&sess, &so.token, 1, &e))) goto out;
        if (is_stop(r, req, so.token)) {
            rs.done_reason = RUNNER_DONE_STOP;
            break;
        }
        rs.eval_count++;
        if (req->emit) {
            runner_event ev = {.kind = RUNNER_EV_TOKEN, .token = so.token, .sample = &so};
            if (!req->emit(req->user, &ev)) {
                st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
                goto out;
            }
        }
        if (i + 1 < num_predict) {
            if (cancelled(req)) {
                st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
                goto out;
            }
            st = forward(r, &so.token, 1, &e);
            if (st) goto out;
        }
    }
    rs.eval_duration_ns = t_eval ? since(t_eval) : 0;

out:
    if (t_eval && !rs.eval_duration_ns) rs.eval_duration_ns = since(t_eval);
    {
        /* the trie must record what the cache holds, whatever happened */
        hl_err ce;
        hl_status cs = kv_session_close(&sess, &ce);
        if (cs && !st) {
            st = cs;
            e = ce;
        }
    }
    free(hooked);
    if (have_slot) sampler_remove(r->smp, slot);
    if (req->emit) {
        runner_event ev = {.kind = st ? RUNNER_EV_ERROR : RUNNER_EV_DONE, .stats = rs,
                           .status = st, .message = st ? e.msg : NULL};
        req->emit(req->user, &ev);
    }
    if (stats) *stats = rs;
    if (st && err) *err = e;
    return st;
}

runner_memory runner_get_memory(const runner *r) {
    kv_pool_stats ps = kv_pool_get_stats(r->pool);
    runner_memory m = {
        .weights = model_weight_bytes(r->m),
        .kv = ps.ram_bytes,
        .kv_disk = ps.disk_bytes,
        .scratch = model_ctx_scratch_bytes(r->ctx),
    };
    m.total = m.weights + m.kv + m.scratch;
    return m;
}

void runner_page_out_idle(runner *r) { kv_pool_page_out_cold(r->pool); }
