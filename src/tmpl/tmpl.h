/*
 * tmpl.h - a Jinja2 interpreter for chat templates.
 *
 * Owns: parsing a template source (a model's tokenizer.chat_template) into an AST once,
 * and rendering it with a JSON context (messages, tools, add_generation_prompt,
 * bos_token, eos_token, anything else) into the prompt text. It matches Python jinja2 3.1
 * as transformers' apply_chat_template sets it up: ImmutableSandboxedEnvironment(
 * trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]), tojson overridden as
 * json.dumps(ensure_ascii=False) (no HTML escaping, keys in insertion order, indent=N
 * supported), raise_exception(msg), the {% generation %} block, and no strftime_now unless
 * tmpl_options asks for it. Values follow Python: truthiness, str()/repr() of lists,
 * dicts, floats and None, code-point string length/slicing, and jinja's Undefined
 * (prints empty, is falsy, iterates empty; only attribute access, calls and arithmetic
 * on it raise).
 *
 * Deliberate leniencies where jinja2 would raise: list.append/pop/extend/insert work
 * (llama.cpp allows them; the sandbox does not), a from_json filter exists, select/map
 * results are lists rather than generators, and integers are 64-bit (overflow is an
 * error instead of a bignum).
 *
 * Usage:
 *   tmpl *t; hl_err err;
 *   if (tmpl_compile(src, len, &t, &err)) ...;        // syntax errors: line/column
 *   char *out; size_t n;
 *   if (tmpl_render(t, ctx_json_object, &out, &n, &err)) ...;
 *   ... free(out); tmpl_destroy(t);
 *
 * Errors: HL_ERR_FORMAT for syntax errors ("template syntax error at line L, column C:
 * ...") and for runtime errors of the template itself ("template error at line L: 'x' is
 * undefined", type errors...); HL_ERR_INVALID for raise_exception (err.msg is exactly the
 * template's message, e.g. "System role not supported") and for hitting a limit (output
 * size, memory, loop iterations, evaluation steps, nesting or recursion depth), which is
 * what a hostile template or input gets instead of a crash or a hang.
 *
 * Ownership: a tmpl owns its AST (one arena); it is immutable after compile, so one tmpl
 * may be rendered from several threads at once (each render has its own arena, freed
 * before tmpl_render returns). The context is only read. *out is malloc'd and
 * NUL-terminated (the length excludes the NUL), and the caller frees it with free().
 */
#ifndef HL_TMPL_H
#define HL_TMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tmpl tmpl;

typedef struct tmpl_limits {
    size_t max_output;         /* bytes of any rendered text (the result, macro output...) */
    size_t max_memory;         /* bytes of working memory one render may use */
    uint64_t max_iterations;   /* loop iterations over the whole render */
    int max_call_depth;        /* nested macro calls */
    uint64_t max_steps;        /* evaluation work: one per expression evaluated, plus one
                                  per 64 bytes a string operation scans or copies */
} tmpl_limits;

/* The defaults tmpl_render uses: 16 MiB output, 256 MiB memory, 1e7 iterations,
 * 200 nested macro calls, 1e8 steps (real templates need well under 1e6). Ranges are limited to 100000 items, like jinja's sandbox. */
tmpl_limits tmpl_default_limits(void);

/* Parses source (len bytes, need not be NUL-terminated) into *out. */
hl_status tmpl_compile(const char *source, size_t len, tmpl **out, hl_err *err);

/* Renders with context, a JSON object (NULL = empty); see the header comment. */
hl_status tmpl_render(const tmpl *t, const json_t *context, char **out, size_t *out_len,
                      hl_err *err);
hl_status tmpl_render_limited(const tmpl *t, const json_t *context, const tmpl_limits *limits,
                              char **out, size_t *out_len, hl_err *err);

/* Everything a render can be told. strftime_now(fmt) is what newer transformers define
 * (Llama 3.x, gpt-oss, Mistral Small use it for today's date); it is off by default so
 * renders match the reference setup, where templates fall back to a fixed date or raise. */
typedef struct tmpl_options {
    tmpl_limits limits;
    bool strftime_now; /* define strftime_now(format), formatting local time */
    int64_t now;       /* seconds since the epoch for strftime_now; 0 = the current time */
} tmpl_options;

tmpl_options tmpl_default_options(void);
hl_status tmpl_render_opts(const tmpl *t, const json_t *context, const tmpl_options *opts,
                           char **out, size_t *out_len, hl_err *err);

void tmpl_destroy(tmpl *t); /* accepts NULL */

/* The chat template in a tokenizer_config.json object: its "chat_template" field when it
 * is a string, or the "default" entry's template when it is a list of {name, template}.
 * Returns a pointer into config (NULL when there is none). */
const char *tmpl_from_tokenizer_config(const json_t *config);

#endif
