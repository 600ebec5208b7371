/*
 * api_infer.c - /api/generate, /api/chat, /api/embed, /api/embeddings (spec 2.1-2.9).
 *
 * Each handler validates the request on the HTTP thread (400s come back synchronously),
 * resolves the model in the store (404 `model '<x>' not found`) and hands a ctx to
 * srv_stream_run. The producer thread then:
 *   1. answers load/unload requests (empty prompt/messages/input);
 *   2. acquires the model from the loaded-model manager (sched.h: load on first use,
 *      keep_alive);
 *   3. renders the prompt (prompt.h), tokenizes it and runs it through the engine
 *      (engine.h), turning each token into text (tok_stream), then stop strings,
 *      thinking and tool calls (outproc.h), streaming a chunk per piece of text;
 *   4. sends the final chunk with done_reason and the metrics, and releases the model.
 * A client that goes away sets the stream's cancel flag, which the engine polls between
 * tokens. Non-stream requests accumulate text and send one final object.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/file.h"
#include "base/log.h"
#include "server/engine.h"
#include "grammar/grammar.h"
#include "server/internal.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/outproc.h"
#include "server/prompt.h"
#include "server/sched.h"

typedef enum infer_kind { INFER_GENERATE, INFER_CHAT, INFER_EMBED, INFER_EMBEDDINGS } infer_kind;

typedef struct infer_ctx {
    infer_kind kind;
    hl_server *srv;
    store_model sm;
    bool sm_loaded;
    char *req_model;  /* as the client wrote it (echoed in responses) */
    bool compat;      /* an OpenAI/Anthropic request: bad options are the client's 400 */
    int32_t sys_end;  /* chat: where the leading system messages end in the prompt (0: n/a) */
    char full_name[700];
    /* generate */
    char *prompt, *suffix, *system, *template_override;
    bool raw;
    json_t *context;  /* array of ints, or NULL */
    /* chat */
    json_t *messages; /* request messages (validated, roles lower-cased) */
    json_t *tools;    /* NULL when none */
    /* embed */
    json_t *inputs;   /* array of strings */
    bool truncate;
    int32_t dimensions;
    int think;        /* -1 unset, 0 off, 1 on */
    char think_level[8]; /* "low".."max" when think was a string */
    opt_format format;
    bool debug_render;
    infer_opts opts;
    int64_t keep_alive;
    bool stream;
    uint64_t t_start;

    /* generation state (producer thread) */
    srv_stream *s;
    const tok_vocab *vocab;
    tok_stream ts;
    char *piece;
    size_t piece_cap;
    stop_matcher stop;
    bool stopped;
    bool use_think, use_tools;
    think_parser thinkp;
    tool_parser toolp;
    outbuf ready, thinking, content, all_content, all_thinking, tmp;
    int32_t *gen;
    size_t n_gen, cap_gen;
    json_t *tool_calls;
    char *format_text; /* format "json" / a schema as JSON text (engine_request.format) */
    /* _tool_choice (set by the compat APIs): a call is required / of this tool only */
    bool tool_required;
    char *tool_only;
    json_t *logprobs;     /* entries not yet sent (stream) or all of them (non-stream) */
    metrics_model *mm;    /* this model's series in /metrics (NULL: none) */
    uint64_t t_last_tok;  /* when the previous token came (token latency) */
} infer_ctx;

static void infer_free(void *vctx) {
    infer_ctx *c = vctx;
    if (c->sm_loaded) store_model_free(&c->sm);
    free(c->req_model);
    free(c->prompt), free(c->suffix), free(c->system), free(c->template_override);
    json_decref(c->context);
    json_decref(c->messages);
    json_decref(c->tools);
    json_decref(c->inputs);
    opt_free(&c->opts);
    free(c->piece);
    stop_free(&c->stop);
    think_free(&c->thinkp);
    tool_free(&c->toolp);
    outbuf *bufs[] = {&c->ready, &c->thinking, &c->content, &c->all_content, &c->all_thinking,
                      &c->tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) outbuf_free(bufs[i]);
    free(c->gen);
    json_decref(c->tool_calls);
    free(c->format_text);
    free(c->tool_only);
    json_decref(c->logprobs);
    free(c);
}


static const char *obuf(const outbuf *b) { return b->p ? b->p : ""; }

/* ---------------- request validation (HTTP thread) ---------------- */

static bool get_str(srv_err *f, const json_t *req, const char *key, char **out) {
    json_t *v = json_object_get(req, key);
    *out = NULL;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v))
        return srv_err_set(f, 400,
                           "json: cannot unmarshal %s into Go struct field .%s of type string",
                           srv_json_kind(v), key);
    *out = strdup(json_string_value(v));
    return *out != NULL || srv_err_set(f, 500, "out of memory");
}

static bool get_bool(srv_err *f, const json_t *req, const char *key, bool dflt, bool *out) {
    json_t *v = json_object_get(req, key);
    *out = dflt;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v))
        return srv_err_set(f, 400,
                           "json: cannot unmarshal %s into Go struct field .%s of type bool",
                           srv_json_kind(v), key);
    *out = json_is_true(v);
    return true;
}

static bool parse_think(srv_err *f, const json_t *v, int *out, char level[8]) {
    *out = -1;
    level[0] = '\0';
    if (!v || json_is_null(v)) return true;
    if (json_is_boolean(v)) return (*out = json_is_true(v)), true;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "high") || !strcmp(s, "medium") || !strcmp(s, "low") || !strcmp(s, "max")) {
            snprintf(level, 8, "%s", s);
            return (*out = 1), true;
        }
        return srv_err_set(
            f, 400,
            "invalid think value: \"%s\" (must be \"high\", \"medium\", \"low\", \"max\", "
            "true, or false)",
            s);
    }
    return srv_err_set(f, 400,
                       "invalid think value: %s (must be \"high\", \"medium\", \"low\", \"max\", "
                       "true, or false)",
                       srv_json_kind(v));
}

static bool has_images(const json_t *obj) {
    json_t *im = json_object_get(obj, "images");
    return json_is_array(im) && json_array_size(im) > 0;
}

