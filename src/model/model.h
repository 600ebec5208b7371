/*
 * model.h - transformer models: loading, a per-sequence KV cache, and the forward pass.
 *
 * A model holds the hyperparameters, the weights and the tokenizer of one checkpoint:
 *   - model_load_gguf()      a GGUF of any registered architecture (model_supported_archs:
 *                            the llama family, gemma2/3, phi3, ...; one file each in
 *                            src/model/);
 *   - model_load_llama2c()   a llama2.c checkpoint (.bin) plus its tokenizer (tok512.bin);
 *   - model_load()           either, chosen by the file's magic.
 * Loading validates every tensor's shape and type before returning. The file is read
 * into private read-only memory by default, or mapped with model_load_opts.use_mmap
 * (see hl_map_read for why); weights are used in place from there. The model owns that
 * memory (and the gguf_file) and the tok_vocab, and frees them in model_free(). An immutable model may be
 * shared by any number of contexts and KV caches, also across threads.
 *
 * A model_kv is one sequence's KV cache (f32, laid out as kv/layout.h says: per layer
 * [kv_head][pos][head_dim], so attention reads each head's keys and values contiguously). It has a fixed capacity (its context
 * size), a current length, and can be rewound (model_kv_truncate) to reuse a common prefix.
 * model_eval_view() evaluates over a block table instead (the runner's shared, paged cache);
 * a model_kv is the special case of one block of n_ctx positions.
 *
 * A model_ctx owns the compute state for one caller thread: a thread pool and scratch
 * buffers sized once for the maximum batch (max_batch tokens), so evaluation never calls
 * malloc. model_eval() feeds n tokens of one sequence (a prompt's prefill, or one generated
 * token) at the positions that follow the KV cache's current length: every weight matmul
 * takes the whole batch at once; inputs longer than max_batch are split into chunks.
 *
 * Typical use:
 *   model *m; model_load("x.gguf", NULL, &m, &err);
 *   model_kv *kv; model_kv_create(m, 2048, &kv, &err);
 *   model_ctx *c; model_ctx_create(m, n_threads, 512, &c, &err);
 *   model_eval(c, kv, prompt, n_prompt, NULL, &err);   // logits: model_ctx_logits(c)
 *   ... sample, model_eval(c, kv, &tok, 1, NULL, &err) ...
 *   model_ctx_free(c); model_kv_free(kv); model_free(m);
 */
#ifndef HL_MODEL_H
#define HL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"
#include "tensor/types.h"
#include "tok/tok.h"

typedef enum model_rope_kind {
    MODEL_ROPE_NORM = 0, /* rotates adjacent pairs (x[2i], x[2i+1]): llama, mistral */
    MODEL_ROPE_NEOX,     /* rotates halves (x[i], x[i + n_rot/2]): qwen2, qwen3 */
} model_rope_kind;

/* How a sequence's hidden states become one embedding ({arch}.pooling_type in GGUF). */
typedef enum model_pooling {
    MODEL_POOL_NONE = 0, /* not declared: model_embed means over the tokens */
    MODEL_POOL_MEAN = 1,
    MODEL_POOL_CLS = 2,  /* the first token's state */
    MODEL_POOL_LAST = 3, /* the last token's state */
} model_pooling;

typedef struct model_hparams {
    const char *arch; /* the architecture that runs it: "llama", "qwen3", "gemma3", ... */
    model_pooling pooling;
    int32_t n_vocab;     /* rows of the token embedding (logits per token) */
    int32_t n_ctx_train; /* context length the model was trained with */
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_ff;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim_k; /* key/query head size (qwen3: != n_embd / n_head) */
    int32_t head_dim_v; /* value head size */
    int32_t n_rot;      /* leading dims of each head that RoPE rotates */
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    model_rope_kind rope_kind;
} model_hparams;

typedef struct model model;

/* Loads a GGUF or a llama2.c checkpoint (by magic). tokenizer_path is required for a
 * llama2.c checkpoint (its tok512.bin / tokenizer.bin) and must be NULL for a GGUF. */
hl_status model_load(const char *path, const char *tokenizer_path, model **out, hl_err *err);
typedef struct model_load_opts {
    bool use_mmap; /* map the file instead of reading it in (shares the page cache) */
} model_load_opts;
/* model_load with options (NULL: the defaults, all false). */
hl_status model_load_ex(const char *path, const char *tokenizer_path, const model_load_opts *opts,
                        model **out, hl_err *err);
hl_status model_load_gguf(const char *path, model **out, hl_err *err);
/* Takes ownership of f (closed by model_free, or here on failure). */
hl_status model_load_gguf_file(gguf_file *f, model **out, hl_err *err);
/* tokenizer_path may be NULL: the model then has no vocab (model_vocab() is NULL). */
hl_status model_load_llama2c(const char *path, const char *tokenizer_path, model **out,
                             hl_err *err);
