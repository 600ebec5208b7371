/*
 * internal.h - the model struct shared by model.c (GGUF loading), llama2c.c (llama2.c
 * checkpoints) and forward.c (evaluation). Not for use outside src/model/. The model owns
 * its file mapping, weight table and tokenizer; model_free() releases them.
 */
#ifndef HL_MODEL_INTERNAL_H
#define HL_MODEL_INTERNAL_H

#include "base/file.h"
#include "model/model.h"

/* A 2-D weight: n_rows rows of n_cols elements of `type`, row-major, in the mapping. */
typedef struct model_weight {
    uint32_t type;
    int64_t n_rows;
    int64_t n_cols;
    const void *data;
} model_weight;

typedef struct model_layer {
    const float *attn_norm; /* [n_embd] */
    model_weight wq, wk, wv, wo;
    const float *bq, *bk, *bv;    /* qwen2 biases, else NULL */
    const float *q_norm, *k_norm; /* qwen3 per-head RMSNorm weights [head_dim_k], else NULL */
    const float *ffn_norm;
    model_weight w_gate, w_up, w_down;
} model_layer;

struct model {
    model_hparams hp;
    model_weight tok_embd; /* n_vocab rows of n_embd */
    const float *output_norm;
    model_weight output; /* == tok_embd when tied */
    const float *rope_freqs; /* optional per-frequency divisors [n_rot/2], else NULL */
    model_layer *layers;
    tok_vocab *vocab;
    gguf_file *gguf; /* owned, for GGUF models */
    hl_map map;      /* owned, for llama2.c checkpoints */
};

#endif
