/*
 * runner.h - the generation pipeline: one model, a KV cache shared across conversations
 * (a prefix trie over paged KV blocks), the slot sampler, and requests streamed through
 * a callback.
 *
 * A request is token ids plus options. runner_generate():
 *   1. validates (runner_prepare): an empty prompt is "empty prompt"; a prompt of
 *      >= the context length is "input length (N tokens) exceeds the model's maximum
 *      context length (M tokens)"; num_predict <= 0 or past the context end is clamped
 *      to the room left, so generation stops there with done reason "length";
 *   2. matches the longest cached prefix in the trie and restores it (a fully cached
 *      prompt still re-evaluates its last token to seed generation), then continues it
 *      with consecutive blocks found by key on disk or Redis (kv_store_dir / kv_redis,
 *      kv/store.h; stats say how many tokens came from each tier);
 *   3. prefills the rest in chunks of prefill_chunk (2048) tokens, cut at the snapshot
 *      offsets (every 8192 tokens and at len-4; for models with a recurrent state also
 *      the request's snapshot_at, e.g. where a chat's system prompt ends) so later
 *      requests can resume there;
 *   4. decodes with its own slot of the slot sampler, streaming each token (RUNNER_EV_TOKEN);
 *      exactly num_predict tokens unless an end-of-generation / stop token comes first
 *      (that token is not streamed);
 *   5. ends with exactly one final event: RUNNER_EV_DONE with the stats, or
 *      RUNNER_EV_ERROR with the message (errors are delivered in the stream, as the
 *      final message). prompt_eval_count counts all prompt tokens, cached ones included;
 *      prompt_eval_duration covers the whole prefill plus the first sample.
 * Cancellation: *cancel (an atomic flag another thread may set) is checked before every
 * prefill chunk and every decode step, and a callback returning false cancels too; the
 * request then ends with an error event (HL_ERR_CANCELLED, "request cancelled"). On
 * every exit path the trie records exactly what the KV cache holds and the sampler slot
 * is removed.
 *
 * Concurrency (continuous batching). runner_generate may be called from any number of
 * threads at once. A request first waits in a bounded queue (max_queue pending; when
 * full runner_generate fails at once with HL_ERR_BUSY and RUNNER_BUSY_MESSAGE, also sent
 * as the error event: servers answer 503). Up to n_parallel requests are active, each
 * with its own sampler slot, block table and trie lane. One batch thread steps them all:
 * every step is one forward pass (model_eval_batch) holding the next token of every
 * decoding sequence plus prefill chunks of the others, at most batch_tokens tokens (the
 * oldest prefill first), so a long prompt is spread over many steps while the other
 * streams keep decoding; then one sampler_sample call samples every sequence that
 * produced logits. Results do not depend on the batch a sequence ran in (the forward
 * pass and the sampler are batch invariant): greedy or seeded runs give the same tokens
 * alone or together.
 * Callbacks: emit and progress run on the calling thread, in order; a sequence advances
 * only after its callbacks for the previous step have returned, so a flag set or false
 * returned from a callback takes effect before anything else is computed for that
 * request (as with serial requests). A step waits up to ack_wait_us for the callbacks
 * of the other sequences, then leaves the slow ones for the next step. logits_hook runs
 * on the batch thread (keep it short: the whole batch waits), but never at the same time
 * as that request's emit/progress, so it may read state they update without a lock.
 * Cancellation or an error ends only the affected request; its slot, blocks and trie
 * lane are released and its tokens recorded in the trie, whatever happened.
 *
 * An embedding-only model (model_has_logits false) cannot generate: runner_generate fails
 * with HL_ERR_UNSUPPORTED; runner_embed serves it.
 *
 * Ownership: runner_create borrows the model (it must outlive the runner), owns the KV
 * pool, trie, sampler and compute context, and starts the batch thread; runner_destroy
 * stops it and frees everything (no runner_generate may be in flight then).
 */
#ifndef HL_RUNNER_H
#define HL_RUNNER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/block.h"
#include "kv/store.h"
#include "model/model.h"
#include "sample/sampler.h"

#define RUNNER_PREFILL_CHUNK 2048
#define RUNNER_BLOCK_TOKENS 32
#define RUNNER_NUM_PARALLEL 4
#define RUNNER_MAX_QUEUE 512
#define RUNNER_BATCH_TOKENS 512
#define RUNNER_ACK_WAIT_US 2000