/* Common fields; resolves the model. */
static bool parse_common(srv_err *f, infer_ctx *c, const json_t *req) {
    char *model = NULL;
    if (!get_str(f, req, "model", &model)) return false;
    if (!model || !*model) {
        free(model);
        return srv_err_set(f, 400, "model is required");
    }
    c->req_model = model;
    store_name n;
    if (store_name_parse(model, &n, NULL) != HL_OK)
        return srv_err_set(f, 400, "invalid model name");
    bool found = false;
    hl_err err;
    store_name canon;
    if (!store_find(c->srv->st, &n, &canon))
        return srv_err_set(f, 404, "model '%s' not found", model);
    if (store_model_load(c->srv->st, &canon, &c->sm, &found, &err) != HL_OK)
        return srv_err_set(f, 500, "%s", err.msg);
    if (!found) return srv_err_set(f, 404, "model '%s' not found", model);
    c->sm_loaded = true;
    snprintf(c->full_name, sizeof c->full_name, "%s/%s/%s:%s", c->sm.name.host, c->sm.name.ns,
             c->sm.name.model, c->sm.name.tag);
    if (!c->sm.model_path) return srv_err_set(f, 400, "\"%s\" does not support generate", model);
    if (opt_keep_alive(json_object_get(req, "keep_alive"), &c->keep_alive, &err) != HL_OK)
        return srv_err_set(f, 400, "%s", err.msg);
    if (opt_parse(c->sm.params, json_object_get(req, "options"), c->srv->quiet, &c->opts,
                  &err) != HL_OK)
        /* native: 500 for a bad option value, as Ollama answers; those APIs say 400 */
        return srv_err_set(f, err.code == HL_ERR_FORMAT || (c->compat && err.code != HL_ERR_NOMEM)
                                  ? 400 : 500, "%s", err.msg);
    return true;
}

static bool parse_gen_chat_common(srv_err *f, infer_ctx *c, const json_t *req) {
    hl_err err;
    if (!get_bool(f, req, "stream", true, &c->stream)) return false;
    if (!get_bool(f, req, "truncate", true, &c->truncate)) return false;
    if (!get_bool(f, req, "_debug_render_only", false, &c->debug_render)) return false;
    if (!parse_think(f, json_object_get(req, "think"), &c->think, c->think_level)) return false;
    if (opt_format_parse(json_object_get(req, "format"), &c->format, &err) != HL_OK)
        return srv_err_set(f, 400, "%s", err.msg);
    if (c->format != OPT_FORMAT_NONE) { /* a schema the grammar cannot enforce: 400 now */
        c->format_text = json_dumps(json_object_get(req, "format"), JSON_COMPACT | JSON_ENCODE_ANY);
        gram_schema *gs = NULL;
        if (!c->format_text) return srv_err_set(f, 500, "out of memory");
        if (gram_compile(c->format_text, strlen(c->format_text), &gs, &err) != HL_OK)
            return srv_err_set(f, err.code == HL_ERR_NOMEM ? 500 : 400, "%s", err.msg);
        gram_schema_free(gs);
    }
    json_t *tl = json_object_get(req, "top_logprobs");
    if (tl && !json_is_null(tl) &&
        (!json_is_integer(tl) || json_integer_value(tl) < 0 || json_integer_value(tl) > 20))
        return srv_err_set(f, 400, "top_logprobs must be between 0 and 20");
    bool lp;
    if (!get_bool(f, req, "logprobs", false, &lp)) return false;
    c->opts.sp.logprobs = lp;
    c->opts.sp.top_logprobs = lp && tl ? (int32_t)json_integer_value(tl) : 0;
    return true;
}

static bool parse_generate(srv_err *f, infer_ctx *c, const json_t *req) {
    if (!parse_common(f, c, req) || !parse_gen_chat_common(f, c, req)) return false;
    if (!get_str(f, req, "prompt", &c->prompt) || !get_str(f, req, "suffix", &c->suffix) ||
        !get_str(f, req, "system", &c->system) ||
        !get_str(f, req, "template", &c->template_override) ||
        !get_bool(f, req, "raw", false, &c->raw))
        return false;
    json_t *ctx = json_object_get(req, "context");
    if (ctx && !json_is_null(ctx)) {
        if (!json_is_array(ctx))
            return srv_err_set(f, 400,
                               "json: cannot unmarshal %s into Go struct field .context of type "
                               "[]int",
                               srv_json_kind(ctx));
        size_t i;
        json_t *v;
        json_array_foreach(ctx, i, v) if (!json_is_integer(v)) return srv_err_set(
            f, 400, "json: cannot unmarshal %s into Go struct field .context of type int",
            srv_json_kind(v));
        if (json_array_size(ctx) > 0) c->context = json_incref(ctx);
    }
    if (c->raw && ((c->template_override && *c->template_override) ||
                   (c->system && *c->system) || c->context))
        return srv_err_set(f, 400, "raw mode does not support template, system, or context");
    if (has_images(req)) return srv_err_set(f, 400, "%s does not support vision", c->full_name);
    return true;
}

