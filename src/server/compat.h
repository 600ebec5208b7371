/*
 * compat.h - what the OpenAI (api_openai.c) and Anthropic (api_anthropic.c) layers
 * share: Server-Sent Events framing, ids, request-field readers that report errors in
 * the caller's wording, and Claude Code's billing-header filter.
 *
 * Both layers work like Ollama's middleware (spec sections 3 and 4): a request is
 * translated into a native /api/chat, /api/generate or /api/embed request, run by the
 * native handler (srv_native_run) and its output re-encoded by an srv_encoder
 * (internal.h) into the layer's response objects, SSE frames and error shapes.
 *
 * Ownership: every char * / json_t * returned is new (malloc'd / a new reference) and
 * belongs to the caller.
 */
#ifndef HL_SERVER_COMPAT_H
#define HL_SERVER_COMPAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/internal.h"

/* "data: <compact json>\n\n" (steals obj). */
char *compat_sse_data(json_t *obj);
/* "event: <name>\ndata: <compact json>\n\n" (steals obj). */
char *compat_sse_event(const char *name, json_t *obj);
/* Concatenates a and b (either may be NULL); frees both. */
char *compat_cat(char *a, char *b);

/* A tool_choice that asks for a call, as the native request's internal "_tool_choice"
 * (api_infer.c: the grammar then opens a call first): "required" for OpenAI's
 * "required" and Anthropic's {"type":"any"}; {"name": X} for a function named by OpenAI
 * chat ({"type":"function","function":{"name"}}), the Responses API ({"type":"function",
 * "name"}) or Anthropic ({"type":"tool","name"}). Other values ("auto", "none") set
 * nothing. */
void compat_tool_choice(const json_t *choice, json_t *native);

/* n random lowercase hex digits into out (out has room for n + 1). */
void compat_random_hex(char *out, size_t n);

/* Claude Code puts a line `x-anthropic-billing-header: ...` in its system prompt that
 * changes on every request; keeping it would make every prompt differ near its start
 * and defeat the prefix (KV) cache. Returns text without any line that starts with
 * that header name (case-insensitive), the line's newline included. */
char *compat_strip_billing_header(const char *text);
#define COMPAT_BILLING_HEADER "x-anthropic-billing-header:"

/* Generated text may hold NUL bytes (a <0x00> token): the encoders copy text members as
 * JSON values instead of C strings. compat_text: the string member key of obj as a new
 * reference ("" when absent or not a string); compat_text_len: its length in bytes. */
json_t *compat_text(const json_t *obj, const char *key);
size_t compat_text_len(const json_t *obj, const char *key);

/* Reads a number field: absent/null -> false (out untouched); a number -> true;
 * anything else -> sets *bad. */
bool compat_number(const json_t *obj, const char *key, double *out, bool *bad);

/* Attach a layer's encoder to r (replacing any): from then on r's errors, streams and
 * replies take that layer's shape. The handlers use them; tests drive them with their
 * own producers. False: out of memory. */
bool compat_attach_openai_chat(srv_request *r);
bool compat_attach_anthropic(srv_request *r);
bool compat_attach_openai_responses(srv_request *r); /* api_responses.c */

#endif
