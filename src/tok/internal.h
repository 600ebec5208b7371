/*
 * internal.h - declarations shared between the tokenizer's files (tok.c: vocab,
 * SPM, WPM, special tokens, decoding; bpe.c: byte-level BPE; hf.c: tokenizer.json).
 * Not for use outside src/tok/. Encoders append to a caller-owned tok_sink; the vocab
 * (and everything hanging off it) is owned by the tok_vocab and freed with it.
 */
#ifndef HL_TOK_INTERNAL_H
#define HL_TOK_INTERNAL_H

#include "tok/pretok.h"
#include "tok/tok.h"

/* Where encoders append ids: counts past cap so callers can size a retry. */
typedef struct tok_sink {
    int32_t *out;
    size_t cap;
    size_t n;
} tok_sink;

static inline void tok_sink_push(tok_sink *s, int32_t id) {
    if (s->n < s->cap) s->out[s->n] = id;
    s->n++;
}

/* ---- implemented in tok.c ---- */
/* Rank of the merge "left right", or -1 if the vocab has no such merge. */
int64_t tok_merge_rank(const tok_vocab *v, const char *left, size_t left_len, const char *right,
                       size_t right_len);
/* The compiled pre-tokenizer of a BPE vocab (created in tok_vocab_finish). */
const tok_pretok *tok_vocab_pretok(const tok_vocab *v);
/* Whether BPE should first look the whole word up as a token (llama3's ignore_merges). */
bool tok_vocab_ignore_merges(const tok_vocab *v);

/* ---- implemented in bpe.c ---- */
/* Encodes one pre-tokenized word (raw UTF-8 bytes) with byte-level BPE. */
hl_status tok_bpe_encode_word(const tok_vocab *v, const char *word, size_t len, tok_sink *sink,
                              hl_err *err);
/* GPT-2's byte <-> printable-unicode mapping. to_unicode writes at most 2*len bytes.
 * from_unicode returns the byte count, or -1 if text has a char outside the mapping. */
size_t tok_bpe_bytes_to_unicode(const char *in, size_t len, char *out);
int64_t tok_bpe_unicode_to_bytes(const char *in, size_t len, char *out);

#endif
