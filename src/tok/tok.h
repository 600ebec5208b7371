/*
 * tok.h - tokenizers: text <-> token ids.
 *
 * A tok_vocab holds one vocabulary and its algorithm:
 *   TOK_MODEL_SPM  SentencePiece-style (tokenizer.ggml.model = "llama"): scores,
 *                  byte fallback (<0xXX>), space prefix and U+2581 for spaces.
 *   TOK_MODEL_BPE  GPT-2 byte-level BPE ("gpt2"): merges, a pre-tokenizer chosen by
 *                  tokenizer.ggml.pre (see tok/pretok.h), bytes mapped to unicode.
 *   TOK_MODEL_WPM  WordPiece ("bert").
 * It is built from GGUF metadata (tok_vocab_load_gguf), from a Hugging Face
 * tokenizer.json (tok_vocab_load_hf, .json or .json.gz), or by hand with the
 * builder calls (tok_vocab_create + add_* + tok_vocab_finish), which both loaders use.
 *
 * Encoding splits out special/control tokens first when parse_special is set
 * (so "<|im_start|>" in text becomes one id), then runs the algorithm on the rest.
 * Decoding is per token (tok_token_to_piece) or streaming (tok_stream), which
 * holds back incomplete UTF-8 so a consumer only ever sees valid UTF-8.
 *
 * Ownership: the vocab owns all its strings; it is immutable after finish and
 * safe to share between threads for encode/decode.
 */
#ifndef HL_TOK_H
#define HL_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gguf/gguf.h"

typedef enum tok_model_kind {
    TOK_MODEL_NONE = 0,
    TOK_MODEL_SPM,
    TOK_MODEL_BPE,
    TOK_MODEL_WPM,
} tok_model_kind;

/* Token attribute types as GGUF's tokenizer.ggml.token_type stores them. */
typedef enum tok_token_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_token_type;

/* Special token roles (ids are -1 when the vocab has none). */
typedef enum tok_special {
    TOK_SPECIAL_BOS = 0,
    TOK_SPECIAL_EOS,
    TOK_SPECIAL_EOT, /* end of turn, e.g. <|eot_id|>, <|im_end|> */
    TOK_SPECIAL_EOM,
    TOK_SPECIAL_UNK,
    TOK_SPECIAL_SEP,
    TOK_SPECIAL_PAD,
    TOK_SPECIAL_CLS,
    TOK_SPECIAL_MASK,
    TOK_SPECIAL_COUNT
} tok_special;

typedef struct tok_vocab tok_vocab;

/* ---- loading ---- */
hl_status tok_vocab_load_gguf(const gguf_file *f, tok_vocab **out, hl_err *err);
hl_status tok_vocab_load_hf(const char *tokenizer_json_path, tok_vocab **out, hl_err *err);
void tok_vocab_destroy(tok_vocab *v); /* accepts NULL */

/* ---- builder (used by the loaders and by tests) ---- */
/* pre: the pre-tokenizer name (tokenizer.ggml.pre); NULL means "default". */
tok_vocab *tok_vocab_create(tok_model_kind kind, const char *pre); /* NULL on OOM */
/* Appends token id = current count. text is len bytes (copied). */
hl_status tok_vocab_add_token(tok_vocab *v, const char *text, size_t len, float score,
                              tok_token_type type);
/* A BPE merge as GGUF stores it: "left right" (copied); rank = order of addition. */
hl_status tok_vocab_add_merge(tok_vocab *v, const char *merge, size_t len);
void tok_vocab_set_special(tok_vocab *v, tok_special which, int32_t id);
void tok_vocab_set_add_bos(tok_vocab *v, bool on);
void tok_vocab_set_add_eos(tok_vocab *v, bool on);
void tok_vocab_set_add_space_prefix(tok_vocab *v, bool on);
/* Whitespace a special token eats when split out of text (HF added_tokens'
 * lstrip/rstrip; llama.cpp sets them for a few models): TOK_STRIP_LEFT removes the
 * whitespace just before it, TOK_STRIP_RIGHT the whitespace just after. */
#define TOK_STRIP_LEFT 1
#define TOK_STRIP_RIGHT 2
void tok_vocab_set_token_strip(tok_vocab *v, int32_t id, int strip);
/* Validates ids, builds lookup tables and the special-token matcher. */
hl_status tok_vocab_finish(tok_vocab *v, hl_err *err);

