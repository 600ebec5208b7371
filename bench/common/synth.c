/* synth.c - see synth.h. */
#include "synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_synth.h"
#include "tensor/types.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dULL;

float bench_frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 11) * 0x1.0p-52) - 1.0f;
}

int bench_synth_add_tensor(gguf_writer *w, const char *name, int64_t rows, int64_t cols,
                           hl_type t, float scale, float offset) {
    float *x = malloc(sizeof(float) * (size_t)(rows * cols));
    size_t row_bytes = hl_row_size(t, cols);
    uint8_t *q = malloc(row_bytes * (size_t)rows);
    if (!x || !q) {
        free(x);
        free(q);
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < rows * cols; i++) x[i] = offset + bench_frand() * scale;
    if (t == HL_TYPE_F32) memcpy(q, x, row_bytes * (size_t)rows);
    else
        for (int64_t r = 0; r < rows; r++) hl_quantize_row(t, x + r * cols, q + r * row_bytes, cols);
    int64_t ne[2] = {cols, rows};
    hl_err err;
    int rc = gguf_writer_add_tensor(w, name, t, rows == 1 ? 1 : 2, ne, q, row_bytes * (size_t)rows,
                                    &err);
    if (rc) fprintf(stderr, "%s: %s\n", name, err.msg);
    free(x);
    free(q);
    return rc;
}

int bench_synth_write_llama(const char *path, const bench_llama *c) {
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx);
    gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd);
    gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer);
    gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff);
    gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    synth_write_vocab(w, c->n_vocab);

    const int hd = c->n_embd / c->n_head, kd = c->n_head_kv * hd, E = c->n_embd;
    const float ws = 0.05f;
    int rc = bench_synth_add_tensor(w, "token_embd.weight", c->n_vocab, E, HL_TYPE_Q8_0, 1.0f, 0);
    rc |= bench_synth_add_tensor(w, "output_norm.weight", 1, E, HL_TYPE_F32, 1.0f, 0);
    rc |= bench_synth_add_tensor(w, "output.weight", c->n_vocab, E, HL_TYPE_Q8_0, ws, 0);
    for (int l = 0; l < c->n_layer && !rc; l++) {
        char n[64];
#define T(name, rows, cols, type, s)                                                      \
    (snprintf(n, sizeof n, "blk.%d.%s", l, name),                                        \
     bench_synth_add_tensor(w, n, rows, cols, type, s, 0))
        rc |= T("attn_norm.weight", 1, E, HL_TYPE_F32, 1.0f);
        rc |= T("attn_q.weight", E, E, HL_TYPE_Q8_0, ws);
        rc |= T("attn_k.weight", kd, E, HL_TYPE_Q8_0, ws);
        rc |= T("attn_v.weight", kd, E, HL_TYPE_Q8_0, ws);
        rc |= T("attn_output.weight", E, E, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_norm.weight", 1, E, HL_TYPE_F32, 1.0f);
        rc |= T("ffn_gate.weight", c->n_ff, E, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_up.weight", c->n_ff, E, HL_TYPE_Q8_0, ws);
        rc |= T("ffn_down.weight", E, c->n_ff, HL_TYPE_Q8_0, ws);
#undef T
    }
    hl_err err;
    if (!rc && gguf_writer_write_file(w, path, &err)) {
        fprintf(stderr, "write %s: %s\n", path, err.msg);
        rc = 1;
    }
    gguf_writer_destroy(w);
    return rc;
}

model *bench_synth_llama(const bench_llama *c) {
    char path[] = "/tmp/hearth-bench-model-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        return NULL;
    }
    close(fd);
    model *m = NULL;
    hl_err err;
    if (bench_synth_write_llama(path, c) == 0 && model_load(path, NULL, &m, &err) != HL_OK) {
        fprintf(stderr, "load: %s\n", err.msg);
        m = NULL;
    }
    unlink(path); /* the mapping stays valid */
    return m;
}
