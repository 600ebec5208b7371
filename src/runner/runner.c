/*
 * runner.c - the generation pipeline (see runner.h and research/mlxrunner-internals.md
 * section 4) with continuous batching: callers queue requests and wait; one batch thread
 * admits up to n_parallel of them into sequences and steps them all together: validate,
 * match the prefix trie, chunked prefill cut at snapshot offsets (interleaved with the
 * other sequences' decoding), decode with the slot sampler, one final event, cleanup on
 * every path.
 *
 * Two locks. `mu` guards the queue and the hand-over fields of each job (events from the
 * batch thread to the caller, acknowledgements and refusals back). `kv_mu` guards the KV
 * pool and the trie, which the batch thread changes and runner_get_memory /
 * runner_page_out_idle read from other threads; it is never held across a forward pass.
 * Everything else (sequences, sampler, compute context, step scratch) belongs to the
 * batch thread alone.
 */
#include "runner/runner.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/file.h"
#include "kv/kvcache.h"
#include "kv/trie.h"
#include "tok/tok.h"

/* A request in flight: lives on the caller's stack for the duration of runner_generate. */
typedef struct job {
    const runner_request *req;
    int32_t num_predict;
    /* an embedding (runner_embed): n_tokens rows of hidden states filled step by step,
     * pooled into embed_out at the end; NULL for a generation */
    float *hidden, *embed_out;
    pthread_cond_t cv; /* the caller waits here */
    struct job *next;  /* queue link */
    /* batch thread -> caller (under mu); a sequence with an event pending does not step */
    bool has_progress, has_token, finished;
    uint64_t posted_at; /* the step that posted the pending event */
    int32_t processed;
    sampler_out so;
    hl_status status;
    runner_stats stats;
    hl_err err;
    /* caller -> batch thread (under mu) */
    bool refused; /* a callback returned false */
} job;

/* SEQ_EMBED: an embedding's tokens go through the batch (no prefix cache, no sampling) */
typedef enum seq_phase { SEQ_FREE = 0, SEQ_NEW, SEQ_PREFILL, SEQ_DECODE, SEQ_EMBED } seq_phase;

/* One parallel slot: a sequence's live state. Batch thread only (phase/job under mu). */
typedef struct seq {
    job *job;
    seq_phase phase;
    int32_t slot; /* sampler slot: the index */
    kv_table table;  /* slot 0: the full-attention layers (or every layer) */
    kv_table wtable; /* slot 1: the sliding-window layers, when the model has them */
    kv_window_cache window;
    kv_state_cache state; /* recurrent layers' state, when the model has one */
    kv_cache caches[3];
    kv_lane *lane;
    kv_session sess;
    kv_hash *hashes;    /* store keys of the prompt's full blocks (cap: n_ctx / B + 1) */
    int32_t n_hashes;
    int32_t wpub;       /* window blocks below this index were offered to wstore */
    bool have_slot;
    int32_t done;       /* prompt positions in the cache while prefilling */
    int32_t next_token; /* decode: the token to forward next */
    uint64_t admitted;  /* admission order: the oldest prefill goes first */
    runner_stats rs;
    uint64_t t_start, t_eval;
    /* this step */
    bool ready, cancel;
    int32_t step_n; /* tokens in this step's batch entry (0: none) */
} seq;

struct runner {
    const model *m;
    hl_type kv_type; /* of the pool's keys and values */
    model_ctx *ctx;
    kv_pool *pool;  /* slot 0 */
    kv_pool *wpool; /* slot 1, or NULL */
    kv_pool_set pools;
    kv_state_pager *spager; /* recurrent snapshots' tiers, or NULL */
    int32_t n_caches; /* per sequence: KV slots, then a recurrent state */
    kv_prefix *pc;
    sampler *smp;
    seq *seqs;
    int32_t n_parallel;
    int32_t n_ctx, chunk, batch_tokens, max_queue;
    bool causal; /* false: a sequence's tokens must all be in one forward pass */
    int64_t ack_wait_ns; /* < 0: wait for all */

    pthread_mutex_t mu;
    pthread_cond_t loop_cv; /* new work, acknowledgements, stop */
    job *q_head, *q_tail;
    int32_t n_queued, n_active;
    bool stop;
    /* the batch thread is waiting (for callers' acknowledgements or for work), not inside
     * a step: waiting requests get heartbeats meanwhile (runner_generate) */
    bool batch_idle;
    uint64_t n_steps, n_step_tokens, n_admitted;

    kv_store *store;   /* disk / shared tiers, or NULL */
    kv_hash kv_seed;   /* key[0]: the model, KV types and block layout */
    int32_t chain_B;   /* tokens per link of the hash chain (the KV block size) */
    kv_store *sstore;  /* recurrent snapshots' records in the tiers, or NULL */
    kv_store *wstore;  /* sliding-window blocks in the tiers, or NULL */
    kv_hash state_seed; /* the slot kind mixed into a snapshot's key */
    size_t state_bytes, srec_bytes; /* the state; a record (state + one KV block) */
    uint8_t *srec;     /* a record's scratch (batch thread, under kv_mu) */
    runner_cache_stats cstats; /* under kv_mu */

    pthread_mutex_t kv_mu;
    pthread_t thread;
    bool thread_started, locks_ready;

    /* step scratch, sized at create */
    model_batch_entry *entries;
    int32_t *entry_seq;
    float *logits; /* n_parallel rows */
    int32_t *slots;
    int32_t *sample_seq;
    sampler_out *outs;
};

static void *batch_main(void *arg);

/* The disk / shared tiers (kv/store.h), for a model whose cache is full-attention KV, a
 * recurrent state, or both (a sliding window's blocks are not kept there). Full blocks go
 * to `store`; a recurrent snapshot at offset t goes to `sstore` as one record: the state
 * and, for a hybrid, the KV block holding t (its rows below t, the rest zero), keyed by
 * the chain at t's last full block, the slot kind and the tokens since. */
