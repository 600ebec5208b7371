/*
 * engine.c - the engine seam (engine.h) over the runner's pipeline (src/runner/): the
 * runner owns the prefix-trie KV cache shared across conversations, chunked prefill,
 * decoding with the slot sampler, exact num_predict and the context limit. This file
 * only adapts its event stream to engine.h's callbacks. Embeddings go through the same
 * runner (runner_embed: batched with whatever else runs, pooled as the model declares).
 */
#include "server/engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "kv/layout.h"
#include "model/model.h"
#include "runner/runner.h"
#include "server/engine_remote.h"

struct engine {
    eremote *remote; /* set: everything is forwarded to a runner process */
    model *m;
    runner *run;
    engine_info info;
    _Atomic uint64_t mem_bytes; /* measured after load and after every request */
    _Atomic uint64_t kv_ram, kv_comp, kv_disk; /* measured with mem_bytes */
    char *chat_template;
    engine_config cfg; /* as opened (its strings are the caller's, which outlive it) */
    pthread_mutex_t gv_mu;
    gram_vocab *gv; /* the vocabulary's byte trie, built on the first constrained request */
};

static void measure(engine *e) {
    runner_memory mem = runner_get_memory(e->run);
    atomic_store(&e->mem_bytes, (uint64_t)mem.total);
    atomic_store(&e->kv_ram, (uint64_t)(mem.kv - mem.kv_compressed));
    atomic_store(&e->kv_comp, (uint64_t)mem.kv_compressed);
    /* disk: blocks spilled from RAM and the block files of the disk tier (kv/store.h) */
    size_t tier = runner_get_cache_stats(e->run).store.disk_bytes;
    atomic_store(&e->kv_disk, (uint64_t)(mem.kv_disk + tier));
}

static void read_metadata(engine *e, const char *path) {
    gguf_file *f = NULL;
    if (gguf_open(path, &f, NULL) != HL_OK) return;
    gguf_str s;
    if (gguf_get_str(f, "tokenizer.chat_template", &s) && s.len > 0) {
        e->chat_template = malloc(s.len + 1);
        if (e->chat_template) {
            memcpy(e->chat_template, s.ptr, s.len);
            e->chat_template[s.len] = '\0';
        }
    }
    gguf_close(f);
}

bool engine_use_subprocess(void) {
    const char *v = getenv("HEARTH_RUNNER");
    return !(v && (strcmp(v, "inprocess") == 0 || strcmp(v, "in-process") == 0));
}

hl_status engine_open(const char *gguf_path, const engine_config *cfg, engine **out,
                      hl_err *err) {
    if (!engine_use_subprocess()) return engine_open_local(gguf_path, cfg, out, err);
    engine *e = calloc(1, sizeof *e);
    if (!e) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    e->cfg = *cfg;
    hl_status st = eremote_open(gguf_path, cfg, &e->remote, err);
    if (st) {
        free(e);
        return st;
    }
    *out = e;
    return HL_OK;
}

/* The prefix cache beyond the process (runner_config.kv_*): a model stored as a blob
 * (<models>/blobs/sha256-<hex>) keeps its blocks under <models>/kvcache/sha256-<hex>/
 * (HEARTH_KV_DISK_MAX caps them, 0 turns the disk tier off) and shares them through
 * HEARTH_KV_REDIS (for HEARTH_KV_REDIS_TTL seconds); a model file outside a store has no stable identity: both stay off. */
static void kv_tiers(const char *gguf_path, runner_config *rc, char *dir, size_t dir_cap,
                     char *id, size_t id_cap) {
    const char *slash = strrchr(gguf_path, '/');
    const char *name = slash ? slash + 1 : gguf_path;
    if (!slash || strncmp(name, "sha256-", 7) != 0 || strlen(name) != 7 + 64 ||
        slash - gguf_path < 6 || strncmp(slash - 6, "/blobs", 6) != 0)
        return;
    snprintf(id, id_cap, "%s", name);
    rc->kv_model_id = id;
    rc->kv_redis = getenv("HEARTH_KV_REDIS");
    const char *ttl = getenv("HEARTH_KV_REDIS_TTL"); /* seconds */
    if (ttl && *ttl) rc->kv_redis_ttl_s = atoi(ttl);
    const char *max = getenv("HEARTH_KV_DISK_MAX");
    size_t cap = 0;
    if (max && *max && !kv_store_parse_size(max, &cap)) {
        HL_WARN("HEARTH_KV_DISK_MAX=%s is not a size (e.g. 8G): using the default", max);
        cap = KV_STORE_DISK_MAX_DEFAULT;
    } else if (!max || !*max) {
        cap = KV_STORE_DISK_MAX_DEFAULT;
    }
    if (cap == 0) return; /* disk tier off */
    rc->kv_disk_max = cap;
    if (snprintf(dir, dir_cap, "%.*s/kvcache/%s", (int)(slash - 6 - gguf_path), gguf_path, name) <
        (int)dir_cap)
        rc->kv_store_dir = dir;
}

