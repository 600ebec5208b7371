/* prompt.c - prompt rendering: Jinja via tmpl, a Go-template subset, Ollama's rules. */
#define _GNU_SOURCE
#include "server/prompt.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/gotmpl.h"
#include "server/outproc.h"
#include "tmpl/tmpl.h"

/* ---------------- a growable string (outbuf, outproc.h) ---------------- */

static void sb_str(outbuf *b, const char *s) { outbuf_add(b, s ? s : "", s ? strlen(s) : 0); }

/* ---------------- Go templates (gotmpl.h) ---------------- */

/* The data of one legacy execution: .System .Prompt .Response .Suffix. */
static json_t *legacy_data(const char *system, const char *prompt, const char *response,
                           const char *suffix, bool think) {
    return json_pack("{s:s, s:s, s:s, s:s, s:b, s:b}", "System", system ? system : "", "Prompt",
                     prompt ? prompt : "", "Response", response ? response : "", "Suffix",
                     suffix ? suffix : "", "Think", think, "IsThinkSet", think);
}

hl_status prompt_render_go(const char *go_template, const char *system, const char *prompt,
                           const char *suffix, char **out, hl_err *err) {
    gotmpl *t;
    hl_status st = gotmpl_compile(go_template, &t, err);
    if (st) return st;
    json_t *data = legacy_data(system, prompt, "", suffix, false);
    st = data ? gotmpl_exec(t, data, true, out, err) : hl_fail(err, HL_ERR_NOMEM, "out of memory");
    json_decref(data);
    gotmpl_free(t);
    return st;
}

bool prompt_go_uses_suffix(const char *go_template) {
    gotmpl *t;
    if (gotmpl_compile(go_template, &t, NULL) != HL_OK) return strstr(go_template, ".Suffix");
    bool r = gotmpl_uses(t, "Suffix");
    gotmpl_free(t);
    return r;
}

/* ---------------- the renderer ---------------- */

struct prompt_renderer {
    tmpl *jinja;      /* when rendering with Jinja */
    gotmpl *go;       /* when rendering a Go template */
    bool go_messages; /* the Go template ranges over .Messages (one execution) */
    prompt_caps caps;
    char tool_tag[32];
    char bos[64], eos[64];
};

static void token_text(const tok_vocab *v, tok_special which, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!v) return;
    int32_t id = tok_vocab_special(v, which);
    size_t len = 0;
    const char *s = id >= 0 ? tok_token_text(v, id, &len) : NULL;
    if (s && len < cap) {
        memcpy(buf, s, len);
        buf[len] = '\0';
    }
}

/* Compiles a chat template the way Ollama's template.Parse does: a template that
 * mentions neither .Messages nor .Response gets {{ .Response }} appended, so that the
 * per-turn (legacy) execution keeps earlier assistant replies (U1 A1 U2, not U1 U2). */