static bool parse_chat(srv_err *f, infer_ctx *c, const json_t *req) {
    if (!parse_common(f, c, req) || !parse_gen_chat_common(f, c, req)) return false;
    json_t *msgs = json_object_get(req, "messages");
    c->messages = json_array();
    if (!c->messages) return srv_err_set(f, 500, "out of memory");
    if (msgs && !json_is_null(msgs)) {
        if (!json_is_array(msgs))
            return srv_err_set(
                f, 400,
                "json: cannot unmarshal %s into Go struct field ChatRequest.messages "
                "of type []api.Message",
                srv_json_kind(msgs));
        size_t i;
        json_t *m;
        json_array_foreach(msgs, i, m) {
            if (!json_is_object(m))
                return srv_err_set(f, 400,
                                   "json: cannot unmarshal %s into Go struct field "
                                   "ChatRequest.messages of type api.Message",
                                   srv_json_kind(m));
            json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
            if (role && !json_is_string(role))
                return srv_err_set(f, 400,
                                   "json: cannot unmarshal %s into Go struct field Message.role "
                                   "of type string",
                                   srv_json_kind(role));
            if (content && !json_is_null(content) && !json_is_string(content))
                return srv_err_set(f, 400,
                                   "json: cannot unmarshal %s into Go struct field "
                                   "Message.content of type string",
                                   srv_json_kind(content));
            if (has_images(m))
                return srv_err_set(f, 400, "%s does not support vision", c->full_name);
            json_t *copy = json_deep_copy(m);
            if (!copy) return srv_err_set(f, 500, "out of memory");
            char lower[32] = "";
            const char *r = role ? json_string_value(role) : "";
            size_t k = 0;
            for (; r[k] && k < sizeof lower - 1; k++) lower[k] = (char)tolower((unsigned char)r[k]);
            lower[k] = '\0';
            json_object_set_new(copy, "role", json_string(lower));
            if (!content || json_is_null(content)) json_object_set_new(copy, "content", json_string(""));
            json_array_append_new(c->messages, copy);
        }
    }
    json_t *tools = json_object_get(req, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return srv_err_set(f, 400,
                               "json: cannot unmarshal %s into Go struct field ChatRequest.tools "
                               "of type api.Tools",
                               srv_json_kind(tools));
        if (json_array_size(tools) > 0) c->tools = json_incref(tools);
    }
    /* internal: the OpenAI/Anthropic tool_choice, "required" or {"name": tool} */
    json_t *choice = json_object_get(req, "_tool_choice");
    const char *only = json_string_value(json_object_get(choice, "name"));
    c->tool_required = only || (json_is_string(choice) && !strcmp(json_string_value(choice),
                                                                    "required"));
    if (only && !(c->tool_only = strdup(only))) return srv_err_set(f, 500, "out of memory");
    return true;
}

/* ---------------- generation (producer thread) ---------------- */

static bool cancelled_cb(void *ud) { return srv_stream_cancelled(ud); }
static bool ctx_cancelled(void *ud) { return srv_stream_cancelled(((infer_ctx *)ud)->s); }

static void add_metrics(json_t *o, const infer_ctx *c, uint64_t load_ns,
                        const engine_stats *st) {
    json_object_set_new(o, "total_duration", json_integer((json_int_t)(hl_time_ns() - c->t_start)));
    json_object_set_new(o, "load_duration", json_integer((json_int_t)load_ns));
    json_object_set_new(o, "prompt_eval_count", json_integer(st->prompt_eval_count));
    json_object_set_new(o, "prompt_eval_duration", json_integer((json_int_t)st->prompt_eval_ns));
    json_object_set_new(o, "eval_count", json_integer(st->eval_count));
    json_object_set_new(o, "eval_duration", json_integer((json_int_t)st->eval_ns));
    /* prompt tokens restored from the prefix cache: the compat layers' usage reads the
     * private field; native replies carry it as a hearth extension (the web page shows it) */
    json_object_set_new(o, srv_stream_encoded(c->s) ? "_cached_tokens" : "prompt_cached_count",
                        json_integer(st->cached_tokens));
}

/* A response object with model, created_at and the text fields. Text is taken with
 * its length: generated text may contain NUL bytes (a <0x00> token), which JSON carries
 * as \u0000 and a C-string conversion would cut. */
static json_t *chunk_new(const infer_ctx *c, const outbuf *content, const outbuf *thinking,
                         const json_t *tool_calls, bool done) {
    char now[64];
    srv_now(now, sizeof now);
    json_t *o = json_pack("{s:s, s:s}", "model", c->req_model, "created_at", now);
    if (!o) return NULL;
    json_t *text = json_stringn(content ? obuf(content) : "", content ? content->len : 0);
    json_t *think = thinking && thinking->len ? json_stringn(obuf(thinking), thinking->len) : NULL;
    if (!text) text = json_string("");
    if (c->kind == INFER_CHAT) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
        if (think) json_object_set_new(msg, "thinking", think);
        if (tool_calls && json_array_size(tool_calls) > 0)
            json_object_set(msg, "tool_calls", (json_t *)tool_calls);
        json_object_set_new(o, "message", msg);
    } else {
        json_object_set_new(o, "response", text);
        if (think) json_object_set_new(o, "thinking", think);
    }
    json_object_set_new(o, "done", json_boolean(done));
    return o;
}

static void send_load_reply(infer_ctx *c, const char *reason) {
    json_t *o = chunk_new(c, NULL, NULL, NULL, true);
    json_object_set_new(o, "done_reason", json_string(reason));
    srv_stream_send(c->s, o);
}

/* Routes text through thinking and tool parsing into c->thinking / c->content. */
static void process_text(infer_ctx *c, const char *s, size_t n) {
    outbuf *dst = c->use_tools ? &c->tmp : &c->content;
    if (c->use_think) think_feed(&c->thinkp, s, n, &c->thinking, dst);
    else outbuf_add(dst, s, n);
    if (c->use_tools && c->tmp.len) {
        tool_feed(&c->toolp, c->tmp.p, c->tmp.len, &c->content);
        outbuf_clear(&c->tmp);
    }
}

static void emit_pending(infer_ctx *c) {
    if (c->thinking.len == 0 && c->content.len == 0) return;
    if (c->stream) {
        json_t *o = chunk_new(c, &c->content, &c->thinking, NULL, false);
        if (o && c->logprobs && json_array_size(c->logprobs) > 0) {
            json_object_set_new(o, "logprobs", c->logprobs);
            c->logprobs = json_array();
        }
        srv_stream_send(c->s, o);
    } else {
        outbuf_add(&c->all_content, c->content.p ? c->content.p : "", c->content.len);
        outbuf_add(&c->all_thinking, c->thinking.p ? c->thinking.p : "", c->thinking.len);
    }
    outbuf_clear(&c->content);
    outbuf_clear(&c->thinking);
}

static json_t *piece_json(const infer_ctx *c, int32_t token) {
    char buf[256];
    int32_t n = tok_token_to_piece(c->vocab, token, true, buf, sizeof buf);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof buf) n = (int32_t)sizeof buf;
    /* a piece may be part of a UTF-8 sequence: keep the JSON valid */
    json_t *s = json_stringn(buf, (size_t)n);
    if (!s) s = json_string("\xef\xbf\xbd");
    return s ? s : json_string("");
}

