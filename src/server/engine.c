/*
 * engine.c - the engine seam (engine.h).
 *
 * TEMPORARY ADAPTER: until the runner's pipeline (src/runner/) is merged this drives the
 * model directly with one model_kv and the slot sampler - no prefix cache, one sequence.
 * It is replaced by the runner's pipeline; keep it trivial.
 */
#include "server/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "model/model.h"

struct engine {
    model *m;
    model_kv *kv;
    model_ctx *ctx;
    engine_info info;
    char *chat_template;
    int32_t batch;
    pthread_mutex_t lock; /* one run at a time */
};

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
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) && arch.len < 64) {
        char key[128];
        snprintf(key, sizeof key, "%.*s.pooling_type", (int)arch.len, arch.ptr);
        uint32_t u;
        int32_t i;
        int v = -1;
        if (gguf_get_u32(f, key, &u)) v = (int)u;
        else if (gguf_get_i32(f, key, &i)) v = i;
        if (v == ENGINE_POOL_CLS || v == ENGINE_POOL_LAST) e->info.pooling = v;
    }
    gguf_close(f);
}

hl_status engine_open(const char *gguf_path, const engine_config *cfg, engine **out,
                      hl_err *err) {
    engine *e = calloc(1, sizeof *e);
    if (!e) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&e->lock, NULL);
    e->info.pooling = ENGINE_POOL_MEAN;
    hl_status st = model_load(gguf_path, NULL, &e->m, err);
    if (st) goto fail;
    if (!model_vocab(e->m)) {
        st = hl_fail(err, HL_ERR_UNSUPPORTED, "the model has no tokenizer");
        goto fail;
    }
    const model_hparams *hp = model_get_hparams(e->m);
    int32_t n_ctx = cfg->num_ctx > 0 ? cfg->num_ctx : 4096;
    if (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) n_ctx = hp->n_ctx_train;
    if (n_ctx < 4) n_ctx = 4;
    st = model_kv_create(e->m, n_ctx, &e->kv, err);
    if (st) goto fail;
    st = model_ctx_create(e->m, cfg->n_threads, cfg->num_batch > 0 ? cfg->num_batch : 512,
                          &e->ctx, err);
    if (st) goto fail;
    e->info.n_ctx = n_ctx;
    e->batch = cfg->num_batch > 0 ? cfg->num_batch : 512;
    e->info.n_ctx_train = hp->n_ctx_train;
    e->info.n_embd = hp->n_embd;
    e->info.n_vocab = hp->n_vocab;
    struct stat sb;
    uint64_t file = stat(gguf_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    uint64_t kv_bytes = (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv *
                        (uint64_t)(hp->head_dim_k + hp->head_dim_v) * (uint64_t)n_ctx * 4u;
    e->info.mem_bytes = file + kv_bytes;
    read_metadata(e, gguf_path);
    *out = e;
    return HL_OK;
fail:
    engine_close(e);
    return st;
}

void engine_close(engine *e) {
    if (!e) return;
    model_ctx_free(e->ctx);
    model_kv_free(e->kv);
    model_free(e->m);
    free(e->chat_template);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

const tok_vocab *engine_vocab(const engine *e) { return model_vocab(e->m); }
void engine_get_info(const engine *e, engine_info *out) { *out = e->info; }
const char *engine_chat_template(const engine *e) { return e->chat_template; }

static bool is_cancelled(const engine_request *req) {
    return req->cancelled && req->cancelled(req->ud);
}

static hl_status generate_locked(engine *e, const engine_request *req, engine_stats *stats,
                                 sampler *smp, hl_err *err) {
    const int32_t n_ctx = e->info.n_ctx;
    if (req->n_prompt == 0) return hl_fail(err, HL_ERR_INVALID, "empty prompt");
    if (req->n_prompt >= (size_t)n_ctx)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "input length (%zu tokens) exceeds the model's maximum context length "
                       "(%d tokens)",
                       req->n_prompt, n_ctx);
    hl_status st = model_kv_truncate(e->kv, 0, err);
    if (st) return st;
    st = sampler_add(smp, 0, &req->sp, req->prompt, req->n_prompt, err);
    if (st) return st;
    uint64_t t0 = hl_time_ns();
    const int32_t batch = e->batch;
    for (size_t done = 0; done < req->n_prompt;) {
        if (is_cancelled(req)) return hl_fail(err, HL_ERR_CANCELLED, "request canceled");
        size_t chunk = req->n_prompt - done < (size_t)batch ? req->n_prompt - done : (size_t)batch;
        st = model_eval(e->ctx, e->kv, req->prompt + done, (int32_t)chunk, NULL, err);
        if (st) return st;
        done += chunk;
    }
    uint64_t t1 = hl_time_ns();
    stats->prompt_eval_count = (int32_t)req->n_prompt;
    stats->prompt_eval_ns = t1 - t0;
    stats->done = ENGINE_DONE_STOP;
    const tok_vocab *vocab = model_vocab(e->m);
    const int32_t n_vocab = e->info.n_vocab;
    for (;;) {
        if (req->num_predict >= 0 && stats->eval_count >= req->num_predict) {
            stats->done = ENGINE_DONE_LENGTH;
            break;
        }
        if (is_cancelled(req)) {
            st = hl_fail(err, HL_ERR_CANCELLED, "request canceled");
            break;
        }
        sampler_out so;
        const int32_t slot = 0;
        st = sampler_sample(smp, &slot, 1, model_ctx_logits(e->ctx), (size_t)n_vocab, &so, err);
        if (st) break;
        if (tok_is_eog(vocab, so.token)) break;
        stats->eval_count++;
        if (req->on_token(req->ud, so.token)) break;
        if (model_kv_len(e->kv) >= n_ctx) {
            stats->done = ENGINE_DONE_LENGTH;
            break;
        }
        if (req->num_predict >= 0 && stats->eval_count >= req->num_predict) {
            stats->done = ENGINE_DONE_LENGTH;
            break;
        }
        st = model_eval(e->ctx, e->kv, &so.token, 1, NULL, err);
        if (st) break;
    }
    stats->eval_ns = hl_time_ns() - t1;
    return st;
}

hl_status engine_generate(engine *e, const engine_request *req, engine_stats *stats,
                          hl_err *err) {
    *stats = (engine_stats){0};
    sampler *smp = NULL;
    hl_status st = sampler_create(e->info.n_vocab, e->info.n_ctx, &smp, err);
    if (st) return st;
    pthread_mutex_lock(&e->lock);
    st = generate_locked(e, req, stats, smp, err);
    pthread_mutex_unlock(&e->lock);
    sampler_destroy(smp);
    return st;
}

hl_status engine_embed(engine *e, const int32_t *tokens, size_t n, float *out, hl_err *err) {
    const int32_t E = e->info.n_embd;
    if (n == 0) return hl_fail(err, HL_ERR_INVALID, "no tokens to embed");
    if (n > (size_t)e->info.n_ctx)
        return hl_fail(err, HL_ERR_KV_FULL,
                       "input length (%zu tokens) exceeds the model's maximum context length "
                       "(%d tokens)",
                       n, e->info.n_ctx);
    float *hidden = malloc(n * (size_t)E * sizeof *hidden);
    if (!hidden) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&e->lock);
    hl_status st = model_kv_truncate(e->kv, 0, err);
    if (!st) st = model_eval_hidden(e->ctx, e->kv, tokens, (int32_t)n, hidden, err);
    pthread_mutex_unlock(&e->lock);
    if (!st) {
        if (e->info.pooling == ENGINE_POOL_CLS) {
            memcpy(out, hidden, (size_t)E * sizeof *out);
        } else if (e->info.pooling == ENGINE_POOL_LAST) {
            memcpy(out, hidden + (n - 1) * (size_t)E, (size_t)E * sizeof *out);
        } else {
            for (int32_t j = 0; j < E; j++) {
                double sum = 0;
                for (size_t i = 0; i < n; i++) sum += hidden[i * (size_t)E + (size_t)j];
                out[j] = (float)(sum / (double)n);
            }
        }
    }
    free(hidden);
    return st;
}