typedef struct runner_config {
    int n_threads;           /* <= 0: all CPUs */
    int32_t n_ctx;           /* context length; <= 0: the model's trained context */
    int32_t prefill_chunk;   /* <= 0: RUNNER_PREFILL_CHUNK */
    int32_t block_tokens;    /* <= 0: RUNNER_BLOCK_TOKENS */
    size_t kv_budget_bytes;  /* RAM for cached KV; 0: kv_default_budget() */
    const char *spill_dir;   /* NULL: inactive blocks are only compressed in RAM */
    size_t spill_max_bytes;  /* 0: unlimited */
    int32_t n_parallel;      /* active requests; <= 0: $HEARTH_NUM_PARALLEL, else 4 */
    int32_t max_queue;       /* requests waiting for a slot; <= 0: $HEARTH_MAX_QUEUE, else 512 */
    int32_t batch_tokens;    /* tokens per forward pass; <= 0: RUNNER_BATCH_TOKENS */
    int32_t ack_wait_us;     /* 0: RUNNER_ACK_WAIT_US; < 0: wait for every callback (tests) */
    /* element type of cached keys and values: "f32", "f16" or "q8_0" (kv/layout.h);
     * NULL or "": f16 (Ollama's and llama.cpp's default). q8_0 on a model whose heads are
     * not multiples of 32 elements falls back to f16 (logged). Another value: INVALID. */
    const char *kv_type;
    /* The prefix cache beyond this process (kv/store.h): full blocks of every prompt are
     * written behind to a directory that survives restarts and/or published to Redis, and
     * a prompt the trie does not fully hold continues with consecutive blocks found there
     * by their hash-chain key. Only for models whose whole cache is full-attention KV
     * (window and recurrent snapshots stay in RAM). Independent of spill_dir, which pages
     * this process's blocks out and deletes them when it exits. */
    const char *kv_model_id; /* stable model identity (its digest); NULL: both tiers off */
    const char *kv_store_dir; /* this model's block directory; NULL: no disk tier */
    size_t kv_disk_max;       /* 0: KV_STORE_DISK_MAX_DEFAULT */
    const char *kv_redis;     /* "redis://host:port"; NULL or "": no shared tier */
    int kv_redis_ttl_s;       /* expiry of published blocks; <= 0: KV_STORE_REDIS_TTL_DEFAULT */
} runner_config;

#define RUNNER_BUSY_MESSAGE "server busy, please try again.  maximum pending requests exceeded"


typedef enum runner_done_reason {
    RUNNER_DONE_STOP = 0,   /* end-of-generation or stop token */
    RUNNER_DONE_LENGTH = 1, /* num_predict reached (or the context end) */
} runner_done_reason;

typedef struct runner_stats {
    int32_t prompt_eval_count;       /* all prompt tokens, cached included */
    int64_t prompt_eval_duration_ns; /* prefill + first sample */
    int32_t eval_count;              /* generated tokens streamed */
    int64_t eval_duration_ns;
    int32_t cached_tokens;           /* prompt tokens restored from the cache (all tiers) */
    int32_t cached_disk;             /* of those, from the disk tier (kv/store.h) */
    int32_t cached_remote;           /* of those, from the shared tier (Redis) */
    runner_done_reason done_reason;
} runner_stats;

typedef enum runner_event_kind {
    RUNNER_EV_TOKEN = 0,
    RUNNER_EV_DONE,
    RUNNER_EV_ERROR,
} runner_event_kind;

typedef struct runner_event {
    runner_event_kind kind;
    int32_t token;              /* TOKEN */
    const sampler_out *sample;  /* TOKEN: logprobs when requested */
    runner_stats stats;         /* DONE (and ERROR: what was done so far) */
    hl_status status;           /* ERROR */
    const char *message;        /* ERROR */
} runner_event;

/* Returns false to cancel the request (e.g. the client went away). */
typedef bool (*runner_emit_fn)(void *user, const runner_event *ev);
/* Called after each prefill chunk ("prompt processing progress"); false cancels. */
typedef bool (*runner_progress_fn)(void *user, int32_t processed, int32_t total);