static void add_logprob(infer_ctx *c, int32_t token, const sampler_out *so) {
    if (!c->logprobs) c->logprobs = json_array();
    json_t *e = json_pack("{s:o, s:f}", "token", piece_json(c, token), "logprob", (double)so->logprob);
    if (!e) return;
    if (so->n_top > 0) {
        json_t *top = json_array();
        for (int32_t i = 0; i < so->n_top; i++)
            json_array_append_new(top, json_pack("{s:o, s:f}", "token",
                                                 piece_json(c, so->top_tokens[i]), "logprob",
                                                 (double)so->top_logprobs[i]));
        json_object_set_new(e, "top_logprobs", top);
    }
    json_array_append_new(c->logprobs, e);
}

static bool on_token(void *ud, int32_t token, const sampler_out *so) {
    infer_ctx *c = ud;
    uint64_t now = hl_time_ns();
    if (c->n_gen == 0) metrics_ttft(c->mm, now - c->t_start);
    else metrics_token_latency(c->mm, now - c->t_last_tok);
    c->t_last_tok = now;
    if (so && c->opts.sp.logprobs) add_logprob(c, token, so);
    if (c->n_gen == c->cap_gen) {
        size_t cap = c->cap_gen ? c->cap_gen * 2 : 256;
        int32_t *g = realloc(c->gen, cap * sizeof *g);
        if (!g) return true;
        c->gen = g;
        c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = token;
    int32_t n = tok_stream_push(&c->ts, token, c->piece, c->piece_cap);
    if (n <= 0) return false;
    outbuf_clear(&c->ready);
    c->stopped = stop_feed(&c->stop, c->piece, (size_t)n, &c->ready);
    if (c->ready.len) process_text(c, c->ready.p, c->ready.len);
    emit_pending(c);
    return c->stopped;
}

static hl_status tokenize(const tok_vocab *v, const char *text, bool add_special, int32_t **out,
                          size_t *n_out, hl_err *err) {
    size_t len = strlen(text), cap = len + 8, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    hl_status st = tok_encode(v, text, len, add_special, true, ids, cap, &n, err);
    if (!st && n > cap) {
        int32_t *b = realloc(ids, n * sizeof *ids);
        if (!b) st = hl_fail(err, HL_ERR_NOMEM, "out of memory");
        else {
            ids = b;
            cap = n;
            st = tok_encode(v, text, len, add_special, true, ids, cap, &n, err);
        }
    }
    if (st) {
        free(ids);
        return st;
    }
    *out = ids;
    *n_out = n;
    return HL_OK;
}

/* Tokenizes a rendered prompt: BOS as the vocab says, unless the text already starts
 * with it (templates that write bos_token). */
static hl_status tokenize_prompt(const tok_vocab *v, const char *text, bool add_special,
                                 int32_t **out, size_t *n_out, hl_err *err) {
    int32_t bos = tok_vocab_special(v, TOK_SPECIAL_BOS);
    if (add_special && bos >= 0) {
        size_t bl = 0;
        const char *bt = tok_token_text(v, bos, &bl);
        if (bt && bl > 0 && strncmp(text, bt, bl) == 0) add_special = false;
    }
    return tokenize(v, text, add_special, out, n_out, err);
}

/* messages for generate: system, the Modelfile's MESSAGEs (unless context), user. */
static json_t *generate_messages(const infer_ctx *c) {
    json_t *msgs = json_array();
    const char *sys = c->system && *c->system ? c->system : c->sm.system;
    if (sys && *sys) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", sys));
    if (!c->context) {
        size_t i;
        json_t *m;
        json_array_foreach(c->sm.messages, i, m) json_array_append(msgs, m);
    }
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                                          c->prompt ? c->prompt : ""));
    return msgs;
}

/* messages for chat: Modelfile MESSAGEs and SYSTEM, then the request's. */
static json_t *chat_messages(const infer_ctx *c) {
    json_t *msgs = json_array();
    json_t *first = json_array_get(c->messages, 0);
    const char *r0 = json_string_value(json_object_get(first, "role"));
    if (c->sm.system && *c->sm.system && !(r0 && !strcmp(r0, "system")))
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", c->sm.system));
    size_t i;
    json_t *m;
    json_array_foreach(c->sm.messages, i, m) json_array_append(msgs, m);
    json_array_foreach(c->messages, i, m) json_array_append(msgs, m);
    return msgs;
}

static bool fail_status(infer_ctx *c, hl_status st, const hl_err *err) {
    if (st == HL_ERR_CANCELLED) return false; /* client gone: nothing to say */
    unsigned code = st == HL_ERR_KV_FULL || st == HL_ERR_INVALID ? 400
                    : st == HL_ERR_BUSY                        ? 503
                                                               : 500;
    srv_stream_fail(c->s, code, "%s", err->msg);
    return false;
}

/* Where a chat's leading system messages end in its prompt tokens: the common prefix of
 * the prompt with the rendering of those messages alone (0: no system message, nothing
 * after them, or an error). A model with a recurrent state snapshots there
 * (engine_request.snapshot_at), so the next conversation with the same system prompt
 * restores it instead of recomputing it. */
static int32_t system_prompt_end(const prompt_renderer *pr, const json_t *msgs,
                                 const json_t *tools, int think, const char *level,
                                 const tok_vocab *v, const int32_t *toks, size_t n_toks) {
    size_t k = 0;
    const size_t n_msgs = json_array_size(msgs);
    while (k < n_msgs) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
        if (!role || strcmp(role, "system") != 0) break;
        k++;
    }
    if (k == 0 || k == n_msgs) return 0;
    json_t *sys = json_array();
    for (size_t i = 0; sys && i < k; i++) json_array_append(sys, json_array_get(msgs, i));
    char *text = NULL;
    int32_t *st = NULL;
    size_t n_st = 0, common = 0;
    hl_err err;
    if (sys && prompt_render_chat(pr, sys, tools, think, level, &text, &err) == HL_OK &&
        tokenize_prompt(v, text, true, &st, &n_st, &err) == HL_OK)
        while (common < n_st && common < n_toks && st[common] == toks[common]) common++;
    free(text);
    free(st);
    json_decref(sys);
    return common < n_toks && common <= INT32_MAX ? (int32_t)common : 0;
}

