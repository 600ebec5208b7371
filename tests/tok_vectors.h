/*
 * tok_vectors.h - llama.cpp's golden tokenizer vectors, for tokenizer tests.
 *
 * testdata/tokenizer/llama.cpp/NAME.inp holds test strings, each followed by
 * "\n__ggml_vocab_test__\n"; NAME.out has one line per string with the expected ids
 * (space separated), encoded without BOS/EOS and with parse_special off.
 *
 *   tok_vocab *v = tok_vectors_open_vocab("ggml-vocab-gpt-2.gguf");  // NULL: SKIP
 *   int bad = run_vocab_vectors(v, "ggml-vocab-gpt-2.gguf", TOK_VECTORS_DECODE);
 *   CHECK_EQ_INT(bad, 0);
 *
 * Failures are printed to stderr (string index, text, expected and actual ids). The
 * caller frees the opened vocab with tok_vocab_destroy() and loaded vectors with
 * tok_vectors_free().
 */
#ifndef HL_TESTS_TOK_VECTORS_H
#define HL_TESTS_TOK_VECTORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok/tok.h"

typedef struct tok_vector {
    const char *text; /* points into the loaded .inp buffer (not NUL-terminated) */
    size_t len;
    int32_t *ids;
    size_t n_ids;
} tok_vector;

typedef struct tok_vectors {
    char *inp; /* owned */
    tok_vector *v;
    size_t n;
} tok_vectors;

/* Loads NAME.inp/.out; false (with a note on stderr) if absent or malformed. */
bool tok_vectors_load(const char *name, tok_vectors *out);
void tok_vectors_free(tok_vectors *tv);

/* Opens ../shared/models/ggml-vocab/NAME and loads its vocab; NULL if the file is absent
 * (a load error is printed and also gives NULL). */
tok_vocab *tok_vectors_open_vocab(const char *name);

enum {
    TOK_VECTORS_ENCODE = 0,
    /* also: decoding the expected ids (render_special off, leading space removed as
     * llama.cpp does) must give back the input text byte for byte */
    TOK_VECTORS_DECODE = 1,
};

/* Runs every vector of NAME against v. Returns the number of failing strings, or -1
 * when the vector files are missing. */
int run_vocab_vectors(const tok_vocab *v, const char *name, int flags);

#endif
