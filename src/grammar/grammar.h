/*
 * grammar.h - constrained decoding from a JSON schema: a schema compiler, a byte-level
 * pushdown recognizer of the JSON texts the schema accepts, and a token mask computed by
 * walking a vocabulary's byte trie against the recognizer's state.
 *
 * Three objects, three lifetimes:
 *   gram_schema  a compiled `format` (immutable, may be shared): gram_compile() takes the
 *                format as JSON text: the string "json" (any JSON object, as Ollama's
 *                format "json") or a JSON schema object. A schema keyword that changes
 *                validity and is not enforced fails with HL_ERR_UNSUPPORTED and a message
 *                naming it ("unsupported JSON schema keyword \"not\" at #/properties/x"),
 *                which servers answer with HTTP 400. Annotations (title, description,
 *                default, examples, format, ...) are ignored.
 *   gram_vocab   one vocabulary's token bytes as a trie (build once per vocabulary; read
 *                only afterwards, shared by every matcher on that vocabulary).
 *   gram_matcher one sequence's state: gram_matcher_mask() sets the logits of tokens that
 *                cannot continue a valid text to -inf, gram_matcher_accept() advances it by
 *                the sampled token. End-of-generation tokens are allowed only where the
 *                text is a complete value, and are the only tokens allowed once nothing can
 *                follow (gram_matcher_complete).
 *
 * What is accepted: JSON whose whitespace between tokens is, as in llama.cpp's JSON
 * grammars, one space or a newline and up to GRAM_WS_MAX spaces/tabs of indentation (so
 * a model cannot loop on blanks; none after the root value); numbers of at most 18
 * integer digits (an int64 for every parser), 20 fraction and 3 exponent digits; strings
 * of valid UTF-8 without surrogate escapes, and under a `pattern` (regex.c's subset)
 * without any escape. Object properties may come in any order;
 * additionalProperties absent means none (as llama.cpp's converter: fewer hallucinated
 * keys, and still valid under the schema); oneOf is enforced as anyOf (branches should
 * be disjoint, as discriminated unions are).
 *
 * Thinking: a matcher may be told to let free text pass first: with think_close set,
 * the output may open with think_open (when given; or start inside the thinking part
 * when in_think) and is unconstrained until think_close, after which the grammar applies.
 *
 * Lazy grammars (tool calls, as llama.cpp's grammar triggers): with trigger set, the
 * output (after any thinking part) is free text in which each occurrence of trigger
 * starts a value of the schema; the value is followed by optional whitespace and
 * trigger_end (when not empty), and free text resumes. The end of generation is allowed
 * only in the free text, and such a matcher is never complete. With trigger_now, the
 * output (after any thinking part and leading whitespace) must open with the trigger.
 */
#ifndef HL_GRAMMAR_GRAMMAR_H
#define HL_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tok/tok.h"

#define GRAM_WS_MAX 20 /* most blanks of indentation after a newline */

typedef struct gram_schema gram_schema;
typedef struct gram_vocab gram_vocab;
typedef struct gram_matcher gram_matcher;

/* format: JSON text, either "\"json\"" or a schema object (or true). */
hl_status gram_compile(const char *format, size_t len, gram_schema **out, hl_err *err);
void gram_schema_free(gram_schema *s); /* accepts NULL */

hl_status gram_vocab_create(const tok_vocab *v, gram_vocab **out, hl_err *err);
void gram_vocab_free(gram_vocab *gv); /* accepts NULL */
int32_t gram_vocab_n_tokens(const gram_vocab *gv);

typedef struct gram_think {
    const char *open;  /* may be NULL */
    const char *close; /* NULL: no thinking part */
    bool in_think;     /* the prompt already opened it */
    /* lazy grammar: NULL or "" for none; trigger_end may be NULL */
    const char *trigger, *trigger_end;
    bool trigger_now;  /* the first value is required (tool_choice "required") */
} gram_think;

/* gv may be NULL for a byte-only matcher (gram_matcher_feed; no mask/accept). think may
 * be NULL. The matcher borrows s and gv. */
hl_status gram_matcher_create(const gram_schema *s, const gram_vocab *gv, const gram_think *think,
                              gram_matcher **out, hl_err *err);
void gram_matcher_free(gram_matcher *m); /* accepts NULL */
/* Feeds bytes; false (state unchanged) when they cannot continue a valid text. */
bool gram_matcher_feed(gram_matcher *m, const char *bytes, size_t n);
/* Masks a row of logits (n_vocab may differ from the vocabulary's: extra ids are masked).
 * When no token at all can continue (a vocabulary without the needed pieces) the row is
 * left alone rather than stall. */
void gram_matcher_mask(gram_matcher *m, float *logits, int32_t n_vocab);
/* Advances by a sampled token; false when the token does not fit (the state is then
 * unchanged; an end-of-generation token is accepted only where the text may end). */
bool gram_matcher_accept(gram_matcher *m, int32_t token);
/* Whether token could be accepted now (the state is unchanged): the mask's answer for
 * one token, computed by feeding its bytes. */
bool gram_matcher_allows(gram_matcher *m, int32_t token);
bool gram_matcher_accepting(const gram_matcher *m); /* the text so far is a complete value */
bool gram_matcher_complete(const gram_matcher *m);  /* ... and nothing may follow */

#endif