/* Builds the prompt tokens; false after reporting an error. */
static bool build_prompt(infer_ctx *c, const prompt_renderer *pr, int32_t n_ctx, int32_t **toks,
                         size_t *n_toks, char **rendered_out) {
    hl_err err;
    hl_status st;
    char *text = NULL;
    const tok_vocab *v = c->vocab;
    /* think: true is level "medium" where a template wants one (spec 2.4) */
    const char *level = c->think_level[0] ? c->think_level : c->think > 0 ? "medium" : NULL;
    if (c->kind == INFER_GENERATE) {
        if (c->raw) {
            text = strdup(c->prompt ? c->prompt : "");
            if (!text) st = hl_fail(&err, HL_ERR_NOMEM, "out of memory");
            else st = HL_OK;
        } else if ((c->suffix && *c->suffix) || (c->template_override && *c->template_override)) {
            const char *tpl = c->template_override && *c->template_override ? c->template_override
                                                                            : c->sm.template_text;
            const char *sys = c->system && *c->system ? c->system : c->sm.system;
            if (!tpl || strstr(tpl, "{%")) tpl = "{{ .Prompt }}";
            st = prompt_render_go(tpl, sys ? sys : "", c->prompt ? c->prompt : "",
                                  c->suffix ? c->suffix : "", &text, &err);
            if (st == HL_ERR_UNSUPPORTED || st == HL_ERR_FORMAT) {
                srv_stream_fail(c->s, 500, "%s", err.msg);
                return false;
            }
        } else {
            json_t *msgs = generate_messages(c);
            st = prompt_render_chat(pr, msgs, NULL, c->use_think ? 1 : c->think, level, &text,
                                    &err);
            json_decref(msgs);
        }
        if (st) {
            srv_stream_fail(c->s, 500, "%s", err.msg);
            return false;
        }
        if (c->context) {
            size_t nc = json_array_size(c->context), nt = 0;
            int32_t *t = NULL;
            st = tokenize(v, text, false, &t, &nt, &err);
            int32_t *all = st ? NULL : malloc((nc + nt + 1) * sizeof *all);
            if (!st && !all) st = hl_fail(&err, HL_ERR_NOMEM, "out of memory");
            for (size_t i = 0; !st && i < nc; i++) {
                json_int_t id = json_integer_value(json_array_get(c->context, i));
                if (id < 0 || id >= tok_vocab_n_tokens(v))
                    st = hl_fail(&err, HL_ERR_INVALID, "context token %lld is out of range",
                                 (long long)id);
                else
                    all[i] = (int32_t)id;
            }
            if (!st) memcpy(all + nc, t, nt * sizeof *t);
            free(t);
            if (st) {
                free(all);
                free(text);
                return fail_status(c, st, &err);
            }
            *toks = all;
            *n_toks = nc + nt;
        } else {
            st = tokenize_prompt(v, text, true, toks, n_toks, &err);
        }
    } else {
        json_t *msgs = chat_messages(c);
        int think = c->use_think ? 1 : c->think;
        st = prompt_render_chat(pr, msgs, c->tools, think, level, &text, &err);
        if (!st) st = tokenize_prompt(v, text, true, toks, n_toks, &err);
        /* truncate: drop the oldest non-system messages until the prompt fits */
        size_t n_msgs = json_array_size(msgs);
        for (size_t drop = 1; !st && c->truncate && *n_toks >= (size_t)n_ctx && drop < n_msgs;
             drop++) {
            json_t *cut = json_array();
            for (size_t i = 0; i < n_msgs; i++) {
                json_t *m = json_array_get(msgs, i);
                const char *role = json_string_value(json_object_get(m, "role"));
                if (i >= drop || (role && !strcmp(role, "system"))) json_array_append(cut, m);
            }
            char *t2 = NULL;
            int32_t *k2 = NULL;
            size_t n2 = 0;
            if (prompt_render_chat(pr, cut, c->tools, think, level, &t2, &err) == HL_OK &&
                tokenize_prompt(v, t2, true, &k2, &n2, &err) == HL_OK) {
                free(text), free(*toks);
                text = t2, *toks = k2, *n_toks = n2;
            } else {
                free(t2);
            }
            json_decref(cut);
        }
        if (!st) c->sys_end = system_prompt_end(pr, msgs, c->tools, think, level, v, *toks, *n_toks);
        json_decref(msgs);
        if (st) {
            free(text);
            srv_stream_fail(c->s, st == HL_ERR_INVALID ? 400 : 500, "%s", err.msg);
            return false;
        }
    }
    if (st) {
        free(text);
        return fail_status(c, st, &err);
    }
    if (*n_toks == 0) { /* an empty prompt starts from BOS */
        int32_t bos = tok_vocab_special(v, TOK_SPECIAL_BOS);
        if (bos < 0) {
            free(text);
            free(*toks);
            srv_stream_fail(c->s, 400, "empty prompt");
            return false;
        }
        (*toks)[(*n_toks)++] = bos; /* tokenize always allocates room */
    }
    *rendered_out = text;
    return true;
}