hl_status engine_open_local(const char *gguf_path, const engine_config *cfg, engine **out,
                            hl_err *err) {
    engine *e = calloc(1, sizeof *e);
    if (!e) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&e->gv_mu, NULL);
    e->cfg = *cfg;
    const model_load_opts lo = {.use_mmap = cfg->use_mmap};
    hl_status st = model_load_ex(gguf_path, NULL, &lo, &e->m, err);
    if (st) goto fail;
    if (!model_vocab(e->m)) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED, "the model has no tokenizer");
        goto fail;
    }
    const model_hparams *hp = model_get_hparams(e->m);
    int32_t n_ctx = cfg->num_ctx > 0 ? cfg->num_ctx : 4096;
    if (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) n_ctx = hp->n_ctx_train;
    if (n_ctx < 4) n_ctx = 4;
    runner_config rc = {.n_threads = cfg->n_threads, .n_ctx = n_ctx,
                        .prefill_chunk = cfg->num_batch > 0 ? cfg->num_batch : 0,
                        .kv_type = cfg->kv_type};
    char kv_dir[4096], kv_id[128];
    kv_tiers(gguf_path, &rc, kv_dir, sizeof kv_dir, kv_id, sizeof kv_id);
    /* an encoder sees its whole input at once: any input that fits the context must fit
     * one forward pass */
    if (!model_is_causal(e->m) && n_ctx > RUNNER_BATCH_TOKENS) rc.batch_tokens = n_ctx;
    st = runner_create(e->m, &rc, &e->run, err);
    if (st) goto fail;
    e->info.n_ctx = runner_n_ctx(e->run);
    e->info.n_ctx_train = hp->n_ctx_train;
    e->info.n_embd = hp->n_embd;
    e->info.n_vocab = hp->n_vocab;
    e->info.pooling = hp->pooling == MODEL_POOL_CLS    ? ENGINE_POOL_CLS
                      : hp->pooling == MODEL_POOL_LAST ? ENGINE_POOL_LAST
                                                       : ENGINE_POOL_MEAN;
    e->info.embedding_only = !model_has_logits(e->m);
    e->info.n_parallel = runner_n_parallel(e->run);
    read_metadata(e, gguf_path);
    measure(e);
    *out = e;
    return HL_OK;
fail:
    engine_close(e);
    return st;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->remote) {
        eremote_close(e->remote);
        free(e);
        return;
    }
    runner_destroy(e->run);
    model_free(e->m);
    free(e->chat_template);
    gram_vocab_free(e->gv);
    pthread_mutex_destroy(&e->gv_mu);
    free(e);
}

hl_type engine_kv_type(const engine *e) {
    if (e->remote || !e->run) {
        hl_type t = HL_TYPE_F16;
        if (e->cfg.kv_type && *e->cfg.kv_type) kv_type_parse(e->cfg.kv_type, &t);
        return t;
    }
    return runner_kv_type(e->run);
}

const tok_vocab *engine_vocab(const engine *e) {
    return e->remote ? eremote_vocab(e->remote) : model_vocab(e->m);
}

void engine_get_info(const engine *e, engine_info *out) {
    if (e->remote) {
        eremote_get_info(e->remote, out);
        return;
    }
    engine *ew = (engine *)e; /* the atomics are not part of the observable state */
    *out = e->info;
    out->mem_bytes = atomic_load(&ew->mem_bytes);
    out->kv_ram_bytes = atomic_load(&ew->kv_ram);
    out->kv_compressed_bytes = atomic_load(&ew->kv_comp);
    out->kv_disk_bytes = atomic_load(&ew->kv_disk);
    out->queued = runner_get_load(e->run).queued;
}

const char *engine_chat_template(const engine *e) {
    return e->remote ? eremote_chat_template(e->remote) : e->chat_template;
}

typedef struct gen_bridge {
    const engine_request *req;
    gram_matcher *gm;    /* req->format's matcher, or NULL */
    bool caller_stopped; /* on_token asked to stop (a stop string): not an error */
} gen_bridge;

static hl_status engine_gram_vocab(engine *e, const gram_vocab **out, hl_err *err) {
    pthread_mutex_lock(&e->gv_mu);
    hl_status st = HL_OK;
    if (!e->gv) st = gram_vocab_create(model_vocab(e->m), &e->gv, err);
    *out = e->gv;
    pthread_mutex_unlock(&e->gv_mu);
    return st;
}

