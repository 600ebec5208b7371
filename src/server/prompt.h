/*
 * prompt.h - turning a request into prompt text (spec section 10), the way Ollama does.
 *
 * Which template renders a model's prompt, in order:
 *   1. the Modelfile TEMPLATE when it is Jinja (contains "{%") - rendered with tmpl;
 *   2. the Modelfile TEMPLATE as a Go template (gotmpl.h: the text/template subset
 *      Ollama's templates use - if/else if/range/with, variables, eq/ne/and/or/not/len/
 *      slice/index/json/printf...). Templates that use .Messages run once over the
 *      collated conversation (with .System, .Tools, .Think, .ThinkLevel); "legacy" ones
 *      (.System/.Prompt/.Response only) run once per user/assistant turn and the last
 *      run is cut just after {{ .Response }}, as Ollama does; a template that mentions
 *      neither .Messages nor .Response (the default one too) gets {{ .Response }}
 *      appended first, so earlier assistant replies stay in the prompt. A template outside the
 *      subset falls back to the GGUF's Jinja template when there is one, else rendering
 *      fails with a clear error;
 *   3. the GGUF's tokenizer.chat_template (Jinja, with messages, tools,
 *      add_generation_prompt, bos_token, eos_token, enable_thinking);
 *   4. the default template {{ .Prompt }}.
 * Capabilities follow Ollama's rules: Jinja text containing "tools"/"tool_call" -> tools;
 * "<think>" and "</think>" -> thinking; a Go template using .Suffix -> insert; .Tools ->
 * tools.
 *
 * Ownership: a prompt_renderer owns its compiled template; strings returned through
 * out parameters are malloc'd and freed by the caller.
 */
#ifndef HL_SERVER_PROMPT_H
#define HL_SERVER_PROMPT_H

#include <jansson.h>
#include <stdbool.h>

#include "base/status.h"
#include "tok/tok.h"

typedef struct prompt_renderer prompt_renderer;

typedef struct prompt_caps {
    bool tools;
    bool thinking;
    bool insert;
} prompt_caps;

/* modelfile_template / gguf_template may be NULL. vocab gives bos_token/eos_token. */
hl_status prompt_renderer_create(const char *modelfile_template, const char *gguf_template,
                                 const tok_vocab *vocab, prompt_renderer **out, hl_err *err);
void prompt_renderer_free(prompt_renderer *p); /* accepts NULL */
prompt_caps prompt_renderer_caps(const prompt_renderer *p);
/* The thinking/tool-call tags the model's template uses ("<think>", "</think>",
 * "<tool_call>" or "{"). */
const char *prompt_tool_tag(const prompt_renderer *p);

/* Renders a conversation: messages is an array of {role, content, thinking?,
 * tool_calls?, tool_name?}; tools an array or NULL; think < 0 unset, 0 off, 1 on
 * (Jinja: enable_thinking); think_level "low"/"medium"/"high"/"max" or NULL (Jinja:
 * reasoning_effort). The prompt ends where the model's reply starts
 * (add_generation_prompt). */
hl_status prompt_render_chat(const prompt_renderer *p, const json_t *messages,
                             const json_t *tools, int think, const char *think_level,
                             char **out, hl_err *err);

/* Executes one Go template with .System, .Prompt, .Suffix and an empty .Response, cut
 * after .Response (generate with `template` or `suffix`). */
hl_status prompt_render_go(const char *go_template, const char *system, const char *prompt,
                           const char *suffix, char **out, hl_err *err);
/* Whether a Go template uses .Suffix (the insert capability). */
bool prompt_go_uses_suffix(const char *go_template);

#endif