static void run_generation(infer_ctx *c, sched_model *m, uint64_t load_ns) {
    hl_err err;
    prompt_renderer *pr = NULL;
    int32_t *toks = NULL;
    size_t n_toks = 0;
    char *rendered = NULL;
    c->vocab = engine_vocab(m->eng);
    if (prompt_renderer_create(c->sm.template_text, engine_chat_template(m->eng), c->vocab, &pr,
                               &err) != HL_OK) {
        srv_stream_fail(c->s, 500, "%s", err.msg);
        return;
    }
    prompt_caps caps = prompt_renderer_caps(pr);
    /* capabilities (Ollama's messages) */
    if (c->think > 0 && !caps.thinking) {
        srv_stream_fail(c->s, 400, "\"%s\" does not support thinking", c->req_model);
        goto out;
    }
    if (c->tools && !caps.tools) {
        srv_stream_fail(c->s, 400, "%s does not support tools", c->full_name);
        goto out;
    }
    if (c->kind == INFER_GENERATE && c->suffix && *c->suffix && !c->raw) {
        const char *tpl = c->template_override && *c->template_override ? c->template_override
                                                                        : c->sm.template_text;
        if (!tpl || strstr(tpl, "{%") || !prompt_go_uses_suffix(tpl)) {
            srv_stream_fail(c->s, 400, "%s does not support insert", c->full_name);
            goto out;
        }
    }
    c->use_think = caps.thinking && c->think != 0 && !c->raw;
    c->use_tools = c->tools != NULL;
    if (!build_prompt(c, pr, m->info.n_ctx, &toks, &n_toks, &rendered)) goto out;
    if (c->debug_render) {
        char now[64];
        srv_now(now, sizeof now);
        json_t *dbg = json_pack("{s:s, s:s, s:{s:s, s:i}}", "model", c->req_model,
                                "created_at", now, "_debug_info", "rendered_template",
                                rendered, "image_count", 0);
        if (srv_stream_encoded(c->s)) /* count_tokens */
            json_object_set_new(dbg, "_prompt_tokens", json_integer((json_int_t)n_toks));
        srv_stream_send(c->s, dbg);
        goto out;
    }

    /* decoding state */
    c->piece_cap = 64;
    for (int32_t id = 0; id < tok_vocab_n_tokens(c->vocab); id++) {
        int32_t len = tok_token_to_piece(c->vocab, id, true, NULL, 0);
        if (len > 0 && (size_t)len + 64 > c->piece_cap) c->piece_cap = (size_t)len + 64;
    }
    c->piece = malloc(c->piece_cap);
    c->tool_calls = json_array();
    if (!c->piece || !c->tool_calls) {
        srv_stream_fail(c->s, 500, "out of memory");
        goto out;
    }
    int32_t bos = tok_vocab_special(c->vocab, TOK_SPECIAL_BOS);
    /* special tokens are rendered (as Ollama's runner does) so that stop strings such as
     * "<|im_end|>" can match them; end-of-generation tokens never reach the text */
    tok_stream_init(&c->ts, c->vocab, true, bos >= 0 && toks[n_toks - 1] == bos);
    stop_init(&c->stop, c->opts.stop, c->opts.n_stop);
    bool prompt_in_think = false;
    if (c->use_think) {
        size_t rl = strlen(rendered);
        while (rl > 0 && isspace((unsigned char)rendered[rl - 1])) rl--;
        bool in_think = rl >= 7 && memcmp(rendered + rl - 7, "<think>", 7) == 0;
        think_init(&c->thinkp, "<think>", "</think>", in_think);
        prompt_in_think = in_think;
    }
    if (c->use_tools) tool_init(&c->toolp, prompt_tool_tag(pr), c->tools);

    /* the format applies to the answer: after the thinking part (the think parser's tags);
     * tool calls are free text the tool parser reads, so a format does not apply to them */
    bool constrain = c->format != OPT_FORMAT_NONE && !c->use_tools;
    /* with tools (and no format), a lazy grammar holds each tool call the model opens to
     * the tools' names and parameter schemas (outproc.h) */
    const char *trigger = NULL, *trigger_end = NULL;
    if (c->use_tools && c->format == OPT_FORMAT_NONE) {
        free(c->format_text);
        c->format_text = tool_grammar(c->tools, prompt_tool_tag(pr), c->tool_only, &trigger,
                                      &trigger_end);
        constrain = c->format_text != NULL;
    }
    engine_request req = {.prompt = toks, .n_prompt = n_toks, .sp = c->opts.sp,
                          .num_predict = c->opts.num_predict, .on_token = on_token,
                          .cancelled = ctx_cancelled,
                          .format = constrain ? c->format_text : NULL,
                          .trigger = constrain ? trigger : NULL,
                          .trigger_end = constrain ? trigger_end : NULL,
                          .trigger_now = constrain && trigger && c->tool_required,
                          .think_open = constrain && c->use_think ? "<think>" : NULL,
                          .think_close = constrain && c->use_think ? "</think>" : NULL,
                          .in_think = constrain && c->use_think && prompt_in_think, .ud = c,
                          .snapshot_at = c->sys_end > 0 ? &c->sys_end : NULL,
                          .n_snapshot_at = c->sys_end > 0};
    engine_stats stats;
    c->mm = metrics_model_get(c->srv->metrics, m->name);
    hl_status st = engine_generate(m->eng, &req, &stats, &err);
    /* a failed or cancelled run has no prompt figures, its tokens were generated still */
    if (st)
        metrics_tokens(c->mm, 0, 0, c->n_gen);
    else
        metrics_tokens(c->mm, (uint64_t)stats.prompt_eval_count, (uint64_t)stats.cached_tokens,
                       c->n_gen);
    if (hl_log_enabled(HL_LOG_DEBUG)) {
        char np[16], nc[16], ng[16], ms[32];
        snprintf(np, sizeof np, "%d", (int)n_toks);
        snprintf(nc, sizeof nc, "%d", st ? 0 : (int)stats.cached_tokens);
        snprintf(ng, sizeof ng, "%zu", c->n_gen);
        snprintf(ms, sizeof ms, "%.3fms", (double)(hl_time_ns() - c->t_start) / 1e6);
        HL_LOG_ATTRS(HL_LOG_DEBUG, "generation", "model", m->name, "prompt_tokens", np, "cached", nc,
                     "generated", ng, "duration", ms, "status", st ? hl_status_str(st) : "ok");
    }
    if (st == HL_ERR_CANCELLED || srv_stream_cancelled(c->s)) goto out;
    if (st) {
        fail_status(c, st, &err);
        goto out;
    }
    /* flush everything held back */
    if (!c->stopped) {
        int32_t n = tok_stream_flush(&c->ts, c->piece, c->piece_cap);
        outbuf_clear(&c->ready);
        if (n > 0) c->stopped = stop_feed(&c->stop, c->piece, (size_t)n, &c->ready);
        if (!c->stopped) stop_flush(&c->stop, &c->ready);
        if (c->ready.len) process_text(c, c->ready.p, c->ready.len);
    }
    if (c->use_think) {
        outbuf *dst = c->use_tools ? &c->tmp : &c->content;
        think_flush(&c->thinkp, &c->thinking, dst);
        if (c->use_tools && c->tmp.len) {
            tool_feed(&c->toolp, c->tmp.p, c->tmp.len, &c->content);
            outbuf_clear(&c->tmp);
        }
    }
    if (c->use_tools) tool_flush(&c->toolp, c->tool_calls, &c->content);
    if (!c->stream) {
        emit_pending(c);
        outbuf_add(&c->content, obuf(&c->all_content), c->all_content.len);
        outbuf_add(&c->thinking, obuf(&c->all_thinking), c->all_thinking.len);
    }
    json_t *fin = chunk_new(c, &c->content, &c->thinking, c->tool_calls, true);
    json_object_set_new(fin, "done_reason",
                        json_string(stats.done == ENGINE_DONE_LENGTH ? "length" : "stop"));
    if (c->kind == INFER_GENERATE && !c->raw) {
        json_t *ctxa = json_array();
        for (size_t i = 0; i < n_toks; i++) json_array_append_new(ctxa, json_integer(toks[i]));
        for (size_t i = 0; i < c->n_gen; i++) json_array_append_new(ctxa, json_integer(c->gen[i]));
        json_object_set_new(fin, "context", ctxa);
    }
    if (c->logprobs && json_array_size(c->logprobs) > 0) json_object_set(fin, "logprobs", c->logprobs);
    add_metrics(fin, c, load_ns, &stats);
    srv_stream_send(c->s, fin);
out:
    free(toks);
    free(rendered);
    prompt_renderer_free(pr);
}