static bool bridge_emit(void *user, const runner_event *ev) {
    gen_bridge *b = user;
    if (ev->kind != RUNNER_EV_TOKEN) return true;
    if (b->req->cancelled && b->req->cancelled(b->req->ud)) return false;
    if (b->gm) gram_matcher_accept(b->gm, ev->token);
    if (b->req->on_token(b->req->ud, ev->token, ev->sample) ||
        (b->gm && gram_matcher_complete(b->gm))) { /* nothing may follow the value */
        b->caller_stopped = true;
        return false;
    }
    return true;
}

static bool bridge_progress(void *user, int32_t processed, int32_t total) {
    (void)processed, (void)total;
    gen_bridge *b = user;
    return !(b->req->cancelled && b->req->cancelled(b->req->ud));
}

static void bridge_logits(void *user, float *logits, int32_t n_vocab) {
    gen_bridge *b = user;
    if (b->gm) gram_matcher_mask(b->gm, logits, n_vocab);
    if (b->req->logits_hook) b->req->logits_hook(b->req->ud, logits, n_vocab);
}

hl_status engine_generate(engine *e, const engine_request *req, engine_stats *stats,
                          hl_err *err) {
    if (e->remote) return eremote_generate(e->remote, req, stats, err);
    *stats = (engine_stats){0};
    if (req->n_prompt > (size_t)INT32_MAX)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "input length (%zu tokens) exceeds the model's maximum context length "
                       "(%d tokens)", req->n_prompt, e->info.n_ctx);
    gen_bridge b = {.req = req};
    gram_schema *gs = NULL;
    if (req->format) {
        const gram_vocab *gv;
        hl_status gst = engine_gram_vocab(e, &gv, err);
        if (!gst) gst = gram_compile(req->format, strlen(req->format), &gs, err);
        gram_think th = {.open = req->think_open, .close = req->think_close,
                         .in_think = req->in_think, .trigger = req->trigger,
                         .trigger_end = req->trigger_end, .trigger_now = req->trigger_now};
        if (!gst) gst = gram_matcher_create(gs, gv, &th, &b.gm, err);
        if (gst) {
            gram_schema_free(gs);
            return gst;
        }
    }
    runner_request rr = {
        .tokens = req->prompt,
        .n_tokens = (int32_t)req->n_prompt,
        /* the runner reads <= 0 as "until the context end", like Ollama's -1/-2 and 0 */
        .num_predict = req->num_predict > INT32_MAX ? INT32_MAX : (int32_t)req->num_predict,
        .sampling = req->sp,
        .emit = bridge_emit,
        .progress = bridge_progress,
        .logits_hook = req->logits_hook || b.gm ? bridge_logits : NULL,
        .user = &b,
        .snapshot_at = req->snapshot_at,
        .n_snapshot_at = req->n_snapshot_at > 64 ? 64 : (int32_t)req->n_snapshot_at,
    };
    runner_stats rs = {0};
    hl_status st = runner_generate(e->run, &rr, &rs, err);
    gram_matcher_free(b.gm);
    gram_schema_free(gs);
    measure(e);
    stats->prompt_eval_count = rs.prompt_eval_count;
    stats->prompt_eval_ns = (uint64_t)(rs.prompt_eval_duration_ns > 0 ? rs.prompt_eval_duration_ns : 0);
    stats->cached_tokens = rs.cached_tokens;
    stats->cached_disk = rs.cached_disk;
    stats->cached_remote = rs.cached_remote;
    stats->eval_count = rs.eval_count;
    stats->eval_ns = (uint64_t)(rs.eval_duration_ns > 0 ? rs.eval_duration_ns : 0);
    stats->done = rs.done_reason == RUNNER_DONE_LENGTH ? ENGINE_DONE_LENGTH : ENGINE_DONE_STOP;
    if (st == HL_ERR_CANCELLED && b.caller_stopped) {
        stats->done = ENGINE_DONE_STOP;
        return HL_OK;
    }
    if (st == HL_ERR_INVALID && strstr(err->msg, "exceeds the model's maximum context length"))
        st = HL_ERR_KV_FULL;
    return st;
}

hl_status engine_embed(engine *e, const int32_t *tokens, size_t n, float *out, hl_err *err) {
    if (e->remote) return eremote_embed(e->remote, tokens, n, out, err);
    if (n == 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to embed");
    if (n > (size_t)e->info.n_ctx)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "input length (%zu tokens) exceeds the model's maximum context length "
                       "(%d tokens)",
                       n, e->info.n_ctx);
    hl_status st = runner_embed(e->run, tokens, (int32_t)n, out, err);
    measure(e);
    return st;
}

bool engine_alive(const engine *e) { return e && (!e->remote || eremote_alive(e->remote)); }

bool engine_ping(engine *e, int timeout_ms) {
    return e && (!e->remote || eremote_ping(e->remote, timeout_ms));
}

int engine_pid(const engine *e) { return e && e->remote ? eremote_pid(e->remote) : 0; }
