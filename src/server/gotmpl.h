/*
 * gotmpl.h - a Go text/template subset for Ollama-style prompt templates.
 *
 * Supported: text and {{ actions }} with {{- / -}} trimming and comments;
 *   {{ PIPELINE }} output; {{ if P }} {{ else if P }} {{ else }} {{ end }};
 *   {{ range P }} / {{ range $v := P }} / {{ range $i, $v := P }} ... {{ else }} {{ end }}
 *   over arrays (and objects: keys in order); {{ with P }}; {{ $x := P }} / {{ $x = P }};
 *   {{ break }} {{ continue }};
 *   operands: . .Field.Sub $ $.Field $var $var.Field "strings" `raw` 123 true false nil
 *   (PIPELINE); functions: eq ne lt le gt ge and or not len index slice json print
 *   printf (%s %d %v %q); pipelines with | (the value becomes the last argument).
 * Data is JSON: the template sees a JSON object (System, Prompt, Response, Suffix,
 * Messages [{Role, Content, Thinking, ToolCalls}], Tools, Think...). Printing an object
 * or array prints its JSON (as Ollama's types do); a missing field is empty.
 *
 * With cut_after_response, output stops right after the first {{ .Response }} (Ollama's
 * legacy per-turn execution).
 *
 * Errors: parse errors HL_ERR_FORMAT ("template: ..."); constructs outside the subset
 * HL_ERR_UNSUPPORTED; runtime errors (wrong argument types) HL_ERR_INVALID. Output and
 * work are bounded (range iterations, output size, call depth).
 *
 * Ownership: gotmpl_compile allocates; gotmpl_free frees. A compiled template is
 * immutable and may be executed from several threads. *out is malloc'd.
 */
#ifndef HL_SERVER_GOTMPL_H
#define HL_SERVER_GOTMPL_H

#include <jansson.h>
#include <stdbool.h>

#include "base/status.h"

typedef struct gotmpl gotmpl;

hl_status gotmpl_compile(const char *src, gotmpl **out, hl_err *err);
void gotmpl_free(gotmpl *t); /* accepts NULL */
hl_status gotmpl_exec(const gotmpl *t, const json_t *data, bool cut_after_response, char **out,
                      hl_err *err);
/* Whether the template refers to a top-level field (e.g. "Messages", "Suffix", "Tools"). */
bool gotmpl_uses(const gotmpl *t, const char *field);
/* Whether any field name anywhere in the template (.A.B, $.A, $x.A, at any depth) is
 * name, case-insensitively: Ollama's Template.Vars() test. */
bool gotmpl_mentions(const gotmpl *t, const char *name);

#endif