static bool load_only(const infer_ctx *c) {
    if (c->kind == INFER_GENERATE) return !c->prompt || !*c->prompt;
    if (c->kind == INFER_CHAT) return json_array_size(c->messages) == 0;
    return false;
}

static bool acquire(infer_ctx *c, sched_model **m, uint64_t *load_ns) {
    hl_err err;
    if (access(c->sm.model_path, R_OK) != 0) {
        srv_stream_fail(c->s, 404, "model \"%s\" not found, try pulling it first", c->req_model);
        return false;
    }
    hl_status st = sched_acquire(c->srv->sched, &c->sm, &c->opts.load, c->keep_alive,
                                 cancelled_cb, c->s, m, load_ns, &err);
    if (st) {
        if (st != HL_ERR_CANCELLED && access(c->sm.model_path, R_OK) != 0) /* deleted meanwhile */
            srv_stream_fail(c->s, 404, "model \"%s\" not found, try pulling it first", c->req_model);
        else if (st != HL_ERR_CANCELLED)
            srv_stream_fail(c->s, 500, "%s", err.msg);
        return false;
    }
    return true;
}

static void infer_run(srv_stream *s, void *vctx) {
    infer_ctx *c = vctx;
    c->s = s;
    if (load_only(c) && c->keep_alive == 0) {
        sched_expire(c->srv->sched, &c->sm.name);
        send_load_reply(c, "unload");
        return;
    }
    sched_model *m;
    uint64_t load_ns;
    if (!acquire(c, &m, &load_ns)) return;
    if (m->info.embedding_only) /* Ollama's answer for a model without completion */
        srv_stream_fail(s, 400, "\"%s\" does not support %s", c->req_model,
                        c->kind == INFER_CHAT ? "chat" : "generate");
    else if (load_only(c))
        send_load_reply(c, "load");
    else
        run_generation(c, m, load_ns);
    sched_release(c->srv->sched, m, c->keep_alive);
}

static enum MHD_Result start_req(srv_request *r, json_t *req, infer_kind kind,
                                 bool (*parse)(srv_err *, infer_ctx *, const json_t *)) {
    infer_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(req);
        return srv_reply_error(r, 500, "out of memory");
    }
    c->kind = kind;
    c->srv = r->srv;
    c->compat = r->enc != NULL;
    c->t_start = hl_time_ns();
    c->think = -1;
    c->truncate = true;
    c->stream = true;
    srv_err f = {0};
    bool ok = parse(&f, c, req);
    json_decref(req);
    if (!ok) {
        infer_free(c);
        return srv_reply_error(r, f.status, "%s", f.msg);
    }
    return srv_stream_run(r, c->stream, infer_run, c, infer_free);
}

static enum MHD_Result start(srv_request *r, infer_kind kind,
                             bool (*parse)(srv_err *, infer_ctx *, const json_t *)) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    return start_req(r, req, kind, parse);
}

enum MHD_Result srv_handle_generate(srv_request *r) {
    return start(r, INFER_GENERATE, parse_generate);
}

enum MHD_Result srv_handle_chat(srv_request *r) { return start(r, INFER_CHAT, parse_chat); }

/* ---------------- embeddings ---------------- */

static bool parse_embed(srv_err *f, infer_ctx *c, const json_t *req) {
    if (!parse_common(f, c, req)) return false;
    c->stream = false;
    if (!get_bool(f, req, "truncate", true, &c->truncate)) return false;
    json_t *in = json_object_get(req, c->kind == INFER_EMBED ? "input" : "prompt");
    c->inputs = json_array();
    if (c->kind == INFER_EMBED) {
        if (json_is_string(in)) {
            if (*json_string_value(in)) json_array_append(c->inputs, in);
        } else if (json_is_array(in)) {
            size_t i;
            json_t *v;
            json_array_foreach(in, i, v) {
                if (!json_is_string(v)) return srv_err_set(f, 400, "invalid input type");
                json_array_append(c->inputs, v);
            }
        } else if (in && !json_is_null(in)) {
            return srv_err_set(f, 400, "invalid input type");
        }
        json_t *d = json_object_get(req, "dimensions");
        if (d && !json_is_null(d)) {
            if (!json_is_integer(d))
                return srv_err_set(f, 400,
                                   "json: cannot unmarshal %s into Go struct field "
                                   "EmbedRequest.dimensions of type int",
                                   srv_json_kind(d));
            json_int_t dv = json_integer_value(d);
            c->dimensions = dv > INT32_MAX ? INT32_MAX : dv < 0 ? -1 : (int32_t)dv;
        }
    } else {
        if (in && !json_is_null(in) && !json_is_string(in))
            return srv_err_set(f, 400,
                               "json: cannot unmarshal %s into Go struct field "
                               "EmbeddingRequest.prompt of type string",
                               srv_json_kind(in));
        if (json_is_string(in) && *json_string_value(in)) json_array_append(c->inputs, in);
    }
    return true;
}

