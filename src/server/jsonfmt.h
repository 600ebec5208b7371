/*
 * jsonfmt.h - constrained decoding for format "json": a byte-level recognizer of JSON
 * prefixes and a logits mask built on it.
 *
 * Like Ollama's "json" grammar, the output must be one JSON object (leading whitespace
 * allowed; whitespace runs capped at 8 bytes so a model cannot stall on blanks), and the end of
 * generation is only allowed once that object is complete. For a JSON-schema `format`
 * the same generic object constraint applies (the schema itself is not enforced).
 *
 * json_prefix is a small value type (copy it to try bytes). jsonfmt owns a table of every
 * token's bytes for one vocabulary; jsonfmt_mask() sets the logits of tokens that would
 * break the JSON to -inf, and jsonfmt_accept() advances the state by a sampled token.
 * If no token at all can continue (a vocabulary without the needed pieces), the mask
 * leaves the row alone rather than fail.
 */
#ifndef HL_SERVER_JSONFMT_H
#define HL_SERVER_JSONFMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tok/tok.h"

#define JSON_PREFIX_MAX_DEPTH 32

typedef struct json_prefix {
    uint8_t state;
    uint8_t depth;
    uint8_t ws_run;
    uint8_t lit_pos;     /* position in true/false/null */
    uint8_t lit;         /* which literal */
    uint8_t hex_left;    /* \uXXXX digits still expected */
    uint8_t utf8_left;   /* continuation bytes still expected in a string */
    bool done;           /* the root object is complete */
    char stack[JSON_PREFIX_MAX_DEPTH]; /* '{' or '[' */
} json_prefix;

void json_prefix_init(json_prefix *p);
/* Feeds one byte; false (state unchanged) when it cannot continue a JSON object. */
bool json_prefix_feed(json_prefix *p, uint8_t c);
/* Feeds bytes; false when any of them is rejected (state then undefined). */
bool json_prefix_feed_all(json_prefix *p, const char *s, size_t n);

typedef struct jsonfmt jsonfmt;

hl_status jsonfmt_create(const tok_vocab *v, jsonfmt **out, hl_err *err);
void jsonfmt_free(jsonfmt *j); /* accepts NULL */
void jsonfmt_mask(jsonfmt *j, float *logits, int32_t n_vocab);
void jsonfmt_accept(jsonfmt *j, int32_t token);
bool jsonfmt_complete(const jsonfmt *j);

#endif
