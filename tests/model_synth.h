/*
 * model_synth.h - tiny synthetic llama-family models for the model tests.
 *
 * synth_build() makes random weights (deterministic for a seed), stores them in a GGUF
 * written with the GGUF writer (2-D weights in the requested type, norms and biases f32,
 * a small SPM vocabulary in the tokenizer.ggml.* keys), and keeps the weights exactly as
 * the model will see them (dequantized) for synth_ref_forward(): a plain, token-by-token
 * float implementation of the same architecture, written independently of
 * src/model/forward.c, against which the real forward pass is checked. The caller frees
 * the returned synth_model with synth_free() and removes the GGUF file when it wants.
 */
#ifndef HL_TEST_MODEL_SYNTH_H
#define HL_TEST_MODEL_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tensor/types.h"

typedef struct synth_cfg {
    const char *arch; /* general.architecture */
    int n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv;
    int head_dim;  /* written as attention.key_length/value_length when != n_embd/n_head */
    int n_rot;     /* 0: head_dim */
    bool tied;     /* no output.weight */
    bool bias;     /* q/k/v biases (qwen2) */
    bool qk_norm;  /* attn_q_norm / attn_k_norm (qwen3) */
    bool neox;     /* RoPE ordering the reference uses (qwen2/qwen3) */
    float rope_base;
    float rope_linear_factor; /* 0: no scaling keys */
    bool rope_freqs;          /* a rope_freqs.weight tensor (llama 3.1 frequency factors) */
    hl_type wtype;            /* type of the 2-D weights */
    uint64_t seed;
    const char *skip_tensor;  /* leave this tensor out (error tests) */
    const char *bad_shape_tensor; /* write this tensor with one row too many */
    const char *i32_tensor;       /* label this (f32) tensor's data as i32 */
    /* Mixtral: n_expert > 0 replaces each layer's ffn_gate/up/down with a router
     * (ffn_gate_inp) and n_expert experts n_ff wide (ffn_*_exps); the reference routes
     * with a softmax, the top n_expert_used, weights renormalised. experts_identical: every
     * expert is the dense model's FFN of the same seed (the router comes from its own
     * random stream), so the model computes what the dense one does. At most 64 experts
     * and n_embd 1024. */
    int n_expert, n_expert_used;
    bool experts_identical;
} synth_cfg;

typedef struct synth_model synth_model;

/* A minimal SPM vocabulary (<unk> <s> </s>, then "\u2581wN" pieces with falling scores)
 * in the tokenizer.ggml.* keys; also used by the benchmarks. */
void synth_write_vocab(gguf_writer *w, int n_vocab);

/* Writes the GGUF to path and returns the reference weights (free with synth_free). */
synth_model *synth_build(const synth_cfg *cfg, const char *path);
void synth_free(synth_model *s);
/* A one-layer llama GGUF that is a bigram machine (for tool-call tests): token t's
 * embedding is the one-hot e_t and the attention and FFN outputs are zero, so the logits
 * after token t are column t of the output matrix: 10 at next[t], all 0 where next[t] < 0
 * (the next token uniform). The vocabulary: tokens with their types, falling scores, <s> 1,
 * </s> 2, <unk> 0. False (the reason on stderr) on failure. */
bool synth_write_bigram(const char *path, const char *const *tokens, const int32_t *types,
                        const int *next, int n_vocab, uint32_t n_ctx);
/* The template the tool-call bigram models run with: the prompt ends in <Q> after a
 * user turn and in <R> after a tool result. */
#define SYNTH_BIGRAM_TOOL_TEMPLATE                                                           \
    "{{- if .Tools }}{{ range .Tools }}{{ end }}{{ end }}"                                  \
    "{{- range $i, $_ := .Messages }}{{ .Content }}"                                        \
    "{{- if .ToolCalls }}<tool_call>{{ range .ToolCalls }}{{ json .Function.Arguments }}{{ end }}" \
    "</tool_call>{{ end }}"                                                                 \
    "{{- if eq (len (slice $.Messages $i)) 1 }}{{ if eq .Role \"tool\" }}<R>{{ else }}<Q>{{ end }}" \
    "{{- end }}{{- end }}"

/* Writes the GGUF to path (as synth_build) and loads it: the model, or NULL. */
model *synth_load(const synth_cfg *cfg, const char *path);

/* Reference logits for tokens[0..n), one position at a time: out is n * n_vocab. */
void synth_ref_forward(const synth_model *s, const int32_t *tokens, int n, float *out);

#endif