static bool parse_embed_new(srv_err *f, infer_ctx *c, const json_t *req) {
    c->kind = INFER_EMBED;
    return parse_embed(f, c, req);
}

static bool parse_embeddings(srv_err *f, infer_ctx *c, const json_t *req) {
    c->kind = INFER_EMBEDDINGS;
    return parse_embed(f, c, req);
}

/* float32 values, printed as float32 would be (shortest-ish, no double noise) */
static json_t *float_json(float v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)v);
    return json_real(strtod(buf, NULL));
}

static void embed_run(srv_stream *s, void *vctx) {
    infer_ctx *c = vctx;
    c->s = s;
    hl_err err;
    sched_model *m;
    uint64_t load_ns;
    bool legacy = c->kind == INFER_EMBEDDINGS;
    /* legacy errors are 500 (spec 2.9), except a missing model file */
    if (!acquire(c, &m, &load_ns)) return;
    const tok_vocab *v = engine_vocab(m->eng);
    int32_t E = m->info.n_embd, n_ctx = m->info.n_ctx;
    float *vec = malloc((size_t)E * sizeof *vec);
    json_t *out = json_array();
    int64_t total_tokens = 0;
    hl_status st = vec && out ? HL_OK : hl_fail(&err, HL_ERR_NOMEM, "out of memory");
    unsigned code = legacy ? 500 : 400;
    size_t i;
    json_t *in;
    json_array_foreach(c->inputs, i, in) {
        if (st || srv_stream_cancelled(s)) break;
        int32_t *toks = NULL;
        size_t n = 0;
        st = tokenize(v, json_string_value(in), true, &toks, &n, &err);
        if (st) break;
        if (n > (size_t)n_ctx) {
            if (!c->truncate) {
                st = hl_fail(&err, HL_ERR_INVALID, "the input length exceeds the context length");
                free(toks);
                break;
            }
            n = (size_t)n_ctx;
        }
        if (n == 0) {
            free(toks);
            st = hl_fail(&err, HL_ERR_INVALID, "cannot embed an empty input");
            break;
        }
        st = engine_embed(m->eng, toks, n, vec, &err);
        free(toks);
        if (st) break;
        total_tokens += (int64_t)n;
        int32_t dim = E;
        if (!legacy && c->dimensions > 0 && c->dimensions < E) dim = c->dimensions;
        double norm = 0;
        for (int32_t k = 0; k < dim; k++) {
            if (!isfinite(vec[k])) {
                st = hl_fail(&err, HL_ERR_INVALID, "embedding contains NaN or Inf values");
                code = 500;
                break;
            }
            norm += (double)vec[k] * (double)vec[k];
        }
        if (st) break;
        norm = sqrt(norm);
        json_t *row = json_array();
        for (int32_t k = 0; k < dim; k++) {
            if (legacy) json_array_append_new(row, json_real((double)vec[k]));
            else json_array_append_new(row, float_json(norm > 0 ? (float)(vec[k] / norm) : 0.0f));
        }
        json_array_append_new(out, row);
    }
    free(vec);
    metrics_tokens(metrics_model_get(c->srv->metrics, m->name), (uint64_t)total_tokens, 0, 0);
    sched_release(c->srv->sched, m, c->keep_alive);
    if (srv_stream_cancelled(s)) st = HL_ERR_CANCELLED;
    if (st) {
        json_decref(out);
        if (st != HL_ERR_CANCELLED)
            srv_stream_fail(s, st == HL_ERR_NOMEM ? 500 : code, "%s", err.msg);
        return;
    }
    if (legacy) {
        json_t *e = json_array_size(out) ? json_incref(json_array_get(out, 0)) : json_array();
        json_decref(out);
        srv_stream_send(s, json_pack("{s:o}", "embedding", e));
        return;
    }
    srv_stream_send(s, json_pack("{s:s, s:o, s:I, s:I, s:I}", "model", c->req_model,
                                 "embeddings", out, "total_duration",
                                 (json_int_t)(hl_time_ns() - c->t_start), "load_duration",
                                 (json_int_t)load_ns, "prompt_eval_count",
                                 (json_int_t)total_tokens));
}

static enum MHD_Result start_embed_parsed(srv_request *r, json_t *req,
                                          bool (*parse)(srv_err *, infer_ctx *, const json_t *)) {
    infer_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        json_decref(req);
        return srv_reply_error(r, 500, "out of memory");
    }
    c->srv = r->srv;
    c->compat = r->enc != NULL;
    c->t_start = hl_time_ns();
    c->truncate = true;
    srv_err f = {0};
    bool ok = parse(&f, c, req);
    json_decref(req);
    if (!ok) {
        infer_free(c);
        return srv_reply_error(r, f.status, "%s", f.msg);
    }
    return srv_stream_run(r, false, embed_run, c, infer_free);
}

static enum MHD_Result start_embed(srv_request *r,
                                   bool (*parse)(srv_err *, infer_ctx *, const json_t *)) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    return start_embed_parsed(r, req, parse);
}

static enum MHD_Result start_embed_req(srv_request *r, json_t *req) {
    return start_embed_parsed(r, req, parse_embed_new);
}

enum MHD_Result srv_handle_embed(srv_request *r) { return start_embed(r, parse_embed_new); }
enum MHD_Result srv_handle_embeddings(srv_request *r) { return start_embed(r, parse_embeddings); }

enum MHD_Result srv_native_run(srv_request *r, srv_native which, json_t *req) {
    if (which == SRV_NATIVE_EMBED) return start_embed_req(r, req);
    return start_req(r, req, which == SRV_NATIVE_CHAT ? INFER_CHAT : INFER_GENERATE,
                     which == SRV_NATIVE_CHAT ? parse_chat : parse_generate);
}