hl_status model_load_llama2c_ex(const char *path, const char *tokenizer_path,
                                const model_load_opts *opts, model **out, hl_err *err);
void model_free(model *m); /* accepts NULL */

const model_hparams *model_get_hparams(const model *m);
const tok_vocab *model_vocab(const model *m); /* owned by the model; NULL if none */
/* Bytes of the weights the forward pass reads (the tensors in use, not the whole file). */
size_t model_weight_bytes(const model *m);
/* The model's KV geometry with f32 keys and values (per-layer heads and head sizes; a
 * layer that reads another's cache stores nothing). Owned by the model. */
const struct kv_geom *model_kv_geom(const model *m);
/* OK when g has this model's per-layer KV shapes in types the forward pass reads. */
hl_status model_check_kv_geom(const model *m, const struct kv_geom *g, hl_err *err);
/* True when every token attends to its whole sequence (BERT): such a sequence must be
 * evaluated in one batch, and its cache cannot be extended. */
bool model_is_causal(const model *m);
/* False for embedding-only models (no output projection: no logits). */
bool model_has_logits(const model *m);
/* The architectures this build runs (general.architecture values), comma-separated. */
const char *model_supported_archs(void);

/* Reads a llama2.c tokenizer file (tok512.bin, tokenizer.bin) into a SPM vocab: ids 0..2
 * are <unk>, <s>, </s>, ids 3..258 the <0xXX> byte tokens, spaces become U+2581. The
 * caller frees *out with tok_vocab_destroy(). */
hl_status model_llama2c_vocab_load(const char *path, tok_vocab **out, hl_err *err);

/* ---- KV cache (one sequence) ---- */
typedef struct model_kv model_kv;

/* n_ctx: capacity in tokens (> 0). Keys and values are f32. */
hl_status model_kv_create(const model *m, int32_t n_ctx, model_kv **out, hl_err *err);
/* With the element types of keys and values: f32, f16 or q8_0 (kv/layout.h; q8_0 needs
 * head sizes that are multiples of 32: UNSUPPORTED/INVALID otherwise). */
hl_status model_kv_create_ex(const model *m, int32_t n_ctx, hl_type k_type, hl_type v_type,
                             model_kv **out, hl_err *err);
/* Bytes of the cache's buffer (all n_ctx positions). */
size_t model_kv_bytes(const model_kv *kv);
void model_kv_free(model_kv *kv); /* accepts NULL */
int32_t model_kv_len(const model_kv *kv);
int32_t model_kv_capacity(const model_kv *kv);
/* Forgets every position >= n (0 <= n <= length); the next eval continues at n. A model
 * with recurrent state can only go back to 0 (the state is reset) or stay where it is. */
hl_status model_kv_truncate(model_kv *kv, int32_t n, hl_err *err);
/* Recurrent layers (short convolutions, SSMs, delta-rule layers) keep a fixed-size state
 * per sequence instead of (or beside) KV rows: floats per sequence, 0 for a
 * transformer. A model_kv owns one (model_kv_state: read or overwrite it to save and
 * restore a sequence at its current length). */
size_t model_state_floats(const model *m);
float *model_kv_state(model_kv *kv); /* NULL when the model has none */
/* False when no layer keeps KV rows (a pure SSM): views then need no blocks. */
bool model_has_kv(const model *m);

/* ---- evaluation ---- */
typedef struct model_ctx model_ctx;

/* n_threads <= 0: the physical cores this process may use (base/cpu.h).
 * max_batch <= 0: 512 (at most 8192). */
hl_status model_ctx_create(const model *m, int n_threads, int32_t max_batch, model_ctx **out,
                           hl_err *err);
void model_ctx_free(model_ctx *c); /* accepts NULL */
int model_ctx_n_threads(const model_ctx *c);
/* The context size each sequence is served with (the runner's num_ctx). Some models'
 * RoPE depends on it: phi3's longrope uses its long factors iff it (rounded up to a
 * multiple of 256, as llama.cpp does) exceeds the original context length. 0 (the
 * default): model_eval uses the model_kv's capacity, block-table evals the model's
 * trained context. */
void model_ctx_set_n_ctx(model_ctx *c, int32_t n_ctx);
/* Bytes of scratch (activations, matmul scratch, logits) the context allocated. */
size_t model_ctx_scratch_bytes(const model_ctx *c);

/* Feeds tokens[0..n) at positions model_kv_len(kv).. and appends them to kv. On success
 * model_ctx_logits() holds the last token's n_vocab logits; when all_logits is not NULL it
 * also receives n * n_vocab logits (row i for tokens[i]). Invalid token ids (INVALID) or
 * more tokens than the cache has room for (KV_FULL) fail before anything is changed. */
