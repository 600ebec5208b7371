/*
 * vocab.h - the tok_vocab struct and helpers shared by tok.c (vocab, loading, special
 * tokens, decoding), spm.c and wpm.c. Private to src/tok/ (bpe.c uses internal.h only).
 * A tok_vocab owns its entries, text arena, maps and pre-tokenizer; tok_vocab_destroy()
 * frees them all.
 */
#ifndef HL_TOK_VOCAB_H
#define HL_TOK_VOCAB_H

#include "base/strmap.h"
#include "tok/internal.h"

typedef struct tok_entry {
    size_t text_off; /* into text_arena; the text is NUL-terminated there */
    uint32_t text_len;
    float score;
    uint8_t type;  /* tok_token_type */
    uint8_t strip; /* TOK_STRIP_LEFT | TOK_STRIP_RIGHT: whitespace eaten around the special */
} tok_entry;

/* One node of the byte trie over special-token texts. */
typedef struct tok_trie_node {
    int32_t first_child;
    int32_t next_sibling;
    int32_t token; /* id ending here, or -1 */
    uint8_t byte;
} tok_trie_node;

struct tok_vocab {
    tok_model_kind kind;
    char *pre;
    bool finished;

    tok_entry *tokens;
    int32_t n_tokens;
    size_t cap_tokens;
    char *text_arena;
    size_t arena_len, arena_cap;

    hl_strmap *merges; /* "left\xFFright" -> rank */
    int64_t n_merges;

    int32_t special[TOK_SPECIAL_COUNT];
    bool add_bos, add_eos, add_space_prefix;
    bool ignore_merges;
    bool spm_word_chunks; /* no token has U+2581 after another character (see spm.c) */

    /* Built by tok_vocab_finish. */
    hl_strmap *token_map; /* text -> id (a later duplicate wins, as in llama.cpp) */
    uint8_t *is_eog;      /* per token */
    char *piece_arena;    /* decoded bytes of every token (special tokens: raw text) */
    size_t *piece_off;
    uint32_t *piece_len;
    uint32_t max_token_len; /* longest token text, bytes */
    uint32_t max_piece_len;
    int32_t byte_token[256]; /* SPM/WPM <0xXX> tokens, -1 if absent */
    tok_trie_node *trie;     /* node 0 is the root; NULL when there are no special tokens */
    int32_t n_trie;
    uint8_t special_first_byte[32]; /* bitset: bytes that start a special token */
    tok_pretok *pretok;
};

/* Whether an SPM vocab allows encoding word by word (computed in finish). */
bool tok_spm_words_independent(const tok_vocab *v);

static inline bool tok_id_valid(const tok_vocab *v, int32_t id) {
    return id >= 0 && id < v->n_tokens;
}

static inline int32_t tok_lookup(const tok_vocab *v, const char *text, size_t len) {
    int64_t id;
    return hl_strmap_get(v->token_map, text, len, &id) ? (int32_t)id : -1;
}

/* spm.c: SentencePiece over one raw fragment (already with the space prefix decided). */
hl_status tok_spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                         tok_sink *sink, hl_err *err);
/* wpm.c: WordPiece over one raw fragment. */
hl_status tok_wpm_encode(const tok_vocab *v, const char *text, size_t len, tok_sink *sink,
                         hl_err *err);

#endif
