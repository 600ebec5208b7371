/*
 * outproc.h - post-processing of generated text, in the order the server applies it:
 *
 *   stop strings  - generation stops before the first occurrence of any stop string and
 *                   the stop text is not emitted. Text that could be the start of a stop
 *                   string is held back until it cannot be (partial matches across token
 *                   boundaries), so a streamed response never shows part of a stop;
 *   thinking      - Ollama's thinking state machine (spec 10.3): leading whitespace,
 *                   an opening tag, thinking text up to the closing tag (partial tags
 *                   buffered), whitespace, then content;
 *   tool calls    - text from the template's tool-call tag (e.g. "<tool_call>", or "{" for
 *                   templates that emit bare JSON like Llama 3.x) is buffered and, at the
 *                   end, JSON objects with a provided tool's "name" and "arguments" (or
 *                   "parameters") become tool_calls; text that parses as no call is
 *                   returned as content. While decoding, tool_grammar's lazy grammar
 *                   holds each call after the tag to the tools' schemas (below).
 *
 * Each processor appends what is ready to caller-owned buffers (outbuf) and owns its own
 * buffered text; *_free releases it.
 */
#ifndef HL_SERVER_OUTPROC_H
#define HL_SERVER_OUTPROC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct outbuf {
    char *p; /* NUL-terminated when non-NULL */
    size_t len, cap;
    bool oom;
} outbuf;

void outbuf_add(outbuf *b, const char *s, size_t n);
void outbuf_clear(outbuf *b); /* keeps the allocation */
void outbuf_free(outbuf *b);

typedef struct stop_matcher {
    char *const *stops;
    size_t n_stops;
    outbuf pending;
} stop_matcher;

void stop_init(stop_matcher *m, char *const *stops, size_t n_stops);
/* Feeds text; appends the text that is final to ready. Returns true when a stop string
 * matched (everything from it on is dropped; stop feeding). */
bool stop_feed(stop_matcher *m, const char *s, size_t n, outbuf *ready);
void stop_flush(stop_matcher *m, outbuf *ready); /* end of generation: release held text */
void stop_free(stop_matcher *m);

typedef struct think_parser {
    int state;
    const char *open, *close;
    outbuf buf;
} think_parser;

/* in_thinking: the prompt already ends with the opening tag. */
void think_init(think_parser *t, const char *open, const char *close, bool in_thinking);
void think_feed(think_parser *t, const char *s, size_t n, outbuf *thinking, outbuf *content);
void think_flush(think_parser *t, outbuf *thinking, outbuf *content);
void think_free(think_parser *t);

typedef struct tool_parser {
    const char *tag;
    const json_t *tools;
    int state;
    outbuf buf;
    int n_calls;
} tool_parser;

void tool_init(tool_parser *p, const char *tag, const json_t *tools);
void tool_feed(tool_parser *p, const char *s, size_t n, outbuf *content);
/* Parses what was buffered: appends tool calls to calls (an array) and anything that is
 * not a call to content. */
void tool_flush(tool_parser *p, json_t *calls, outbuf *content);
void tool_free(tool_parser *p);

/* The constraint on a request's tool calls (grammar.h's lazy grammars, llama.cpp's
 * grammar triggers): after the template's tool-call tag, for "<tool_call>" an object
 * {"name": one tool's name, "arguments": that tool's parameters} and then
 * "</tool_call>"; for "[TOOL_CALLS]" an array of such objects. Returns the schema as
 * JSON text (malloc'd; engine_request.format) and sets *trigger / *trigger_end (static
 * strings), or NULL when there is nothing to enforce: a tag without a grammar ("{", a
 * bare JSON call), no usable tool, or out of memory. only (may be NULL): keep just
 * this tool (a tool_choice naming it). A tool whose parameters the grammar cannot
 * enforce gets any object as arguments, with a debug log (clients send arbitrary
 * schemas: never an error); so do all of them beyond TOOL_GRAMMAR_MAX tools (the
 * recognizer follows at most 16 readings at once, one per tool before the name). */
#define TOOL_GRAMMAR_MAX 8
char *tool_grammar(const json_t *tools, const char *tag, const char *only, const char **trigger,
                   const char **trigger_end);

#endif