static hl_status store_open(runner *r, const runner_config *cfg, hl_err *err) {
    const bool redis = cfg->kv_redis && *cfg->kv_redis;
    if (!cfg->kv_model_id || !*cfg->kv_model_id || (!cfg->kv_store_dir && !redis)) return HL_OK;
    const size_t state_floats = model_state_floats(r->m);
    if (!r->causal || (!r->pool && !state_floats) || (r->wpool && state_floats)) {
        HL_WARN("runner: KV disk/shared tiers need a causal model with full-attention KV, a "
                "recurrent state, or full and sliding-window KV: off for this one");
        return HL_OK;
    }
    r->chain_B = r->pool ? kv_pool_layout(r->pool)->block_tokens
                         : (cfg->block_tokens > 0 ? cfg->block_tokens : RUNNER_BLOCK_TOKENS);
    size_t disk_max = cfg->kv_disk_max ? cfg->kv_disk_max : KV_STORE_DISK_MAX_DEFAULT;
    /* both tiers under one cap: snapshots (or window blocks) get a quarter of it */
    const bool second = (r->pool && state_floats) || r->wpool;
    const size_t state_disk_max = second ? disk_max / 4 : disk_max;
    if (second) disk_max -= state_disk_max;
    /* the identity: whatever changes a block's bytes */
    const kv_geom *g = r->pool ? kv_pool_geom(r->pool) : NULL;
    size_t cap = strlen(cfg->kv_model_id) + 128 + (g ? (size_t)g->n_layer * 40 : 0);
    char *id = malloc(cap);
    if (!id) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (g) {
        const kv_layout *l = kv_pool_layout(r->pool);
        /* kl: the keys' layout (kv/layout.h); f16 keys by rows in builds before the
         * columns must never be read as columns */
        int len = snprintf(id, cap,
                           "hearth-kv1|model=%s|slot=full|k=%s|kl=%s%d|v=%s|B=%d|layers=%d",
                           cfg->kv_model_id, hl_type_name(l->k_type),
                           kv_geom_k_cols(g) ? "cols" : "rows", kv_geom_k_cols(g) ? KV_K_TILE : 1,
                           hl_type_name(l->v_type), l->block_tokens, g->n_layer);
        for (int32_t i = 0; i < g->n_layer && len > 0 && (size_t)len < cap; i++)
            len += snprintf(id + len, cap - (size_t)len, "|%d,%d,%d", g->dims[i].n_head_kv,
                            g->dims[i].head_dim_k, g->dims[i].head_dim_v);
    } else {
        snprintf(id, cap, "hearth-kv1|model=%s|slot=none|B=%d", cfg->kv_model_id, r->chain_B);
    }
    r->kv_seed = kv_hash_seed(id, strlen(id));
    hl_err se;
    if (r->pool) {
        kv_store_config sc = {.dir = cfg->kv_store_dir, .disk_max = disk_max,
                              .redis_url = cfg->kv_redis, .ns = cfg->kv_model_id,
                              .redis_ttl_s = cfg->kv_redis_ttl_s,
                              .block_bytes = kv_layout_block_bytes(kv_pool_layout(r->pool))};
        if (kv_store_open(&sc, &r->store, &se) != HL_OK) { /* the model still serves, from RAM */
            HL_WARN("runner: KV disk/shared tiers off: %s", se.msg);
            r->store = NULL;
            free(id);
            return HL_OK;
        }
    }
    if (r->wpool && r->store) { /* the window layers' blocks: the same keys, their own records */
        const kv_layout *wl = kv_pool_layout(r->wpool);
        char *dir = NULL, *ns = NULL;
        const size_t nd = cfg->kv_store_dir ? strlen(cfg->kv_store_dir) + 8 : 0;
        const size_t nn = strlen(cfg->kv_model_id) + 8;
        if ((nd && !(dir = malloc(nd))) || !(ns = malloc(nn))) {
            free(dir);
            free(id);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        }
        if (dir) snprintf(dir, nd, "%s/window", cfg->kv_store_dir);
        snprintf(ns, nn, "%s:window", cfg->kv_model_id);
        kv_store_config sc = {.dir = dir, .disk_max = state_disk_max, .redis_url = cfg->kv_redis,
                              .ns = ns, .redis_ttl_s = cfg->kv_redis_ttl_s,
                              .block_bytes = kv_layout_block_bytes(wl)};
        if (kv_store_open(&sc, &r->wstore, &se) != HL_OK) {
            HL_WARN("runner: disk/shared tiers for sliding-window blocks off: %s", se.msg);
            r->wstore = NULL;
        }
        free(dir);
        free(ns);
        if (!r->wstore) { /* full blocks alone cannot restore a window model */
            kv_store_close(r->store);
            r->store = NULL;
        }
    }
    if (state_floats) {
        r->state_bytes = state_floats * sizeof(float);
        r->srec_bytes = r->state_bytes + (r->pool ? kv_layout_block_bytes(kv_pool_layout(r->pool)) : 0);
        snprintf(id, cap, "hearth-state1|floats=%zu|record=%zu", state_floats, r->srec_bytes);
        r->state_seed = kv_hash_seed(id, strlen(id));
        char *dir = NULL, *ns = NULL;
        const size_t nd = cfg->kv_store_dir ? strlen(cfg->kv_store_dir) + 8 : 0;
        const size_t nn = strlen(cfg->kv_model_id) + 8;
        if ((nd && !(dir = malloc(nd))) || !(ns = malloc(nn)) || !(r->srec = malloc(r->srec_bytes))) {
            free(dir);
            free(ns);
            free(id);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        }
        if (dir) snprintf(dir, nd, "%s/state", cfg->kv_store_dir);
        snprintf(ns, nn, "%s:state", cfg->kv_model_id);
        kv_store_config sc = {.dir = dir, .disk_max = state_disk_max, .redis_url = cfg->kv_redis,
                              .ns = ns, .redis_ttl_s = cfg->kv_redis_ttl_s,
                              .block_bytes = r->srec_bytes};
        if (kv_store_open(&sc, &r->sstore, &se) != HL_OK) {
            HL_WARN("runner: disk/shared tiers for recurrent snapshots off: %s", se.msg);
            r->sstore = NULL;
        }
        free(dir);
        free(ns);
    }
    free(id);
    if (!r->store && !r->sstore) return HL_OK;
    const int32_t n_keys = r->n_ctx / r->chain_B + 1;
    for (int32_t i = 0; i < r->n_parallel; i++) {
        r->seqs[i].hashes = malloc((size_t)n_keys * sizeof(kv_hash));
        if (!r->seqs[i].hashes) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    r->cstats.store_on = true;
    return HL_OK;
}

/* The chain after k full blocks of the sequence's tokens. */
static kv_hash chain_at(const runner *r, const seq *s, int32_t k) {
    return k > 0 ? s->hashes[k - 1] : r->kv_seed;
}

/* A recurrent snapshot's key: the chain at its last full block, the slot kind, then the
 * n tokens from that block's start to the snapshot's offset. */
static kv_hash state_key(const runner *r, kv_hash chain, const int32_t *rest, int32_t n) {
    _Static_assert(sizeof(kv_hash) == 4 * sizeof(int32_t), "a hash is four int32 words");
    int32_t kind[4];
    memcpy(kind, &r->state_seed, sizeof kind);
    return kv_hash_next(kv_hash_next(chain, kind, 4), rest, n);
}

/* Under kv_mu, after the trie restored what it holds: continues the sequence's table with
 * consecutive blocks found by key on disk or Redis (the prompt's last token is always
 * computed). With `advance` the session moves past them; else (a hybrid, whose state must
 * match) the table is left at the returned end for the caller. */
static int32_t store_extend(runner *r, seq *s, bool advance) {
    const runner_request *req = s->job->req;
    const int32_t B = r->chain_B;
    const int32_t n_full = s->n_hashes;
    const int32_t prefix = s->sess.prefix;
    int32_t end = prefix;
    hl_err e;
    enum { CHUNK = 16 }; /* blocks per look-up: one Redis round trip each */
    kv_block *blk[CHUNK];
    void *data[CHUNK];
    kv_source src[CHUNK];
    bool more = true;
    (void)req;
    for (int32_t k0 = prefix / B; more && k0 < n_full; k0 += CHUNK) {
        int32_t n = n_full - k0 < CHUNK ? n_full - k0 : CHUNK, got = 0;
        for (int32_t i = 0; i < n; i++) {
            if (!(blk[i] = kv_block_new_full(r->pool))) {
                n = i;
                break;
            }
            data[i] = kv_block_data(blk[i]);
        }
        if (n > 0) got = kv_store_get_run(r->store, s->hashes + k0, n, data, src);
        for (int32_t i = 0; i < n; i++) {
            const int32_t k = k0 + i;
            if (i < got && more && kv_table_set(&s->table, k, blk[i], &e) == HL_OK) {
                const int32_t from = k * B > prefix ? k * B : prefix;
                if (src[i] == KV_SRC_DISK) s->rs.cached_disk += (k + 1) * B - from;
                else s->rs.cached_remote += (k + 1) * B - from;
                end = (k + 1) * B;
            } else {
                more = false;
            }
            kv_block_unref(r->pool, blk[i]);
        }
        if (got < CHUNK) more = false;
    }
    if (end > prefix && (kv_table_set_len(&s->table, end, &e) ||
                         (advance && kv_session_advance(&s->sess, &e)))) {
        /* cannot happen with whole blocks; stay with what the trie gave */
        HL_WARN("runner: KV blocks from the store not used: %s", e.msg);
        kv_table_truncate(&s->table, prefix);
        s->rs.cached_disk = s->rs.cached_remote = 0;
        end = prefix;
    }
    return end;
}

/* Whether Redis is worth a round trip for a snapshot at t (the disk index is probed at
 * every offset): the offsets the request expects to share and the periodic ones. */
static bool remote_candidate(const runner_request *req, int32_t t) {
    if (t % KV_SNAPSHOT_INTERVAL == 0) return true;
    for (int32_t i = 0; req->snapshot_at && i < req->n_snapshot_at; i++)
        if (req->snapshot_at[i] == t) return true;
    return false;
}

/* Under kv_mu, for a model with a recurrent state: the longest prefix past the trie's
 * where every slot can be restored from the tiers: full blocks below the last full block
 * boundary k*B <= t, and a snapshot record exactly at t (the state and, for a hybrid, the
 * KV rows [k*B, t)). A corrupt record is deleted by the store and a shorter one tried;
 * nothing found leaves the sequence where the trie put it. */
static hl_status state_extend(runner *r, seq *s, hl_err *err) {
    const runner_request *req = s->job->req;
    const int32_t B = r->chain_B, n = req->n_tokens, prefix = s->sess.prefix;
    const int32_t end_kv = r->store ? store_extend(r, s, false) : n - 1;
    int32_t hi = n - 1;
    if (r->pool && end_kv / B * B + B - 1 < hi) hi = end_kv / B * B + B - 1;
    kv_source src = KV_SRC_NONE;
    int32_t t = hi;
    for (; t > prefix; t--) {
        const int32_t k = t / B;
        kv_hash key = state_key(r, chain_at(r, s, k), req->tokens + (size_t)k * B, t - k * B);
        if ((kv_store_on_disk(r->sstore, key) ||
             (kv_store_has_remote(r->sstore) && remote_candidate(req, t))) &&
            (src = kv_store_get(r->sstore, key, r->srec)) != KV_SRC_NONE)
            break;
    }
    hl_err e;
    bool ok = t > prefix;
    if (ok && r->pool) { /* the rows below t: blocks up to k*B, then the record's */
        const int32_t k = t / B;
        kv_table_truncate(&s->table, k * B);
        if (t > k * B) {
            kv_block *b = kv_block_new_full(r->pool);
            ok = b != NULL;
            if (ok) {
                memcpy(kv_block_data(b), r->srec + r->state_bytes, r->srec_bytes - r->state_bytes);
                ok = kv_table_set(&s->table, k, b, &e) == HL_OK;
                kv_block_unref(r->pool, b);
            }
        }
        ok = ok && kv_table_set_len(&s->table, t, &e) == HL_OK;
    }
    s->rs.cached_disk = s->rs.cached_remote = 0;
    if (!ok) { /* back to what the trie restored (the state was not touched) */
        if (r->pool) kv_table_truncate(&s->table, prefix);
        return HL_OK;
    }
    memcpy(s->state.state, r->srec, r->state_bytes);
    s->state.offset = t;
    /* every cache is at t < n now: the session cannot refuse, but an error beats a wrong
     * state */
    hl_status st = kv_session_advance(&s->sess, err);
    if (st) return st;
    if (src == KV_SRC_DISK) s->rs.cached_disk = t - prefix;
    else s->rs.cached_remote = t - prefix;
    return HL_OK;
}

/* Writes the recurrent snapshot the sequence just took at t (state at t) to the tiers. */
static void state_publish(runner *r, seq *s, int32_t t) {
    const int32_t B = r->chain_B, k = t / B;
    if (t <= 0 || s->state.offset != t || k > s->n_hashes || t > s->sess.n_stored) return;
    if (r->pool && (s->table.len < t || (t > k * B && !s->table.data[k]))) return;
    kv_hash key = state_key(r, chain_at(r, s, k), s->sess.stored + (size_t)k * B, t - k * B);
    if (kv_store_known(r->sstore, key)) return;
    memcpy(r->srec, s->state.state, r->state_bytes);
    if (r->pool) {
        if (t > k * B) kv_block_copy_rows(r->pool, r->srec + r->state_bytes, s->table.data[k], t - k * B);
        else memset(r->srec + r->state_bytes, 0, r->srec_bytes - r->state_bytes);
    }
    kv_store_put(r->sstore, key, r->srec);
}

/* Offers the window table's full blocks from index s->wpub on (while keys are known) to
 * the tiers: during prefill as they fill, before the window drops them, and at the end. */
static void window_publish(runner *r, seq *s) {
    const int32_t B = r->chain_B;
    int32_t k = s->wpub;
    for (; k < s->n_hashes && (k + 1) * B <= s->wtable.len && k < s->wtable.n_blocks; k++)
        if (s->wtable.data[k] && !kv_store_known(r->wstore, s->hashes[k]))
            kv_store_put(r->wstore, s->hashes[k], s->wtable.data[k]);
    s->wpub = k;
}

/* Under kv_mu, for a model with sliding-window layers: the longest block boundary t = k*B
 * past the trie's prefix where full blocks [0, t) and the window's blocks covering
 * [t - W, t) are all in the tiers. Nothing found leaves the sequence where the trie put
 * it. */
static hl_status window_extend(runner *r, seq *s, hl_err *err) {
    const int32_t B = r->chain_B, prefix = s->sess.prefix, W = s->window.window;
    const int32_t end_kv = store_extend(r, s, false);
    enum { MAXW = 64 }; /* window blocks looked up at once */
    kv_block *blk[MAXW];
    void *data[MAXW];
    kv_source src[MAXW];
    int32_t k = end_kv / B, j0 = 0, n = 0;
    bool asked_remote = false;
    for (; k * B > prefix; k--) {
        j0 = k * B - W > 0 ? (k * B - W) / B : 0;
        n = k - j0;
        if (n > MAXW) continue;
        bool local = true;
        for (int32_t j = j0; j < k && local; j++) local = kv_store_on_disk(r->wstore, s->hashes[j]);
        /* Redis: one round trip, for the deepest candidate only */
        if (!local && (asked_remote || !kv_store_has_remote(r->wstore))) continue;
        asked_remote |= !local;
        int32_t m = 0;
        for (; m < n && (blk[m] = kv_block_new_full(r->wpool)); m++) data[m] = kv_block_data(blk[m]);
        const int32_t got = m == n ? kv_store_get_run(r->wstore, s->hashes + j0, n, data, src) : 0;
        if (got == n) break;
        for (int32_t i = 0; i < m; i++) kv_block_unref(r->wpool, blk[i]);
    }
    s->rs.cached_disk = s->rs.cached_remote = 0;
    const int32_t t = k * B;
    if (t <= prefix) {
        kv_table_truncate(&s->table, prefix);
        return HL_OK;
    }
    /* install: holes below the window, its blocks, then both tables at t */
    kv_table *w = &s->wtable;
    hl_status st = HL_OK;
    kv_table_truncate(w, w->len < j0 * B ? w->len : j0 * B);
    for (int32_t i = w->n_blocks; !st && i < j0; i++) st = kv_table_set_hole(w, i, err);
    for (int32_t i = 0; i < n; i++) {
        if (!st) st = kv_table_set(w, j0 + i, blk[i], err);
        kv_block_unref(r->wpool, blk[i]);
    }
    if (!st) st = kv_table_set_len(w, t, err);
    if (!st && !kv_table_covers(w, t - W, t))
        st = hl_fail(err, HL_ERR_INVALID, "the window's blocks do not cover [%d, %d)", t - W, t);
    if (!st) {
        kv_table_truncate(&s->table, t);
        st = kv_session_advance(&s->sess, err);
    }
    if (st) return st; /* cannot happen: an error beats a wrong cache */
    bool remote = false;
    for (int32_t i = 0; i < n; i++) remote |= src[i] == KV_SRC_REMOTE;
    if (remote) s->rs.cached_remote = t - prefix;
    else s->rs.cached_disk = t - prefix;
    return HL_OK;
}

/* Under kv_mu: keys of the prompt's full blocks, then what the tiers add to the trie's
 * prefix. */
static hl_status tiers_extend(runner *r, seq *s, hl_err *err) {
    const runner_request *req = s->job->req;
    const int32_t B = r->chain_B, n_full = (req->n_tokens - 1) / B;
    kv_hash h = r->kv_seed;
    for (int32_t k = 0; k < n_full; k++) s->hashes[k] = h = kv_hash_next(h, req->tokens + k * B, B);
    s->n_hashes = n_full;
    s->wpub = 0;
    if (r->sstore) return state_extend(r, s, err);
    if (r->wstore) return window_extend(r, s, err);
    if (r->store) store_extend(r, s, true);
    return HL_OK;
}

/* Queues the sequence's full blocks the tiers lack (written behind): after prefill the
 * prompt's, at the end also those its generated tokens filled (a conversation's next
 * turn sends them back as prompt). */
static void store_publish(runner *r, seq *s) {
    const int32_t B = r->chain_B;
    int32_t n_full = s->table.len < s->sess.n_stored ? s->table.len / B : s->sess.n_stored / B;
    if (n_full > r->n_ctx / B + 1) n_full = r->n_ctx / B + 1; /* the keys' capacity */
    kv_hash h = s->n_hashes > 0 ? s->hashes[s->n_hashes - 1] : r->kv_seed;
    for (int32_t k = s->n_hashes; k < n_full; k++)
        s->hashes[k] = h = kv_hash_next(h, s->sess.stored + (size_t)k * B, B);
    if (n_full > s->n_hashes) s->n_hashes = n_full;
    for (int32_t k = 0; k < s->n_hashes && k < s->table.n_blocks; k++)
        if (s->table.data[k] && !kv_store_known(r->store, s->hashes[k]))
            kv_store_put(r->store, s->hashes[k], s->table.data[k]);
    if (r->wstore) window_publish(r, s);
}

/* $HEARTH_<name>, else $OLLAMA_<name> (what Ollama's users have set), else fallback */
static int32_t env_int(const char *name, int32_t fallback) {
    const char *prefixes[] = {"HEARTH_", "OLLAMA_"};
    for (int i = 0; i < 2; i++) {
        char full[64];
        snprintf(full, sizeof full, "%s%s", prefixes[i], name);
        const char *v = getenv(full);
        if (!v || !*v) continue;
        char *end;
        long x = strtol(v, &end, 10);
        if (*end || x <= 0 || x > 1 << 20) continue;
        return (int32_t)x;
    }
    return fallback;
}

hl_status runner_create(const model *m, const runner_config *cfg, runner **out, hl_err *err) {
    *out = NULL;
    const model_hparams *hp = model_get_hparams(m);
    runner *r = calloc(1, sizeof *r);
    if (!r) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    r->m = m;
    r->causal = model_is_causal(m);
    r->n_ctx = cfg->n_ctx > 0 ? cfg->n_ctx : hp->n_ctx_train;
    if (r->n_ctx <= 0) r->n_ctx = 2048;
    r->chunk = cfg->prefill_chunk > 0 ? cfg->prefill_chunk : RUNNER_PREFILL_CHUNK;
    r->n_parallel = cfg->n_parallel > 0 ? cfg->n_parallel
                                        : env_int("NUM_PARALLEL", RUNNER_NUM_PARALLEL);
    r->max_queue = cfg->max_queue > 0 ? cfg->max_queue
                                      : env_int("MAX_QUEUE", RUNNER_MAX_QUEUE);
    r->batch_tokens = cfg->batch_tokens > 0 ? cfg->batch_tokens : RUNNER_BATCH_TOKENS;
    if (r->batch_tokens < r->n_parallel) r->batch_tokens = r->n_parallel;
    r->ack_wait_ns = cfg->ack_wait_us < 0 ? -1
                     : (int64_t)(cfg->ack_wait_us ? cfg->ack_wait_us : RUNNER_ACK_WAIT_US) * 1000;
    hl_type kv_type = HL_TYPE_F16;
    if (cfg->kv_type && *cfg->kv_type && !kv_type_parse(cfg->kv_type, &kv_type)) {
        free(r);
        return hl_fail(err, HL_ERR_INVALID, "invalid KV cache type \"%s\" (f32, f16 or q8_0)",
                       cfg->kv_type);
    }
    if (kv_type != HL_TYPE_F32 && model_has_kv(m)) {
        /* q8_0 rows need heads of whole 32-element blocks: else f16, as llama.cpp would
         * refuse the quantized cache */
        kv_geom g;
        hl_err gerr;
        const kv_geom *mg = model_kv_geom(m);
        hl_status gst = kv_geom_init(&g, mg->n_layer, mg->dims, kv_type, kv_type, &gerr);
        if (!gst) gst = model_check_kv_geom(m, &g, &gerr);
        kv_geom_free(&g);
        if (gst && kv_type == HL_TYPE_Q8_0) {
            HL_WARN("runner: %s KV cache not possible for this model (%s): using f16",
                    hl_type_name(kv_type), gerr.msg);
            kv_type = HL_TYPE_F16;
        }
    }
    r->kv_type = kv_type;
    /* One pool per cache slot, each laid out for its layers; the budget is shared in
     * proportion to what a position costs in each (what full caches would hold). */
    const int32_t n_slots = model_kv_slots(m);
    const size_t budget = cfg->kv_budget_bytes ? cfg->kv_budget_bytes : kv_default_budget();
    const kv_geom *g0 = model_kv_slot_geom(m, 0), *g1 = model_kv_slot_geom(m, 1);
    const size_t bpp0 = n_slots > 1 ? g0->bytes_per_pos : 1, bpp1 = n_slots > 1 ? g1->bytes_per_pos : 0;
    kv_pool_config pc = {
        .layout = {.n_layer = hp->n_layer, .n_head_kv = hp->n_head_kv,
                   .head_dim_k = hp->head_dim_k, .head_dim_v = hp->head_dim_v,
                   .block_tokens = cfg->block_tokens > 0 ? cfg->block_tokens : RUNNER_BLOCK_TOKENS,
                   .layers = n_slots > 1 ? g0->dims : model_kv_geom(m)->dims,
                   .k_type = kv_type, .v_type = kv_type},
        .budget_bytes = (size_t)((double)budget * (double)bpp0 / (double)(bpp0 + bpp1)),
        .spill_dir = cfg->spill_dir,
        .spill_max_bytes = cfg->spill_max_bytes,
    };
    kv_pool_config wpc = pc;
    if (n_slots > 1) {
        wpc.layout.layers = g1->dims;
        wpc.budget_bytes = budget - pc.budget_bytes;
    }
    const size_t np = (size_t)r->n_parallel;
    r->seqs = calloc(np, sizeof *r->seqs);
    r->entries = calloc(np, sizeof *r->entries);
    r->entry_seq = calloc(np, sizeof *r->entry_seq);
    r->slots = calloc(np, sizeof *r->slots);
    r->sample_seq = calloc(np, sizeof *r->sample_seq);
    r->outs = calloc(np, sizeof *r->outs);
    r->logits = calloc(np * (size_t)hp->n_vocab, sizeof(float));
    hl_status st = HL_OK;
    if (!r->seqs || !r->entries || !r->entry_seq || !r->slots || !r->sample_seq || !r->outs ||
        !r->logits)
        st = hl_fail(err, HL_ERR_NOMEM, "out of memory for %d parallel sequences", r->n_parallel);
    if (!st && n_slots > 0) st = kv_pool_create(&pc, &r->pool, err);
    if (!st && n_slots > 1) st = kv_pool_create(&wpc, &r->wpool, err);
    r->pools = (kv_pool_set){.pools = {r->pool, r->wpool}, .n = n_slots};
    /* the caches of a sequence: its KV slots, then the recurrent state */
    const size_t state_floats = model_state_floats(m);
    r->n_caches = n_slots + (state_floats > 0);
    /* recurrent snapshots are copies outside the pools, paged by a budget of their own
     * (snapshot_budget_bytes, else the size of the KV budget; compressed, then spilled
     * beside the blocks) */
    if (!st && state_floats > 0) {
        kv_state_pager_config spc = {.budget_bytes = cfg->snapshot_budget_bytes
                                                          ? cfg->snapshot_budget_bytes
                                                          : budget,
                                         .spill_dir = cfg->spill_dir,
                                         .spill_max_bytes = cfg->spill_max_bytes};
        st = kv_state_pager_create(&spc, &r->spager, err);
        r->pools.state_pager = r->spager;
    }
    if (r->n_caches == 0) st = hl_fail(err, HL_ERR_INVALID, "the model keeps no cache at all");
    if (!st) {
        for (int32_t i = 0; i < r->n_parallel && !st; i++) {
            seq *s = &r->seqs[i];
            s->slot = i;
            if (n_slots > 0) {
                kv_table_init(&s->table, r->pool);
                s->caches[0] = (kv_cache){&kv_block_cache_ops, &s->table};
            }
            if (n_slots > 1) {
                kv_table_init(&s->wtable, r->wpool);
                s->window = (kv_window_cache){&s->wtable, model_kv_window(m)};
                s->caches[1] = (kv_cache){&kv_window_cache_ops, &s->window};
            }
            if (state_floats > 0) {
                st = kv_state_cache_init(&s->state, state_floats, err);
                s->state.pager = r->spager;
                s->caches[n_slots] = (kv_cache){&kv_state_cache_ops, &s->state};
            }
        }
        /* sequence 0 uses the config's caches: the trie's first lane (NULL) */
    }
    if (!st) st = store_open(r, cfg, err);
    if (!st) {
        kv_prefix_config tc = {.caches = r->seqs[0].caches, .n_caches = r->n_caches,
                               .over_budget = kv_pool_set_over_budget, .budget_ctx = &r->pools,
                               .page_out_on_close = true};
        st = kv_prefix_create(&tc, &r->pc, err);
    }
    for (int32_t i = 1; !st && i < r->n_parallel; i++)
        st = kv_prefix_add_lane(r->pc, r->seqs[i].caches, &r->seqs[i].lane, err);
    if (!st) st = model_ctx_create(m, cfg->n_threads, r->batch_tokens, &r->ctx, err);
    if (!st) model_ctx_set_n_ctx(r->ctx, r->n_ctx); /* longrope picks its factors by it */
    if (!st) st = sampler_create(hp->n_vocab, r->n_ctx, &r->smp, err);
    if (!st) {
        bool mu = pthread_mutex_init(&r->mu, NULL) == 0;
        bool kv = pthread_mutex_init(&r->kv_mu, NULL) == 0;
        /* the ack wait is a timed wait: on the monotonic clock, immune to clock changes */
        pthread_condattr_t ca;
        bool cv = pthread_condattr_init(&ca) == 0;
        if (cv) {
            cv = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                 pthread_cond_init(&r->loop_cv, &ca) == 0;
            pthread_condattr_destroy(&ca);
        }
        r->locks_ready = mu && kv && cv;
        if (!r->locks_ready) {
            if (mu) pthread_mutex_destroy(&r->mu);
            if (kv) pthread_mutex_destroy(&r->kv_mu);
            if (cv) pthread_cond_destroy(&r->loop_cv);
            st = hl_fail(err, HL_ERR_NOMEM, "cannot create the runner's locks");
        }
    }
    if (!st) {
        if (pthread_create(&r->thread, NULL, batch_main, r) != 0)
            st = hl_fail(err, HL_ERR_NOMEM, "cannot start the batch thread");
        else
            r->thread_started = true;
    }
    if (st) {
        runner_destroy(r);
        return st;
    }
    *out = r;
    return HL_OK;
}

void runner_destroy(runner *r) {
    if (!r) return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_signal(&r->loop_cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    }
    if (r->locks_ready) {
        pthread_mutex_destroy(&r->mu);
        pthread_mutex_destroy(&r->kv_mu);
        pthread_cond_destroy(&r->loop_cv);
    }
    kv_store_close(r->store); /* writes what is queued */
    kv_store_close(r->sstore);
    kv_store_close(r->wstore);
    free(r->srec);
    if (r->seqs)
        for (int32_t i = 0; i < r->n_parallel; i++) free(r->seqs[i].hashes);
    sampler_destroy(r->smp);
    model_ctx_free(r->ctx);
    kv_prefix_destroy(r->pc); /* releases the trie's blocks */
    if (r->pool && r->seqs)
        for (int32_t i = 0; i < r->n_parallel; i++) kv_table_free(&r->seqs[i].table);
    if (r->wpool && r->seqs)
        for (int32_t i = 0; i < r->n_parallel; i++) kv_table_free(&r->seqs[i].wtable);
    if (r->seqs)
        for (int32_t i = 0; i < r->n_parallel; i++) kv_state_cache_free(&r->seqs[i].state);
    kv_state_pager_destroy(r->spager); /* after the trie closed its snapshots */
    kv_pool_destroy(r->pool);
    kv_pool_destroy(r->wpool);
    free(r->seqs);
    free(r->entries);
    free(r->entry_seq);
    free(r->slots);
    free(r->sample_seq);
    free(r->outs);
    free(r->logits);
    free(r);
}

hl_type runner_kv_type(const runner *r) { return r->kv_type; }

int32_t runner_n_ctx(const runner *r) { return r->n_ctx; }
int32_t runner_n_parallel(const runner *r) { return r->n_parallel; }
kv_pool *runner_kv_pool(runner *r) { return r->pool; }
kv_pool *runner_kv_window_pool(runner *r) { return r->wpool; }
sampler *runner_sampler(runner *r) { return r->smp; }
struct kv_prefix *runner_prefix_cache(runner *r) { return r->pc; }

runner_load runner_get_load(runner *r) {
    pthread_mutex_lock(&r->mu);
    runner_load l = {.queued = r->n_queued, .active = r->n_active, .steps = r->n_steps,
                     .step_tokens = r->n_step_tokens};
    pthread_mutex_unlock(&r->mu);
    return l;
}

hl_status runner_prepare(const runner *r, const runner_request *req, int32_t *num_predict,
                         hl_err *err) {
    if (!model_has_logits(r->m))
        return hl_fail(err, HL_ERR_UNSUPPORTED,
                       "this is an embedding model: it cannot generate text");
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

static bool is_stop(const runner *r, const runner_request *req, int32_t tok) {
    const tok_vocab *v = model_vocab(r->m);
    if (v && tok_is_eog(v, tok)) return true;
    for (int32_t i = 0; i < req->n_stop_tokens; i++)
        if (req->stop_tokens[i] == tok) return true;
    return false;
}

static int64_t since(uint64_t t0) { return (int64_t)(hl_time_ns() - t0); }

/* ---- a sequence's caches, slot by slot ---- */

/* Empties every cache of the sequence (an embedding starts from nothing). */
static void caches_clear(runner *r, seq *s) {
    if (r->pool) kv_table_truncate(&s->table, 0);
    if (r->wpool) kv_table_truncate(&s->wtable, 0);
    if (s->state.state) kv_state_cache_ops.free_state(&s->state);
}

static hl_status caches_prealloc(runner *r, seq *s, int32_t n, hl_err *e) {
    hl_status st = r->pool ? kv_table_prealloc(&s->table, n, e) : HL_OK;
    if (!st && r->wpool) st = kv_table_prealloc(&s->wtable, n, e);
    return st;
}

static hl_status caches_reserve(runner *r, seq *s, int32_t n, hl_err *e) {
    hl_status st = r->pool ? kv_table_reserve(&s->table, n, e) : HL_OK;
    if (!st && r->wpool) st = kv_table_reserve(&s->wtable, n, e);
    return st;
}

/* n positions were written: every cache advances (the state was updated in place). */
static void caches_commit(runner *r, seq *s, int32_t n) {
    if (r->pool) kv_table_commit(&s->table, n);
    if (r->wpool) {
        kv_table_commit(&s->wtable, n);
        /* the prompt's window blocks go to the tiers before the window drops them (the
         * last ones at the end of prefill: no copies while decoding) */
        if (r->wstore && s->phase == SEQ_PREFILL) window_publish(r, s);
        kv_window_trim(&s->window);
    }
    if (s->state.state) s->state.offset += n;
}

/* The batch entry's view of the sequence's caches. */
static void caches_view(runner *r, seq *s, model_batch_entry *en) {
    if (r->pool)
        en->kv = (model_kv_view){.blocks = s->table.data, .n_blocks = s->table.n_blocks,
                                 .block_tokens = kv_pool_layout(r->pool)->block_tokens,
                                 .len = s->table.len, .geom = kv_pool_geom(r->pool)};
    else
        en->kv = (model_kv_view){.len = s->state.offset};
    en->kv.state = s->state.state;
    if (r->wpool)
        en->kv_window = (model_kv_view){
            .blocks = s->wtable.data, .n_blocks = s->wtable.n_blocks,
            .block_tokens = kv_pool_layout(r->wpool)->block_tokens, .len = s->wtable.len,
            .geom = kv_pool_geom(r->wpool)};
}

/* ---- the batch thread ---- */

/* Ends a sequence: records its tokens in the trie, frees its lane, slot and blocks, and
 * hands the final status to the caller. */
static void seq_finish(runner *r, seq *s, hl_status st, const hl_err *e) {
    runner_stats rs = s->rs;
    if (s->t_eval) rs.eval_duration_ns = since(s->t_eval);
    hl_err fe = {0};
    if (st && e) fe = *e;
    pthread_mutex_lock(&r->kv_mu);
    if (s->job->hidden) {
        caches_clear(r, s); /* an embedding's KV is not kept */
    } else {
        if (r->store && s->sess.open) store_publish(r, s);
        /* the trie must record what the cache holds, whatever happened */
        hl_err ce;
        hl_status cs = kv_session_close(&s->sess, &ce);
        if (cs && !st) {
            st = cs;
            fe = ce;
        }
        kv_lane_reset(r->pc, s->lane);
    }
    pthread_mutex_unlock(&r->kv_mu);
    if (s->have_slot) sampler_remove(r->smp, s->slot);
    s->have_slot = false;
    pthread_mutex_lock(&r->mu);
    job *j = s->job;
    j->finished = true;
    j->status = st;
    j->stats = rs;
    j->err = fe;
    pthread_cond_signal(&j->cv);
    s->job = NULL;
    s->phase = SEQ_FREE;
    r->n_active--;
    pthread_mutex_unlock(&r->mu);
}

static void seq_fail(runner *r, seq *s, hl_status code, const char *msg) {
    hl_err e;
    hl_fail(&e, code, "%s", msg);
    seq_finish(r, s, code, &e);
}

/* Admission: match the trie, restore the prefix, register the sampler slot. */
static void seq_start(runner *r, seq *s) {
    const runner_request *req = s->job->req;
    const int32_t n = req->n_tokens;
    hl_err e = {0};
    pthread_mutex_lock(&r->kv_mu);
    hl_status st = kv_prefix_begin_lane(r->pc, s->lane, req->tokens, n, &s->sess, &e);
    const int32_t from_ram = st ? 0 : s->sess.prefix;
    if (!st && (r->store || r->sstore)) st = tiers_extend(r, s, &e);
    if (!st) {
        s->rs.cached_tokens = s->sess.prefix;
        r->cstats.requests++;
        r->cstats.prompt_tokens += (uint64_t)n;
        r->cstats.cached_ram += (uint64_t)from_ram;
        r->cstats.cached_disk += (uint64_t)s->rs.cached_disk;
        r->cstats.cached_remote += (uint64_t)s->rs.cached_remote;
        if (r->store || r->sstore)
            HL_INFO("runner: prompt %d tokens, cached %d (ram %d, disk %d, remote %d)", n,
                    s->sess.prefix, from_ram, s->rs.cached_disk, s->rs.cached_remote);
        kv_session_schedule_prefill(&s->sess);
        /* offsets the caller expects to be shared (offsets at or below the restored
         * prefix, or past the prompt, are ignored by the session) */
        if (model_state_floats(r->m) > 0)
            for (int32_t i = 0; req->snapshot_at && i < req->n_snapshot_at; i++)
                kv_session_request_snapshot(&s->sess, req->snapshot_at[i], true);
        /* decode must not allocate per token: size the bookkeeping for the whole request */
        st = kv_session_reserve_outputs(&s->sess, s->job->num_predict, &e);
    }
    if (!st) st = caches_prealloc(r, s, n + s->job->num_predict, &e);
    pthread_mutex_unlock(&r->kv_mu);
    if (!st) st = sampler_add(r->smp, s->slot, &req->sampling, req->tokens, (size_t)n, &e);
    if (st) {
        seq_finish(r, s, st, &e);
        return;
    }
    s->have_slot = true;
    s->done = s->sess.prefix;
    if (n - s->done > 1) {
        s->phase = SEQ_PREFILL;
    } else {
        s->phase = SEQ_DECODE;
        s->next_token = req->tokens[n - 1];
        if (r->store) store_publish(r, s);
    }
}

/* Admission of an embedding: a fresh KV (the lane's table, empty between requests) for all
 * its positions. */
static void embed_start(runner *r, seq *s) {
    hl_err e = {0};
    pthread_mutex_lock(&r->kv_mu);
    caches_clear(r, s);
    hl_status st = caches_prealloc(r, s, s->job->req->n_tokens, &e);
    pthread_mutex_unlock(&r->kv_mu);
    if (st) {
        seq_finish(r, s, st, &e);
        return;
    }
    s->done = 0;
    s->phase = SEQ_EMBED;
}

static bool job_cancelled(const job *j) {
    const runner_request *req = j->req;
    return j->refused || (req->cancel && atomic_load_explicit(req->cancel, memory_order_relaxed));
}

static bool seq_waiting(const seq *s) {
    return s->job && (s->job->has_progress || s->job->has_token);
}

static void add_ns(struct timespec *ts, int64_t ns) {
    ts->tv_nsec += ns % 1000000000;
    ts->tv_sec += ns / 1000000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_nsec -= 1000000000;
        ts->tv_sec++;
    }
}

/* Under mu: waits for work, admits queued jobs, and marks which sequences step now.
 * Returns false when the thread should exit. */
static bool gather(runner *r) {
    for (;;) {
        for (int32_t i = 0; i < r->n_parallel && r->q_head; i++) {
            seq *s = &r->seqs[i];
            if (s->phase != SEQ_FREE) continue;
            job *j = r->q_head;
            r->q_head = j->next;
            if (!r->q_head) r->q_tail = NULL;
            r->n_queued--;
            r->n_active++;
            s->job = j;
            s->phase = SEQ_NEW;
            s->admitted = r->n_admitted++;
            s->rs = (runner_stats){.prompt_eval_count = j->req->n_tokens,
                                   .done_reason = RUNNER_DONE_LENGTH};
            s->t_start = hl_time_ns();
            s->t_eval = 0;
        }
        bool any_ready = false, any_waiting = false;
        for (int32_t i = 0; i < r->n_parallel; i++) {
            seq *s = &r->seqs[i];
            if (!s->job) continue;
            if (seq_waiting(s)) any_waiting = true;
            else any_ready = true;
        }
        if (r->stop) { /* cancel what is left */
            while (r->q_head) {
                job *j = r->q_head;
                r->q_head = j->next;
                r->n_queued--;
                j->finished = true;
                j->status = hl_fail(&j->err, HL_ERR_CANCELLED, "request cancelled");
                pthread_cond_signal(&j->cv);
            }
            r->q_tail = NULL;
            if (!any_ready && !any_waiting) return false;
            if (any_ready) break;
        }
        if (!any_ready) {
            r->batch_idle = true;
            pthread_cond_wait(&r->loop_cv, &r->mu);
            r->batch_idle = false;
            continue;
        }
        if (any_waiting) {
            /* give the callers of the last step a moment, so their sequences join this one
             * (callers already late before it are not waited for again) */
            if (r->ack_wait_ns < 0) {
                r->batch_idle = true;
                pthread_cond_wait(&r->loop_cv, &r->mu);
                r->batch_idle = false;
                continue;
            }
            struct timespec dl;
            clock_gettime(CLOCK_MONOTONIC, &dl);
            add_ns(&dl, r->ack_wait_ns);
            bool timed_out = false;
            for (;;) {
                bool waiting = false;
                for (int32_t i = 0; i < r->n_parallel; i++) {
                    const seq *s = &r->seqs[i];
                    if (seq_waiting(s) && s->job->posted_at == r->n_steps &&
                        !job_cancelled(s->job))
                        waiting = true;
                }
                if (!waiting || r->stop || timed_out) break;
                r->batch_idle = true;
                timed_out = pthread_cond_timedwait(&r->loop_cv, &r->mu, &dl) == ETIMEDOUT;
                r->batch_idle = false;
            }
        }
        break;
    }
    for (int32_t i = 0; i < r->n_parallel; i++) {
        seq *s = &r->seqs[i];
        s->ready = s->job && !seq_waiting(s);
        s->cancel = s->ready && (r->stop || job_cancelled(s->job));
        s->step_n = 0;
    }
    return true;
}

/* Posts this step's events to the callers (under mu). */
static void post_progress(runner *r, seq *s) {
    if (!s->job->req->progress) return;
    pthread_mutex_lock(&r->mu);
    s->job->has_progress = true;
    s->job->posted_at = r->n_steps;
    s->job->processed = s->done;
    pthread_cond_signal(&s->job->cv);
    pthread_mutex_unlock(&r->mu);
}

static void post_token(runner *r, seq *s, const sampler_out *so) {
    if (!s->job->req->emit) return;
    pthread_mutex_lock(&r->mu);
    s->job->has_token = true;
    s->job->posted_at = r->n_steps;
    s->job->so = *so;
    pthread_cond_signal(&s->job->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Oldest admitted prefill or embedding that still needs a chunk this step and can have
 * one within budget (a non-causal embedding only whole), or NULL. */
static seq *next_prefill(runner *r, int32_t budget) {
    seq *best = NULL;
    for (int32_t i = 0; i < r->n_parallel; i++) {
        seq *s = &r->seqs[i];
        if (!s->ready || s->step_n != 0 || (s->phase != SEQ_PREFILL && s->phase != SEQ_EMBED))
            continue;
        if (s->phase == SEQ_EMBED && !r->causal && s->job->req->n_tokens - s->done > budget)
            continue;
        if (!best || s->admitted < best->admitted) best = s;
    }
    return best;
}

static void step(runner *r) {
    const int32_t n_vocab = model_get_hparams(r->m)->n_vocab;
    for (int32_t i = 0; i < r->n_parallel; i++) {
        seq *s = &r->seqs[i];
        if (!s->ready) continue;
        if (s->cancel) {
            seq_fail(r, s, HL_ERR_CANCELLED, "request cancelled");
            s->ready = false;
            continue;
        }
        if (s->phase == SEQ_NEW) {
            if (s->job->hidden) embed_start(r, s);
            else seq_start(r, s);
        }
        if (!s->job) s->ready = false; /* failed to start */
    }

    /* the batch: every decoding sequence's next token, then prefill chunks */
    int32_t n_entries = 0, n_tokens = 0;
    hl_err e = {0};
    for (int32_t pass = 0; pass < 2; pass++) {
        for (;;) {
            seq *s = NULL;
            int32_t n = 0;
            const int32_t *toks = NULL;
            float *hidden = NULL;
            if (pass == 0) {
                for (int32_t i = 0; i < r->n_parallel && !s; i++) {
                    seq *c = &r->seqs[i];
                    if (c->ready && c->phase == SEQ_DECODE && c->step_n == 0) s = c;
                }
                if (!s) break;
                n = 1;
                toks = &s->next_token;
            } else {
                int32_t budget = r->batch_tokens - n_tokens;
                if (budget <= 0 || !(s = next_prefill(r, budget))) break;
                const int32_t n_prompt = s->job->req->n_tokens;
                toks = s->job->req->tokens + s->done;
                if (s->phase == SEQ_EMBED) { /* every token; the last one's state too */
                    n = n_prompt - s->done;
                    if (r->causal && n > r->chunk) n = r->chunk;
                    if (n > budget) n = budget; /* non-causal: fits (next_prefill) */
                    hidden = s->job->hidden + (size_t)s->done * model_get_hparams(r->m)->n_embd;
                } else {
                    n = n_prompt - s->done - 1;
                    if (n > r->chunk) n = r->chunk;
                    if (n > budget) n = budget;
                    int32_t next = kv_session_next_snapshot(&s->sess);
                    if (next > s->done && next < s->done + n) n = next - s->done;
                }
            }
            s->step_n = n; /* marks it handled this step, even when reserve fails */
            pthread_mutex_lock(&r->kv_mu);
            hl_status st = caches_reserve(r, s, n, &e);
            pthread_mutex_unlock(&r->kv_mu);
            if (st) {
                seq_finish(r, s, st, &e);
                s->ready = false;
                continue;
            }
            model_batch_entry *en = &r->entries[n_entries];
            *en = (model_batch_entry){.tokens = toks, .n_tokens = n, .want_logits = pass == 0,
                                      .hidden = hidden};
            caches_view(r, s, en);
            r->entry_seq[n_entries++] = s->slot;
            n_tokens += n;
        }
    }
    if (n_entries == 0) return;

    hl_status st = model_eval_batch(r->ctx, r->entries, n_entries, r->logits, &e);
    pthread_mutex_lock(&r->mu);
    r->n_steps++;
    r->n_step_tokens += (uint64_t)n_tokens;
    pthread_mutex_unlock(&r->mu);
    if (st) { /* nothing was written: every sequence of the batch fails */
        for (int32_t k = 0; k < n_entries; k++) seq_finish(r, &r->seqs[r->entry_seq[k]], st, &e);
        return;
    }

    /* commit; prefill bookkeeping */
    int32_t n_sample = 0;
    for (int32_t k = 0; k < n_entries; k++) {
        seq *s = &r->seqs[r->entry_seq[k]];
        pthread_mutex_lock(&r->kv_mu);
        caches_commit(r, s, s->step_n);
        st = HL_OK;
        if (s->phase == SEQ_EMBED) {
            pthread_mutex_unlock(&r->kv_mu);
            s->done += s->step_n;
            if (s->done == s->job->req->n_tokens) {
                model_pool(r->m, s->job->hidden, s->done, false, s->job->embed_out);
                s->rs.prompt_eval_duration_ns = since(s->t_start);
                seq_finish(r, s, HL_OK, NULL);
            }
            continue;
        }
        if (s->phase == SEQ_PREFILL) {
            s->done += s->step_n;
            int32_t next = kv_session_next_snapshot(&s->sess);
            if (next >= 0 && s->done >= next) {
                if (r->sstore && s->done == next) state_publish(r, s, next);
                st = kv_session_snapshot(&s->sess, &e);
            }
        }
        pthread_mutex_unlock(&r->kv_mu);
        if (st) {
            seq_finish(r, s, st, &e);
            continue;
        }
        if (s->phase == SEQ_PREFILL) {
            post_progress(r, s);
            if (s->job->req->n_tokens - s->done <= 1) {
                s->phase = SEQ_DECODE;
                s->next_token = s->job->req->tokens[s->job->req->n_tokens - 1];
                if (r->store) store_publish(r, s);
            }
        } else {
            r->slots[n_sample] = s->slot;
            r->sample_seq[n_sample++] = k; /* logits row k: decode entries come first */
        }
    }
    if (n_sample == 0) return;

    /* the rows are this step's scratch: hooks edit them in place */
    for (int32_t k = 0; k < n_sample; k++) {
        const runner_request *req = r->seqs[r->slots[k]].job->req;
        if (req->logits_hook) req->logits_hook(req->user, r->logits + (size_t)k * n_vocab, n_vocab);
    }
    /* one sampler call for every sequence that produced logits */
    st = sampler_sample(r->smp, r->slots, n_sample, r->logits, (size_t)n_vocab, r->outs, &e);
    if (st) { /* find the bad rows: sample one at a time, failing only those */
        for (int32_t k = 0; k < n_sample; k++) {
            hl_err ek;
            if (sampler_sample(r->smp, &r->slots[k], 1, r->logits + (size_t)k * n_vocab,
                               (size_t)n_vocab, &r->outs[k], &ek) != HL_OK) {
                seq_finish(r, &r->seqs[r->slots[k]], ek.code, &ek);
                r->slots[k] = -1;
            }
        }
    }
    for (int32_t k = 0; k < n_sample; k++) {
        if (r->slots[k] < 0) continue;
        seq *s = &r->seqs[r->slots[k]];
        const sampler_out *so = &r->outs[k];
        const runner_request *req = s->job->req;
        if (!s->t_eval) {
            s->rs.prompt_eval_duration_ns = since(s->t_start);
            s->t_eval = hl_time_ns();
        }
        /* recorded even when it is a stop token: the trie may keep it */
        st = kv_session_add_outputs(&s->sess, &so->token, 1, &e);
        if (st) {
            seq_finish(r, s, st, &e);
            continue;
        }
        if (is_stop(r, req, so->token)) {
            s->rs.done_reason = RUNNER_DONE_STOP;
            seq_finish(r, s, HL_OK, NULL);
            continue;
        }
        s->rs.eval_count++;
        post_token(r, s, so);
        if (s->rs.eval_count >= s->job->num_predict) seq_finish(r, s, HL_OK, NULL);
        else s->next_token = so->token;
    }
}

static void *batch_main(void *arg) {
    runner *r = arg;
    pthread_mutex_lock(&r->mu);
    while (gather(r)) {
        pthread_mutex_unlock(&r->mu);
        step(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- callers ---- */

static hl_status finish_early(const runner_request *req, hl_status st, hl_err *e,
                              runner_stats *stats, hl_err *err) {
    runner_stats rs = {0};
    if (req->emit) {
        runner_event ev = {.kind = RUNNER_EV_ERROR, .stats = rs, .status = st, .message = e->msg};
        req->emit(req->user, &ev);
    }
    if (stats) *stats = rs;
    if (err) *err = *e;
    return st;
}

hl_status runner_generate(runner *r, const runner_request *req, runner_stats *stats, hl_err *err) {
    hl_err e = {0};
    job j = {.req = req};
    hl_status st = runner_prepare(r, req, &j.num_predict, &e);
    if (st) return finish_early(req, st, &e, stats, err);
    if (pthread_cond_init(&j.cv, NULL) != 0) {
        st = hl_fail(&e, HL_ERR_NOMEM, "cannot create a condition variable");
        return finish_early(req, st, &e, stats, err);
    }
    pthread_mutex_lock(&r->mu);
    if (r->stop || r->n_queued >= r->max_queue) {
        pthread_mutex_unlock(&r->mu);
        pthread_cond_destroy(&j.cv);
        st = r->stop ? hl_fail(&e, HL_ERR_CANCELLED, "request cancelled")
                     : hl_fail(&e, HL_ERR_BUSY, RUNNER_BUSY_MESSAGE);
        return finish_early(req, st, &e, stats, err);
    }
    if (r->q_tail) r->q_tail->next = &j;
    else r->q_head = &j;
    r->q_tail = &j;
    r->n_queued++;
    pthread_cond_signal(&r->loop_cv);
    bool refused = false;
    uint64_t beat_steps = r->n_steps;
    for (;;) {
        /* waiting (queued, or not stepped): a heartbeat through progress every
         * RUNNER_BEAT_MS while the batch thread makes progress (runner_heartbeat_fn) */
        bool beat = false;
        while (!j.has_progress && !j.has_token && !j.finished && !beat) {
            if (!req->heartbeat) {
                pthread_cond_wait(&j.cv, &r->mu);
                continue;
            }
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl); /* j.cv's clock */
            add_ns(&dl, (int64_t)RUNNER_BEAT_MS * 1000000);
            if (pthread_cond_timedwait(&j.cv, &r->mu, &dl) != ETIMEDOUT) continue;
            beat = r->n_steps != beat_steps || r->batch_idle;
            beat_steps = r->n_steps;
        }
        if (!j.has_progress && !j.has_token) {
            if (!beat) break; /* finished, all delivered */
            pthread_mutex_unlock(&r->mu);
            if (!refused) refused = !req->heartbeat(req->user);
            pthread_mutex_lock(&r->mu);
            if (refused && !j.refused) {
                j.refused = true;
                pthread_cond_signal(&r->loop_cv);
            }
            continue;
        }
        beat_steps = r->n_steps;
        const bool progress = j.has_progress;
        const int32_t processed = j.processed;
        const sampler_out so = j.so; /* copied: the callback runs without the lock */
        pthread_mutex_unlock(&r->mu);
        if (!refused) {
            if (progress) {
                refused = !req->progress(req->user, processed, req->n_tokens);
            } else {
                runner_event ev = {.kind = RUNNER_EV_TOKEN, .token = so.token, .sample = &so};
                refused = !req->emit(req->user, &ev);
            }
        }
        pthread_mutex_lock(&r->mu);
        j.has_progress = j.has_token = false;
        j.refused = refused;
        pthread_cond_signal(&r->loop_cv); /* acknowledged: the sequence may step again */
    }
    pthread_mutex_unlock(&r->mu);
    pthread_cond_destroy(&j.cv);
    st = j.status;
    e = j.err;
    if (refused && !st) /* refused the last token: the request still counts as cancelled */
        st = hl_fail(&e, HL_ERR_CANCELLED, "request cancelled");
    if (req->emit) {
        runner_event ev = {.kind = st ? RUNNER_EV_ERROR : RUNNER_EV_DONE, .stats = j.stats,
                           .status = st, .message = st ? e.msg : NULL};
        req->emit(req->user, &ev);
    }
    if (stats) *stats = j.stats;
    if (st && err) *err = e;
    return st;
}

hl_status runner_embed(runner *r, const int32_t *tokens, int32_t n, float *out, hl_err *err) {
    if (n <= 0 || !tokens) return hl_fail(err, HL_ERR_INVALID, "no tokens to embed");
    if (n > r->n_ctx)
        return hl_fail(err, HL_ERR_INVALID,
                       "input length (%d tokens) exceeds the model's maximum context length (%d "
                       "tokens)",
                       n, r->n_ctx);
    if (!r->causal && n > r->batch_tokens)
        return hl_fail(err, HL_ERR_INVALID,
                       "input length (%d tokens) exceeds the batch size (%d tokens): this model "
                       "needs the whole input in one batch",
                       n, r->batch_tokens);
    const int32_t n_vocab = model_get_hparams(r->m)->n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return hl_fail(err, HL_ERR_INVALID,
                           "token %d (at index %d) is outside the vocabulary [0, %d)", tokens[i],
                           i, n_vocab);
    const size_t E = (size_t)model_get_hparams(r->m)->n_embd;
    runner_request req = {.tokens = tokens, .n_tokens = n};
    job j = {.req = &req, .embed_out = out};
    j.hidden = malloc((size_t)n * E * sizeof *j.hidden);
    if (!j.hidden) return hl_fail(err, HL_ERR_NOMEM, "out of memory for %d hidden states", n);
    if (pthread_cond_init(&j.cv, NULL) != 0) {
        free(j.hidden);
        return hl_fail(err, HL_ERR_NOMEM, "cannot create a condition variable");
    }
    hl_status st = HL_OK;
    pthread_mutex_lock(&r->mu);
    if (r->stop || r->n_queued >= r->max_queue) {
        st = r->stop ? hl_fail(err, HL_ERR_CANCELLED, "request cancelled")
                     : hl_fail(err, HL_ERR_BUSY, RUNNER_BUSY_MESSAGE);
    } else {
        if (r->q_tail) r->q_tail->next = &j;
        else r->q_head = &j;
        r->q_tail = &j;
        r->n_queued++;
        pthread_cond_signal(&r->loop_cv);
        while (!j.finished) pthread_cond_wait(&j.cv, &r->mu); /* no events: no callbacks */
        st = j.status;
        if (st && err) *err = j.err;
    }
    pthread_mutex_unlock(&r->mu);
    pthread_cond_destroy(&j.cv);
    free(j.hidden);
    return st;
}

/* ram_bytes = resident and recycled buffers + compressed bytes */
static size_t compressed_bytes(const kv_pool_stats *ps) {
    size_t plain = (ps->n_resident + ps->n_free) * ps->block_bytes;
    return ps->ram_bytes > plain ? ps->ram_bytes - plain : 0;
}

runner_memory runner_get_memory(const runner *r) {
    runner *rw = (runner *)r; /* the lock is not part of the observable state */
    pthread_mutex_lock(&rw->kv_mu);
    kv_pool_stats ps = r->pool ? kv_pool_get_stats(r->pool) : (kv_pool_stats){0};
    size_t comp = compressed_bytes(&ps);
    /* live recurrent states, and their snapshots in the trie by tier */
    const size_t state_bytes = model_state_floats(r->m) * sizeof(float);
    if (state_bytes) ps.ram_bytes += (size_t)r->n_parallel * state_bytes;
    if (r->spager) {
        kv_state_stats ss = kv_state_pager_get_stats(r->spager);
        ps.ram_bytes += ss.ram_bytes;
        comp += ss.ram_bytes - ss.n_resident * state_bytes;
        ps.disk_bytes += ss.disk_bytes;
    }
    if (r->wpool) {
        kv_pool_stats ws = kv_pool_get_stats(r->wpool);
        ps.ram_bytes += ws.ram_bytes;
        comp += compressed_bytes(&ws);
        ps.disk_bytes += ws.disk_bytes;
    }
    pthread_mutex_unlock(&rw->kv_mu);
    runner_memory m = {
        .weights = model_weight_bytes(r->m),
        .kv = ps.ram_bytes,
        .kv_compressed = comp,
        .kv_disk = ps.disk_bytes,
        .scratch = model_ctx_scratch_bytes(r->ctx) +
                   (size_t)r->n_parallel * (size_t)model_get_hparams(r->m)->n_vocab * sizeof(float),
    };
    m.total = m.weights + m.kv + m.scratch;
    return m;
}

runner_cache_stats runner_get_cache_stats(runner *r) {
    pthread_mutex_lock(&r->kv_mu);
    runner_cache_stats cs = r->cstats;
    if (r->spager) cs.state = kv_state_pager_get_stats(r->spager);
    pthread_mutex_unlock(&r->kv_mu);
    if (r->store) cs.store = kv_store_get_stats(r->store);
    if (r->sstore) cs.state_store = kv_store_get_stats(r->sstore);
    if (r->wstore) cs.state_store = kv_store_get_stats(r->wstore);
    return cs;
}

void runner_kv_flush(runner *r) {
    if (r->store) kv_store_flush(r->store);
    if (r->sstore) kv_store_flush(r->sstore);
    if (r->wstore) kv_store_flush(r->wstore);
}

void runner_page_out_idle(runner *r) {
    pthread_mutex_lock(&r->kv_mu);
    if (r->pool) kv_pool_page_out_cold(r->pool);
    if (r->wpool) kv_pool_page_out_cold(r->wpool);
    if (r->spager) kv_state_pager_page_out_all(r->spager);
    pthread_mutex_unlock(&r->kv_mu);
}
