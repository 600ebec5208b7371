/*
 * engine.h - the server's seam to the inference engine: one loaded model that can run a
 * token sequence (prefill + decode with the slot sampler) or pool hidden states into an
 * embedding. The HTTP handlers and the loaded-model manager (sched.h) only see this API;
 * the implementation (engine.c) drives the runner's pipeline.
 *
 * Ownership: engine_open allocates and owns the model, its caches and compute state;
 * engine_close frees them. An engine may be used from several threads: generations run
 * concurrently (the runner batches up to $HEARTH_NUM_PARALLEL of them and queues up to
 * $HEARTH_MAX_QUEUE more; past that engine_generate fails at once with HL_ERR_BUSY and
 * "server busy, please try again.  maximum pending requests exceeded", HTTP 503).
 *
 * Generation contract (engine_generate):
 *   - the prompt (n_prompt >= 1 tokens) must leave room for at least one generated token:
 *     n_prompt >= n_ctx fails with HL_ERR_KV_FULL and the message
 *     "input length (N tokens) exceeds the model's maximum context length (M tokens)";
 *   - tokens are sampled with req->sp and passed one by one to req->on_token (EOG tokens
 *     are not passed); on_token returns true to stop there (a stop string matched);
 *   - num_predict <= 0: until EOG or the context is full (Ollama's -1, -2 and 0); > 0:
 *     exactly that many tokens at most. A full context or the limit ends with
 *     ENGINE_DONE_LENGTH; EOG or on_token's stop with ENGINE_DONE_STOP;
 *   - req->cancelled is polled between tokens (and between prefill chunks): when it turns
 *     true the run ends with HL_ERR_CANCELLED.
 */
#ifndef HL_SERVER_ENGINE_H
#define HL_SERVER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/types.h"
#include "sample/sampler.h"
#include "tok/tok.h"

typedef struct engine engine;

typedef struct engine_config {
    int32_t num_ctx;   /* requested context; clamped to the trained context (<= 0: 4096) */
    int32_t num_batch; /* prefill chunk (<= 0: 512) */
    int n_threads;     /* <= 0: all CPUs */
    bool use_mmap;     /* map the weights instead of reading them in (model_load_opts) */
    /* element type of the KV cache: "f32", "f16" or "q8_0" (a static string; NULL: f16;
     * runner_config.kv_type) */
    const char *kv_type;
    /* may be NULL: when it turns true, a load waiting for its runner process fails
     * ("server shutting down"); not a load option (ignored when comparing configs) */
    const _Atomic bool *abort;
} engine_config;

typedef struct engine_info {
    int32_t n_ctx;       /* the context actually used */
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_vocab;
    uint64_t mem_bytes;  /* measured (after load and after each request): weights read +
                            KV cache + scratch; engine_get_info never blocks on a run */
    /* the KV cache by tier, measured with mem_bytes: resident blocks (and recurrent
     * states), blocks compressed in RAM, blocks spilled to disk */
    uint64_t kv_ram_bytes, kv_compressed_bytes, kv_disk_bytes;
    int32_t n_parallel;  /* batch slots */
    int32_t queued;      /* requests waiting for a slot now */
    int pooling;         /* ENGINE_POOL_* the GGUF asks for (mean when it does not say) */
    bool embedding_only; /* no output layer (BERT): engine_generate cannot serve it */
} engine_info;

enum { ENGINE_POOL_MEAN = 1, ENGINE_POOL_CLS = 2, ENGINE_POOL_LAST = 3 };

typedef enum engine_done {
    ENGINE_DONE_STOP = 0,
    ENGINE_DONE_LENGTH = 1,
} engine_done;

typedef struct engine_request {
    const int32_t *prompt;
    size_t n_prompt;
    sampler_opts sp;
    int64_t num_predict; /* <= 0: unbounded (until EOG or a full context) */
    /* true = stop now; sample carries the logprobs when sp.logprobs asked for them */
    bool (*on_token)(void *ud, int32_t token, const sampler_out *sample);
    bool (*cancelled)(void *ud);               /* may be NULL */
    /* may be NULL: edits each logits row before sampling (in-process engines only) */
    void (*logits_hook)(void *ud, float *logits, int32_t n_vocab);
    /* may be NULL: constrained decoding (grammar/grammar.h). The output must be a JSON
     * text of this format, given as JSON text: "\"json\"" (any object) or a JSON schema;
     * the engine (or the runner process) masks every step and the run ends once the
     * value is complete. Check it first with gram_compile (HTTP 400 on failure). */
    const char *format;
    /* with format: a thinking part that passes unconstrained first (gram_think) */
    const char *think_open, *think_close;
    bool in_think;
    /* with format: a lazy grammar (gram_think.trigger): free text in which each trigger
     * (a tool-call tag) starts a value, followed by trigger_end; trigger_now: the reply
     * must open with the trigger (after any thinking part) */
    const char *trigger, *trigger_end;
    bool trigger_now;
    void *ud;
    /* prompt offsets later requests are expected to share (the end of a chat's system
     * prompt): runner_request.snapshot_at */
    const int32_t *snapshot_at;
    size_t n_snapshot_at;
} engine_request;

typedef struct engine_stats {
    int32_t prompt_eval_count; /* every prompt token, cache hits included (as Ollama) */
    uint64_t prompt_eval_ns;
    int32_t cached_tokens;     /* prompt tokens restored from the prefix cache */
    int32_t cached_disk;       /* of those, from the disk tier (RAM: the rest) */
    int32_t cached_remote;     /* of those, from the shared tier (Redis) */
    int32_t eval_count;        /* tokens sampled (and passed to on_token) */
    uint64_t eval_ns;
    engine_done done;
} engine_stats;

/* By default the model runs in a runner process (`hearth runner`, runner_srv.h) spoken to
 * over loopback (engine_remote.h); HEARTH_RUNNER=inprocess runs it in this process.
 * engine_open_local always runs it here (the runner process itself uses it). */
hl_status engine_open(const char *gguf_path, const engine_config *cfg, engine **out,
                      hl_err *err);
hl_status engine_open_local(const char *gguf_path, const engine_config *cfg, engine **out,
                            hl_err *err);
bool engine_use_subprocess(void);
void engine_close(engine *e); /* accepts NULL */

const tok_vocab *engine_vocab(const engine *e);
void engine_get_info(const engine *e, engine_info *out);
/* The GGUF's tokenizer.chat_template (NULL when none); owned by the engine. */
const char *engine_chat_template(const engine *e);
/* The element type of an in-process engine's KV cache (runner_kv_type); a runner
 * process's engine reports the type it asked for (the process logs a fallback). */
hl_type engine_kv_type(const engine *e);

hl_status engine_generate(engine *e, const engine_request *req, engine_stats *stats,
                          hl_err *err);

/* Pools the final hidden states of tokens (1 <= n <= n_ctx) into out (n_embd floats) as
 * info.pooling says (model_pool); not normalised. Runs through the runner's batch loop,
 * so concurrent embeddings share forward passes (runner_embed). */
hl_status engine_embed(engine *e, const int32_t *tokens, size_t n, float *out, hl_err *err);

/* False once the engine cannot serve any more (its runner process exited): the loaded-
 * model manager then unloads it and the next request loads the model afresh. */
bool engine_alive(const engine *e);
/* Whether the engine answers a health check within timeout_ms (the runner's GET /health).
 * A runner that does not is killed and engine_alive turns false. Always true in-process. */
bool engine_ping(engine *e, int timeout_ms);
/* The runner process id (0 in-process). */
int engine_pid(const engine *e);

#endif
