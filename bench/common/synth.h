/*
 * synth.h - synthetic llama models for the benchmarks (linked into every benchmark).
 *
 * bench_synth_write_llama() writes a whole llama model with random weights (Q8_0
 * matrices, f32 norms; the vocabulary of synth_write_vocab() in tests/model_synth.h) to
 * a GGUF file the caller removes; bench_synth_llama() writes one to a temporary file,
 * loads it and removes the file (the caller frees the model with model_free).
 * bench_frand() is the benches' deterministic random stream (the model's weights
 * and the benches' random prompts draw from it in turn). Nothing is kept allocated.
 */
#ifndef HL_BENCH_SYNTH_H
#define HL_BENCH_SYNTH_H

#include "gguf/gguf.h"
#include "model/model.h"

typedef struct bench_llama {
    int n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx;
} bench_llama;

/* Uniform in [-1, 1). */
float bench_frand(void);

/* 0 on success; prints what failed to stderr otherwise. */
int bench_synth_write_llama(const char *path, const bench_llama *c);
/* One tensor of rows x cols random values (offset + uniform * scale), quantized to t,
 * added to w; 0 on success. */
int bench_synth_add_tensor(gguf_writer *w, const char *name, int64_t rows, int64_t cols,
                           hl_type t, float scale, float offset);

/* The model of shape c, loaded; NULL (with a message on stderr) on failure. */
model *bench_synth_llama(const bench_llama *c);

#endif
