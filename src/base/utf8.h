/*
 * utf8.h - strict UTF-8 checks and encoding, shared by the tokenizers, the template
 * engine, the store and the tests.
 *
 * "Valid" means well-formed per Unicode: no overlongs, no surrogates, nothing past
 * U+10FFFF. Pure functions on caller-owned buffers; nothing is allocated.
 */
#ifndef HL_BASE_UTF8_H
#define HL_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Expected length (1-4) of the sequence a byte starts, or 0 when it cannot start one. */
int hl_utf8_seq_len(uint8_t lead);

/* Whether c may stand at position k (1..3) after lead in a valid sequence. */
bool hl_utf8_cont_ok(uint8_t lead, int k, uint8_t c);

/* Length of the valid sequence at s (at most n bytes, n >= 1), or 0 if there is none. */
size_t hl_utf8_valid_len(const void *s, size_t n);

/* Offset of the first byte that does not begin a valid sequence; n when all is valid. */
size_t hl_utf8_first_invalid(const void *s, size_t n);

static inline bool hl_utf8_valid(const void *s, size_t n) {
    return hl_utf8_first_invalid(s, n) == n;
}

/* Writes cp (< 0x200000) as 1-4 bytes at out; returns the count. Callers keep cp within
 * U+10FFFF where the output must be valid. */
size_t hl_utf8_put(uint32_t cp, char *out);

#endif
