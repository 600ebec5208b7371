/*
 * pretok.h - BPE pre-tokenizers: split text into words before merges.
 *
 * Each tokenizer.ggml.pre value maps to an ordered list of regexes (as llama.cpp
 * and HF tokenizers define them), compiled once with PCRE2 in UTF + UCP mode.
 * Splitting applies them in order, each over the pieces the previous one left,
 * and reports word spans (byte offsets into the input). Invalid UTF-8 in the
 * input is handled (the spans still cover every byte exactly once).
 *
 * A tok_pretok is immutable after creation and safe to share between threads
 * (match data is allocated per call).
 */
#ifndef HL_TOK_PRETOK_H
#define HL_TOK_PRETOK_H

#include <stddef.h>

#include "base/status.h"

typedef struct tok_pretok tok_pretok;

/* name: "default", "llama-bpe"/"llama3", "qwen2", "gpt-2", "deepseek-llm",
 * "deepseek-coder", "falcon", "mpt", "starcoder", "refact", ... An unknown name is
 * HL_ERR_UNSUPPORTED with a message listing it. */
hl_status tok_pretok_create(const char *name, tok_pretok **out, hl_err *err);
void tok_pretok_destroy(tok_pretok *p); /* accepts NULL */

typedef void (*tok_pretok_emit)(void *ud, size_t start, size_t len);
/* Calls emit for each word in order; the words tile [0, len). */
hl_status tok_pretok_split(const tok_pretok *p, const char *text, size_t len,
                           tok_pretok_emit emit, void *ud, hl_err *err);

#endif