static hl_status go_compile(const char *src, gotmpl **out, hl_err *err) {
    hl_status st = gotmpl_compile(src, out, err);
    if (st || gotmpl_mentions(*out, "Messages") || gotmpl_mentions(*out, "Response")) return st;
    char *with = NULL;
    if (asprintf(&with, "%s{{ .Response }}", src) < 0) {
        gotmpl_free(*out);
        *out = NULL;
        return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    gotmpl *t;
    st = gotmpl_compile(with, &t, err);
    free(with);
    if (st) return HL_OK; /* keep the template as written */
    gotmpl_free(*out);
    *out = t;
    return HL_OK;
}

hl_status prompt_renderer_create(const char *modelfile_template, const char *gguf_template,
                                 const tok_vocab *vocab, prompt_renderer **out, hl_err *err) {
    prompt_renderer *p = calloc(1, sizeof *p);
    if (!p) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    token_text(vocab, TOK_SPECIAL_BOS, p->bos, sizeof p->bos);
    token_text(vocab, TOK_SPECIAL_EOS, p->eos, sizeof p->eos);
    hl_status st = HL_OK;
    const char *jinja_src = NULL;
    if (modelfile_template && *modelfile_template) {
        if (strstr(modelfile_template, "{%")) {
            jinja_src = modelfile_template;
        } else {
            hl_err gerr;
            st = go_compile(modelfile_template, &p->go, &gerr);
            if (st) {
                /* outside the subset: the GGUF's own template, else report why */
                if (!gguf_template || !*gguf_template) {
                    *err = gerr;
                    prompt_renderer_free(p);
                    return st;
                }
                st = HL_OK;
            } else {
                p->caps.insert = gotmpl_uses(p->go, "Suffix");
                p->caps.tools = gotmpl_uses(p->go, "Tools");
                p->caps.thinking = gotmpl_uses(p->go, "Think") &&
                                   strstr(modelfile_template, "<think>") != NULL;
                p->go_messages = gotmpl_mentions(p->go, "Messages");
                const char *tags[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
                snprintf(p->tool_tag, sizeof p->tool_tag, "{");
                for (int i = 0; i < 2; i++)
                    if (strstr(modelfile_template, tags[i])) {
                        snprintf(p->tool_tag, sizeof p->tool_tag, "%s", tags[i]);
                        break;
                    }
            }
        }
    }
    if (!p->go && !jinja_src && gguf_template && *gguf_template) jinja_src = gguf_template;
    if (jinja_src) {
        st = tmpl_compile(jinja_src, strlen(jinja_src), &p->jinja, err);
        if (st) {
            prompt_renderer_free(p);
            return st;
        }
        p->caps.tools = strstr(jinja_src, "tools") || strstr(jinja_src, "tool_call");
        p->caps.thinking = strstr(jinja_src, "<think>") && strstr(jinja_src, "</think>");
        snprintf(p->tool_tag, sizeof p->tool_tag, "%s",
                 strstr(jinja_src, "<tool_call>") ? "<tool_call>" : "{");
    }
    if (!p->go && !p->jinja) { /* default template {{ .Prompt }} */
        st = go_compile("{{ .Prompt }}", &p->go, err);
        if (st) {
            prompt_renderer_free(p);
            return st;
        }
    }
    *out = p;
    return HL_OK;
}

void prompt_renderer_free(prompt_renderer *p) {
    if (!p) return;
    tmpl_destroy(p->jinja);
    gotmpl_free(p->go);
    free(p);
}

prompt_caps prompt_renderer_caps(const prompt_renderer *p) { return p->caps; }
const char *prompt_tool_tag(const prompt_renderer *p) { return p->tool_tag[0] ? p->tool_tag : "{"; }

static const char *msg_str(const json_t *m, const char *k) {
    const char *s = json_string_value(json_object_get(m, k));
    return s ? s : "";
}

/* Consecutive messages of one role merge (not tool results); system contents join
 * into .System (Ollama's collate). */
static json_t *collate(const json_t *messages, outbuf *sys) {
    json_t *out = json_array();
    size_t i;
    json_t *m;
    bool have_sys = false;
    json_array_foreach(messages, i, m) {
        const char *role = msg_str(m, "role"), *content = msg_str(m, "content");
        if (!strcmp(role, "system")) {
            if (have_sys) sb_str(sys, "\n\n");
            sb_str(sys, content);
            have_sys = true;
        }
        json_t *last = json_array_size(out) ? json_array_get(out, json_array_size(out) - 1) : NULL;
        if (last && !strcmp(msg_str(last, "role"), role) && strcmp(role, "tool") != 0) {
            outbuf b = {0};
            sb_str(&b, msg_str(last, "content"));
            sb_str(&b, "\n\n");
            sb_str(&b, content);
            json_object_set_new(last, "content", json_string(b.p ? b.p : ""));
            free(b.p);
        } else {
            json_array_append_new(out, json_deep_copy(m));
        }
    }
    return out;
}

/* Go templates: one execution over .Messages, or Ollama's legacy execution (one run
 * per user/assistant turn, the last cut after .Response). */
static hl_status render_go_chat(const prompt_renderer *p, const json_t *messages,
                                const json_t *tools, int think, const char *level, char **out,
                                hl_err *err) {
    if (p->go_messages) {
        outbuf sys = {0};
        outbuf_add(&sys, "", 0);
        json_t *msgs = collate(messages, &sys);
        json_t *data = json_pack("{s:s, s:o, s:O, s:s, s:s, s:s, s:b, s:s, s:b}", "System",
                                 sys.p ? sys.p : "", "Messages", msgs, "Tools",
                                 tools ? tools : json_null(), "Prompt", "", "Response", "",
                                 "Suffix", "", "Think", think > 0, "ThinkLevel",
                                 level ? level : "", "IsThinkSet", think >= 0);
        free(sys.p);
        if (!data) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        hl_status st = gotmpl_exec(p->go, data, false, out, err);
        json_decref(data);
        return st;
    }
    outbuf b = {0}, sys = {0};
    outbuf_add(&b, "", 0);
    outbuf_add(&sys, "", 0);
    /* Ollama collates first: two user messages in a row are one .Prompt */
    json_t *collated = collate(messages, &sys);
    messages = collated;
    outbuf_clear(&sys);
    const char *prompt = "", *response = "";
    bool have_sys = false;
    hl_status st = HL_OK;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = msg_str(m, "role"), *content = msg_str(m, "content");
        bool flush = (!strcmp(role, "system") && (*prompt || *response)) ||
                     (!strcmp(role, "user") && *response);
        if (flush) {
            json_t *data = legacy_data(sys.p, prompt, response, "", think > 0);
            char *part = NULL;
            st = data ? gotmpl_exec(p->go, data, false, &part, err)
                      : hl_fail(err, HL_ERR_NOMEM, "out of memory");
            json_decref(data);
            if (st) break;
            sb_str(&b, part);
            free(part);
            sys.len = 0, sys.p[0] = '\0', have_sys = false;
            prompt = response = "";
        }
        if (!strcmp(role, "system")) {
            if (have_sys) sb_str(&sys, "\n\n");
            sb_str(&sys, content);
            have_sys = true;
        } else if (!strcmp(role, "user")) {
            prompt = content;
        } else if (!strcmp(role, "assistant")) {
            response = content;
        }
    }
    if (!st) {
        json_t *data = legacy_data(sys.p, prompt, response, "", think > 0);
        char *part = NULL;
        st = data ? gotmpl_exec(p->go, data, true, &part, err)
                  : hl_fail(err, HL_ERR_NOMEM, "out of memory");
        json_decref(data);
        if (!st) sb_str(&b, part);
        free(part);
    }
    bool oom = b.oom || sys.oom || !collated;
    json_decref(collated);
    free(sys.p);
    if (st || oom) {
        free(b.p);
        return st ? st : hl_fail(err, HL_ERR_NOMEM, "out of memory");
    }
    *out = b.p;
    return HL_OK;
}

hl_status prompt_render_chat(const prompt_renderer *p, const json_t *messages,
                             const json_t *tools, int think, const char *think_level,
                             char **out, hl_err *err) {
    if (!p->jinja) return render_go_chat(p, messages, tools, think, think_level, out, err);
    json_t *ctx = json_pack("{s:O, s:b, s:s, s:s}", "messages", messages,
                            "add_generation_prompt", 1, "bos_token", p->bos, "eos_token", p->eos);
    if (!ctx) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    if (tools && json_array_size(tools) > 0) json_object_set(ctx, "tools", (json_t *)tools);
    if (think >= 0) json_object_set_new(ctx, "enable_thinking", json_boolean(think > 0));
    if (think > 0 && think_level) json_object_set_new(ctx, "reasoning_effort", json_string(think_level));
    size_t len;
    hl_status st = tmpl_render(p->jinja, ctx, out, &len, err);
    json_decref(ctx);
    return st;
}