hl_status model_eval(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                     float *all_logits, hl_err *err);
/* A block table: the runner's shared KV cache (kv/block.h). blocks[i] holds positions
 * [i*B, (i+1)*B) of every layer, laid out as kv/layout.h says for `geom` (NULL: the
 * model's own geometry with f32 keys and values, model_kv_geom()); the geometry may
 * use any element types model_check_kv_geom accepts (f32, f16, q8_0). The caller owns the
 * blocks; they must be writable at positions len..len+n-1. */
struct kv_geom;
typedef struct model_kv_view {
    void *const *blocks;
    int32_t n_blocks;
    int32_t block_tokens; /* B */
    int32_t len;          /* positions already in the cache */
    const struct kv_geom *geom;
    /* The sequence's recurrent state (model_state_floats floats, as of position len),
     * updated in place; required exactly when the model has one. */
    float *state;
} model_kv_view;

/* Like model_eval, over a block table: feeds tokens at positions len.. and writes their keys
 * and values there. kv->len is not changed (the caller commits the positions). */
hl_status model_eval_view(model_ctx *c, const model_kv_view *kv, const int32_t *tokens, int32_t n,
                          float *all_logits, hl_err *err);

/* Cache slots. A model with sliding-window layers has two: slot 0 holds the
 * full-attention layers, slot 1 the windowed ones (which read only the last W positions,
 * so their cache can drop older blocks: kv/kvcache.h's window cache). Each slot has its
 * own geometry in which the other slot's layers store nothing. Callers may also keep
 * every layer in one buffer with the combined geometry (model_kv_geom). */
int32_t model_kv_slots(const model *m);                  /* 1 or 2 */
const struct kv_geom *model_kv_slot_geom(const model *m, int32_t slot);
int32_t model_kv_window(const model *m);                 /* W of slot 1; 0 when none */

/* One sequence's part of a batch: n_tokens tokens at positions kv.len.. of its block
 * table (written there, kv.len is not changed: the caller commits). With kv_window.blocks
 * set, kv holds slot 0 (its geometry model_kv_slot_geom(m, 0)) and kv_window slot 1, at
 * the same len; otherwise kv holds every layer (combined geometry). */
typedef struct model_batch_entry {
    model_kv_view kv;
    model_kv_view kv_window;
    const int32_t *tokens;
    int32_t n_tokens;   /* >= 1 */
    bool want_logits;   /* the logits of this entry's last token */
    /* NULL, or n_tokens rows of n_embd floats: this entry's final hidden states, as
     * model_eval_hidden writes them (for embeddings; see model_pool) */
    float *hidden;
} model_batch_entry;

/* Evaluates several sequences in one forward pass: all tokens of all entries (at most
 * model_ctx_max_batch(c) in total) go through each weight matmul together; attention is
 * per sequence, over its own blocks, causal at its own positions. logits receives one
 * n_vocab row per entry with want_logits, in entry order (may be NULL when none wants
 * logits). A token's results do not depend on the rest of the batch: the logits equal
 * those of evaluating each sequence alone, bit for bit. Entries must use distinct block
 * tables. Everything is checked before anything is written. model_ctx_logits() is not
 * changed. */
hl_status model_eval_batch(model_ctx *c, const model_batch_entry *entries, int32_t n_entries,
                           float *logits, hl_err *err);
int32_t model_ctx_max_batch(const model_ctx *c);

/* The last evaluated token's logits (n_vocab floats), valid until the next eval. */
const float *model_ctx_logits(const model_ctx *c);

/* Like model_eval, but writes every token's final hidden state instead of logits: the
 * residual stream after the last layer, RMS-normalised with output_norm (the vector the
 * output projection would multiply), n * n_embd floats into hidden (row i for
 * tokens[i]). Used for embeddings (pooling is the caller's). The tokens are appended to
 * kv like model_eval does. */
hl_status model_eval_hidden(model_ctx *c, model_kv *kv, const int32_t *tokens, int32_t n,
                            float *hidden, hl_err *err);

/* Pools n rows of final hidden states (n_embd floats each, as model_eval_hidden writes
 * them) into out as the model declares (mean when it declares nothing), then
 * L2-normalises when normalize is set. */
void model_pool(const model *m, const float *hidden, int32_t n, bool normalize, float *out);

/* One sequence's embedding: tokens[0..n) evaluated from position 0 in a cache of their
 * own (the context's other state is not touched), the final hidden states pooled as the
 * model declares (mean when it declares nothing), then L2-normalised when normalize is
 * set. out receives n_embd floats. */
hl_status model_embed(model_ctx *c, const int32_t *tokens, int32_t n, bool normalize, float *out,
                      hl_err *err);

#endif