/* ---- queries ---- */
tok_model_kind tok_vocab_kind(const tok_vocab *v);
int32_t tok_vocab_n_tokens(const tok_vocab *v);
int32_t tok_vocab_special(const tok_vocab *v, tok_special which);
bool tok_vocab_add_bos(const tok_vocab *v);
bool tok_vocab_add_eos(const tok_vocab *v);
/* End of generation: EOS, EOT, EOM, or any other token the vocab marks as such. */
bool tok_is_eog(const tok_vocab *v, int32_t id);
bool tok_is_control(const tok_vocab *v, int32_t id);
/* Raw token text as stored in the vocab (for SPM with U+2581, for BPE byte-mapped). */
const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len);
float tok_token_score(const tok_vocab *v, int32_t id);
tok_token_type tok_token_get_type(const tok_vocab *v, int32_t id);
/* Looks a token up by its exact stored text; -1 if absent. */
int32_t tok_find_token(const tok_vocab *v, const char *text, size_t len);

/* ---- encode ---- */
/* Tokenizes text (len bytes; need not be NUL-terminated or valid UTF-8).
 * add_special: add BOS/EOS as the vocab says. parse_special: recognise special
 * tokens written in the text. Writes at most max_out ids to out and returns the
 * total count in *n_out (which may exceed max_out: call again with a bigger
 * buffer). HL_ERR_NOMEM on OOM. */
hl_status tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, size_t max_out, size_t *n_out,
                     hl_err *err);

/* ---- decode ---- */
/* The bytes token id stands for (SPM: U+2581 -> ' ', <0xXX> -> byte; BPE: bytes
 * unmapped). Control tokens give their text only when render_special is set.
 * Writes up to cap bytes and returns the full length (like snprintf, no NUL);
 * returns -1 for an invalid id. */
int32_t tok_token_to_piece(const tok_vocab *v, int32_t id, bool render_special, char *buf,
                           size_t cap);

/* Decodes a whole sequence as llama.cpp's detokenize does: concatenates pieces and,
 * for SPM vocabs with a space prefix, drops the leading space of the first piece
 * when remove_leading_space is set (only ids[0]: a leading BOS uses the chance up,
 * as in llama.cpp). Same return convention as tok_token_to_piece; -1 for an invalid
 * id. No clean-up of spaces before punctuation (llama.cpp's clean_spaces) is done,
 * so BPE and SPM decoding is lossless. */
int64_t tok_decode(const tok_vocab *v, const int32_t *ids, size_t n, bool render_special,
                   bool remove_leading_space, char *buf, size_t cap);

/* Streaming detokenizer: push ids one at a time; complete UTF-8 sequences are
 * emitted, an incomplete tail is held until the next push (or dropped/replaced on
 * flush). Invalid bytes become U+FFFD. Caller-allocated; no heap use. */
typedef struct tok_stream {
    const tok_vocab *vocab;
    bool render_special;
    bool at_start;      /* for SPM leading-space removal */
    bool strip_leading_space;
    uint8_t pending[8]; /* an incomplete UTF-8 sequence */
    size_t n_pending;
} tok_stream;

void tok_stream_init(tok_stream *s, const tok_vocab *v, bool render_special,
                     bool strip_leading_space);
/* Appends the text ready after id to buf (up to cap bytes; returns bytes written,
 * or -1 if cap was too small, in which case nothing is consumed and the push can be
 * retried; 64 + the longest token is enough unless pieces are mostly invalid UTF-8,
 * tok_stream_buf_size() always is). Each maximal invalid subsequence becomes one
 * U+FFFD. An invalid id adds nothing. With strip_leading_space (SPM vocabs with a
 * space prefix), the first pushed token loses its leading space, as in tok_decode. */
int32_t tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap);
/* A cap for tok_stream_push/flush that is always enough for this vocab (every held or
 * piece byte may turn into a 3-byte U+FFFD). */
size_t tok_stream_buf_size(const tok_vocab *v);
/* Emits what is still held (invalid tail as U+FFFD). */
int32_t tok_stream_flush(tok_stream *s, char *buf, size_t cap);

#endif