typedef struct runner_request {
    const int32_t *tokens;
    int32_t n_tokens;
    int32_t num_predict;          /* <= 0: until the context end */
    sampler_opts sampling;
    const int32_t *stop_tokens;   /* extra stop ids besides the vocabulary's end-of-generation */
    int32_t n_stop_tokens;
    atomic_bool *cancel;          /* may be NULL */
    runner_emit_fn emit;          /* may be NULL */
    runner_progress_fn progress;  /* may be NULL */
    /* May be NULL. Called with a copy of each logits row before it is sampled; it may
     * change it (e.g. set tokens a response format forbids to -inf). */
    void (*logits_hook)(void *user, float *logits, int32_t n_vocab);
    void *user;                   /* passed to emit, progress and logits_hook */
    /* May be NULL. Prompt offsets later requests are expected to share (a chat's system
     * prompt ends there): a model with a recurrent state snapshots its caches at each, so
     * a conversation that diverges after one restores from it instead of recomputing from
     * the start. KV alone rewinds to any token: ignored for models without a state. */
    const int32_t *snapshot_at;
    int32_t n_snapshot_at;
} runner_request;

typedef struct runner runner;

hl_status runner_create(const model *m, const runner_config *cfg, runner **out, hl_err *err);
void runner_destroy(runner *r); /* accepts NULL */

int32_t runner_n_ctx(const runner *r);
/* The element type the KV pool holds keys (and values) in. */
hl_type runner_kv_type(const runner *r);

/* Validates a request; *num_predict gets the effective token budget. */
hl_status runner_prepare(const runner *r, const runner_request *req, int32_t *num_predict,
                         hl_err *err);

/* Runs one request to completion (see the top of this file); thread-safe. Returns the
 * status of the final event (HL_ERR_BUSY when the queue is full); *stats (may be NULL)
 * gets the final statistics. */
hl_status runner_generate(runner *r, const runner_request *req, runner_stats *stats, hl_err *err);

/* An embedding through the same batch loop: tokens[0..n) (1 <= n <= the context length;
 * for a non-causal model also <= batch_tokens, as its whole input goes in one forward
 * pass) are evaluated from position 0 in a KV of their own (no prefix cache, kept only
 * until the end), in the forward passes of whatever else runs (concurrent embeddings
 * share them; a causal model's input may be chunked like a prefill), and the final
 * hidden states pooled as the model declares (model_pool) into out (n_embd floats), not
 * normalised. Thread-safe; queues like runner_generate (HL_ERR_BUSY when full). */
hl_status runner_embed(runner *r, const int32_t *tokens, int32_t n, float *out, hl_err *err);

typedef struct runner_memory {
    size_t weights; /* tensors the forward pass reads */
    size_t kv;      /* cached KV in RAM now: resident blocks, compressed blocks, free buffers */
    size_t kv_compressed; /* the part of kv that is compressed blocks */
    size_t kv_disk; /* spilled KV */
    size_t scratch; /* compute buffers of the context and the sampler's rings */
    size_t total;   /* weights + kv + scratch */
} runner_memory;

/* Measured at the time of the call. */
runner_memory runner_get_memory(const runner *r);

/* Pages every KV block not used by a live sequence out of the working set (compressed,
 * then spilled when a spill directory is configured). */
void runner_page_out_idle(runner *r);

int32_t runner_n_parallel(const runner *r);

/* A moment's view of the scheduler (for tests, benchmarks and `ps`). */
typedef struct runner_load {
    int32_t queued;       /* waiting for a slot */
    int32_t active;       /* holding a slot */
    uint64_t steps;       /* forward passes so far */
    uint64_t step_tokens; /* tokens through them */
} runner_load;
runner_load runner_get_load(runner *r);

/* Where prompt tokens came from, over the runner's life (for logs and /metrics):
 * cached_ram + cached_disk + cached_remote are the prompt tokens not computed. */
typedef struct runner_cache_stats {
    uint64_t requests;
    uint64_t prompt_tokens;
    uint64_t cached_ram, cached_disk, cached_remote;
    bool store_on;         /* a disk or shared tier is configured */
    kv_store_stats store;  /* its counters (zero when off) */
} runner_cache_stats;
runner_cache_stats runner_get_cache_stats(runner *r);
/* Waits until every block queued for the disk/shared tiers is written (tests). */
void runner_kv_flush(runner *r);

/* For tests and benchmarks, while no request runs. */
kv_pool *runner_kv_window_pool(runner *r); /* the sliding-window slot's pool, or NULL */
kv_pool *runner_kv_pool(runner *r);
sampler *runner_sampler(runner *r);
struct kv_prefix *runner_prefix_cache(runner *r);

#endif
