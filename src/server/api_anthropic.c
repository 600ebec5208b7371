/*
 * api_anthropic.c - the Anthropic Messages API (spec section 4): /v1/messages and
 * /v1/messages/count_tokens.
 *
 * A request becomes a native /api/chat request (system as a string or text blocks
 * concatenated without separator, text / tool_use / tool_result / thinking blocks,
 * max_tokens -> num_predict, stop_sequences -> stop) and an anth_enc re-encodes the
 * native output: one message object, or the SSE events message_start,
 * content_block_start / _delta / _stop (thinking, then text, then tool_use blocks),
 * message_delta and message_stop. Errors are {"type":"error","error":{"type","message"},
 * "request_id"}, also as an `event: error` frame mid-stream.
 *
 * Usage follows Anthropic's accounting: input_tokens counts the prompt tokens that were
 * not read from the prefix cache, cache_read_input_tokens those that were (their sum
 * is the prompt length); cache_creation_input_tokens is always 0.
 *
 * Claude Code's `x-anthropic-billing-header: ...` system-prompt line differs on every
 * request; it is removed before the prompt is rendered (compat_strip_billing_header),
 * so a repeated Claude Code turn hits the prefix cache.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/compat.h"

typedef struct anth_enc {
    srv_encoder base; /* first */
    char id[32];       /* msg_<24 hex> */
    char req_id[32];   /* req_<24 hex> */
    json_int_t input_estimate;
    bool started;
    int next_index;
    int open_kind; /* 0 none, 1 thinking, 2 text */
    bool count_only;
} anth_enc;

static const char *error_type(unsigned status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return "api_error";
    }
}

static json_t *enc_error_body(srv_encoder *e, unsigned status, const char *msg) {
    anth_enc *a = (anth_enc *)e;
    return json_pack("{s:s, s:{s:s, s:s}, s:s}", "type", "error", "error", "type",
                     error_type(status), "message", msg, "request_id", a->req_id);
}

static char *enc_error_frame(srv_encoder *e, unsigned status, const char *msg) {
    json_t *body = enc_error_body(e, status, msg);
    json_object_del(body, "request_id");
    return compat_sse_event("error", body);
}

static void enc_destroy(srv_encoder *e) { free(e); }

static const char *stop_reason(const json_t *fin, bool tool_use) {
    if (tool_use) return "tool_use";
    const char *r = json_string_value(json_object_get(fin, "done_reason"));
    if (!r || !*r || !strcmp(r, "stop")) return "end_turn";
    if (!strcmp(r, "length")) return "max_tokens";
    return "stop_sequence";
}

static json_t *usage_obj(const json_t *fin) {
    json_int_t p = json_integer_value(json_object_get(fin, "prompt_eval_count"));
    json_int_t cached = json_integer_value(json_object_get(fin, "_cached_tokens"));
    if (cached > p) cached = p;
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", p - cached, "output_tokens",
                     json_integer_value(json_object_get(fin, "eval_count")),
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
                     cached);
}

/* A new reference: v when it is an object, else {}. */
static json_t *object_or_empty(json_t *v) { return json_is_object(v) ? json_incref(v) : json_object(); }

static json_t *tool_use_block(const json_t *tc) {
    json_t *fn = json_object_get(tc, "function");
    const char *id = json_string_value(json_object_get(tc, "id"));
    char idbuf[40];
    if (!id) {
        strcpy(idbuf, "toolu_");
        compat_random_hex(idbuf + 6, 24);
        id = idbuf;
    }
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *args = json_object_get(fn, "arguments");
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                     name ? name : "", "input", object_or_empty(args));
}

static char *close_block(anth_enc *a) {
    if (!a->open_kind) return NULL;
    a->open_kind = 0;
    return compat_sse_event("content_block_stop", json_pack("{s:s, s:i}", "type",
                                                            "content_block_stop", "index",
                                                            a->next_index++));
}

/* Opens a block of kind (1 thinking, 2 text) unless it is the open one. */
static char *open_block(anth_enc *a, int kind) {
    if (a->open_kind == kind) return NULL;
    char *out = close_block(a);
    a->open_kind = kind;
    json_t *cb = kind == 1 ? json_pack("{s:s, s:s}", "type", "thinking", "thinking", "")
                           : json_pack("{s:s, s:s}", "type", "text", "text", "");
    return compat_cat(out, compat_sse_event("content_block_start",
                                            json_pack("{s:s, s:i, s:o}", "type",
                                                      "content_block_start", "index",
                                                      a->next_index, "content_block", cb)));
}

static char *delta(anth_enc *a, json_t *d) {
    return compat_sse_event("content_block_delta", json_pack("{s:s, s:i, s:o}", "type",
                                                             "content_block_delta", "index",
                                                             a->next_index, "delta", d));
}

static char *messages_frame(srv_encoder *e, json_t *chunk) {
    anth_enc *a = (anth_enc *)e;
    if (json_object_get(chunk, "_debug_info")) return compat_sse_data(chunk);
    char *out = NULL;
    const char *model = json_string_value(json_object_get(chunk, "model"));
    if (!a->started) {
        a->started = true;
        json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:I, s:i}}", "id", a->id,
                                "type", "message", "role", "assistant", "model", model ? model : "",
                                "content", "stop_reason", "stop_sequence", "usage", "input_tokens",
                                a->input_estimate, "output_tokens", 0);
        out = compat_sse_event("message_start",
                               json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
    }
    json_t *m = json_object_get(chunk, "message");
    if (compat_text_len(m, "thinking") > 0) {
        out = compat_cat(out, open_block(a, 1));
        out = compat_cat(out, delta(a, json_pack("{s:s, s:o}", "type", "thinking_delta",
                                                 "thinking", compat_text(m, "thinking"))));
    }
    if (compat_text_len(m, "content") > 0) {
        out = compat_cat(out, open_block(a, 2));
        out = compat_cat(out, delta(a, json_pack("{s:s, s:o}", "type", "text_delta", "text",
                                                 compat_text(m, "content"))));
    }
    if (json_is_true(json_object_get(chunk, "done"))) {
        json_t *calls = json_object_get(m, "tool_calls");
        size_t i;
        json_t *tc;
        json_array_foreach(calls, i, tc) {
            out = compat_cat(out, close_block(a));
            json_t *block = tool_use_block(tc);
            char *args = json_dumps(json_object_get(block, "input"), JSON_COMPACT);
            json_object_set_new(block, "input", json_object());
            out = compat_cat(out, compat_sse_event("content_block_start",
                                                   json_pack("{s:s, s:i, s:o}", "type",
                                                             "content_block_start", "index",
                                                             a->next_index, "content_block",
                                                             block)));
            out = compat_cat(out, delta(a, json_pack("{s:s, s:s}", "type", "input_json_delta",
                                                     "partial_json", args ? args : "{}")));
            free(args);
            a->open_kind = 3;
        }
        out = compat_cat(out, close_block(a));
        out = compat_cat(out, compat_sse_event(
                                  "message_delta",
                                  json_pack("{s:s, s:{s:s, s:n}, s:o}", "type", "message_delta",
                                            "delta", "stop_reason",
                                            stop_reason(chunk, json_array_size(calls) > 0),
                                            "stop_sequence", "usage", usage_obj(chunk))));
        out = compat_cat(out, compat_sse_event("message_stop",
                                               json_pack("{s:s}", "type", "message_stop")));
    }
    json_decref(chunk);
    return out ? out : strdup("");
}

static json_t *messages_reply(srv_encoder *e, json_t *last) {
    anth_enc *a = (anth_enc *)e;
    if (a->count_only) {
        json_t *r = json_pack("{s:I}", "input_tokens",
                              json_integer_value(json_object_get(last, "_prompt_tokens")));
        json_decref(last);
        return r;
    }
    if (json_object_get(last, "_debug_info")) return last;
    json_t *m = json_object_get(last, "message");
    json_t *calls = json_object_get(m, "tool_calls");
    json_t *blocks = json_array();
    if (compat_text_len(m, "thinking") > 0)
        json_array_append_new(blocks, json_pack("{s:s, s:o}", "type", "thinking", "thinking",
                                                compat_text(m, "thinking")));
    if (compat_text_len(m, "content") > 0 || json_array_size(calls) == 0)
        json_array_append_new(blocks, json_pack("{s:s, s:o}", "type", "text", "text",
                                                compat_text(m, "content")));
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) json_array_append_new(blocks, tool_use_block(tc));
    const char *model = json_string_value(json_object_get(last, "model"));
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:n, s:o}", "id", a->id, "type",
                          "message", "role", "assistant", "model", model ? model : "", "content",
                          blocks, "stop_reason", stop_reason(last, json_array_size(calls) > 0),
                          "stop_sequence", "usage", usage_obj(last));
    json_decref(last);
    return r;
}

static anth_enc *attach(srv_request *r) {
    anth_enc *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    strcpy(a->id, "msg_");
    compat_random_hex(a->id + 4, 24);
    strcpy(a->req_id, "req_");
    compat_random_hex(a->req_id + 4, 24);
    a->base.content_type = "text/event-stream";
    a->base.frame = messages_frame;
    a->base.reply = messages_reply;
    a->base.error_body = enc_error_body;
    a->base.error_frame = enc_error_frame;
    a->base.destroy = enc_destroy;
    srv_encoder_free(r->enc);
    r->enc = &a->base;
    return a;
}

bool compat_attach_anthropic(srv_request *r) { return attach(r) != NULL; }

/* ---------------- request translation ---------------- */

static void append(char **buf, const char *s) {
    *buf = compat_cat(*buf, strdup(s));
}

/* The system prompt: a string, or the text of every text block, each without Claude
 * Code's billing-header line. */
static bool system_text(srv_err *x, const json_t *sys, char **out) {
    *out = NULL;
    if (!sys || json_is_null(sys)) return true;
    if (json_is_string(sys)) {
        *out = compat_strip_billing_header(json_string_value(sys));
        return true;
    }
    if (!json_is_array(sys))
        return srv_err_set(x, 400, "system: expected a string or an array of text blocks, got %s",
                           srv_json_kind(sys));
    char *acc = strdup("");
    size_t i;
    json_t *b;
    json_array_foreach(sys, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        const char *text = json_string_value(json_object_get(b, "text"));
        if (!type || strcmp(type, "text") || !text) continue;
        char *clean = compat_strip_billing_header(text);
        if (clean) append(&acc, clean);
        free(clean);
    }
    *out = acc;
    return true;
}

static bool tool_result_text(const json_t *content, char **out) {
    *out = NULL;
    if (!content || json_is_null(content)) return (*out = strdup("")) != NULL;
    if (json_is_string(content)) return (*out = strdup(json_string_value(content))) != NULL;
    if (!json_is_array(content)) return false;
    char *acc = strdup("");
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        const char *text = json_string_value(json_object_get(b, "text"));
        if (text) append(&acc, text);
    }
    *out = acc;
    return true;
}

static bool translate_message(srv_err *x, size_t idx, const json_t *m, json_t *native,
                              json_int_t *chars) {
    if (!json_is_object(m)) return srv_err_set(x, 400, "messages.%zu: expected an object", idx);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return srv_err_set(x, 400, "messages.%zu.role: Input should be 'user' or 'assistant'", idx);
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content)) {
        json_array_append_new(native, json_pack("{s:s, s:O}", "role", role, "content", content));
        *chars += (json_int_t)strlen(json_string_value(content));
        return true;
    }
    if (!json_is_array(content))
        return srv_err_set(x, 400, "messages.%zu.content: expected a string or an array of content "
                             "blocks, got %s", idx, srv_json_kind(content));
    char *text = strdup(""), *thinking = NULL;
    json_t *calls = json_array(), *results = json_array(), *images = json_array();
    bool ok = true;
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!type) {
            ok = srv_err_set(x, 400, "messages.%zu.content.%zu: missing 'type'", idx, i);
            break;
        }
        if (!strcmp(type, "text")) {
            const char *t = json_string_value(json_object_get(b, "text"));
            if (!t) {
                ok = srv_err_set(x, 400, "messages.%zu.content.%zu.text: Field required", idx, i);
                break;
            }
            append(&text, t);
            *chars += (json_int_t)strlen(t);
        } else if (!strcmp(type, "image")) {
            json_t *src = json_object_get(b, "source");
            const char *st = json_string_value(json_object_get(src, "type"));
            const char *data = json_string_value(json_object_get(src, "data"));
            if (!st || strcmp(st, "base64") || !data) {
                ok = srv_err_set(x, 400, "invalid image source type: %s. Only base64 images are "
                                   "supported.", st ? st : "(none)");
                break;
            }
            json_array_append_new(images, json_string(data));
        } else if (!strcmp(type, "tool_use")) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
            if (!json_is_string(id)) {
                ok = srv_err_set(x, 400, "tool_use block missing required 'id' field");
                break;
            }
            if (!json_is_string(name)) {
                ok = srv_err_set(x, 400, "tool_use block missing required 'name' field");
                break;
            }
            json_t *input = json_object_get(b, "input");
            json_array_append_new(calls, json_pack("{s:O, s:{s:O, s:o}}", "id", id, "function",
                                                   "name", name, "arguments",
                                                   object_or_empty(input)));
        } else if (!strcmp(type, "tool_result")) {
            char *t = NULL;
            if (!tool_result_text(json_object_get(b, "content"), &t)) {
                ok = srv_err_set(x, 400, "messages.%zu.content.%zu: invalid tool_result content",
                                 idx, i);
                break;
            }
            json_t *tm = json_pack("{s:s, s:s}", "role", "tool", "content", t ? t : "");
            json_t *tid = json_object_get(b, "tool_use_id");
            if (json_is_string(tid)) json_object_set(tm, "tool_call_id", tid);
            json_array_append_new(results, tm);
            *chars += t ? (json_int_t)strlen(t) : 0;
            free(t);
        } else if (!strcmp(type, "thinking")) {
            const char *t = json_string_value(json_object_get(b, "thinking"));
            if (t) {
                if (!thinking) thinking = strdup("");
                append(&thinking, t);
            }
        } else if (!strcmp(type, "redacted_thinking")) {
            continue;
        } else {
            ok = srv_err_set(x, 400, "messages.%zu.content.%zu: unsupported content block type '%s'",
                             idx, i, type);
            break;
        }
    }
    if (ok) {
        /* tool results come before the turn's own text (as Ollama orders them) */
        json_array_extend(native, results);
        if ((text && *text) || json_array_size(calls) || thinking || json_array_size(images) ||
            json_array_size(results) == 0) {
            json_t *nm = json_pack("{s:s, s:s}", "role", role, "content", text ? text : "");
            if (thinking) json_object_set_new(nm, "thinking", json_string(thinking));
            if (json_array_size(calls)) json_object_set(nm, "tool_calls", calls);
            if (json_array_size(images)) json_object_set(nm, "images", images);
            json_array_append_new(native, nm);
        }
    }
    free(text);
    free(thinking);
    json_decref(calls);
    json_decref(results);
    json_decref(images);
    return ok;
}

static bool translate(srv_err *x, anth_enc *a, const json_t *in, json_t *out, bool count_only) {
    json_t *model = json_object_get(in, "model");
    if (!json_is_string(model) || !*json_string_value(model))
        return srv_err_set(x, 400, "model is required");
    json_object_set(out, "model", model);
    json_t *opts = json_object();
    json_object_set_new(out, "options", opts);
    if (!count_only) {
        json_t *mt = json_object_get(in, "max_tokens");
        if (!json_is_integer(mt) || json_integer_value(mt) <= 0)
            return srv_err_set(x, 400, "max_tokens is required and must be positive");
        json_object_set(opts, "num_predict", mt);
    }
    json_t *msgs = json_object_get(in, "messages");
    if (msgs && !json_is_null(msgs) && !json_is_array(msgs))
        return srv_err_set(x, 400, "messages: expected an array, got %s", srv_json_kind(msgs));
    if (json_array_size(msgs) == 0) return srv_err_set(x, 400, "messages is required");
    json_t *stream = json_object_get(in, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream))
        return srv_err_set(x, 400, "stream: expected a boolean, got %s", srv_json_kind(stream));
    json_object_set_new(out, "stream", json_boolean(json_is_true(stream) && !count_only));

    static const char *const nums[] = {"temperature", "top_p", "top_k"};
    for (int i = 0; i < 3; i++) {
        bool bad = false;
        double v;
        if (compat_number(in, nums[i], &v, &bad))
            json_object_set_new(opts, nums[i], i == 2 ? json_integer((json_int_t)v) : json_real(v));
        if (bad) return srv_err_set(x, 400, "%s: expected a number", nums[i]);
    }
    json_t *stops = json_object_get(in, "stop_sequences");
    if (stops && !json_is_null(stops)) {
        size_t i;
        json_t *s;
        if (!json_is_array(stops)) return srv_err_set(x, 400, "stop_sequences: expected an array of strings");
        json_array_foreach(stops, i, s) if (!json_is_string(s)) return srv_err_set(
            x, 400, "stop_sequences.%zu: expected a string", i);
        if (json_array_size(stops)) json_object_set(opts, "stop", stops);
    }
    json_t *thinking = json_object_get(in, "thinking");
    const char *tt = json_string_value(json_object_get(thinking, "type"));
    if (tt && !strcmp(tt, "disabled")) json_object_set_new(out, "think", json_false());
    /* structured outputs: output_format (beta) or output_config.format, a JSON schema the
     * grammar enforces as the native format */
    json_t *of = json_object_get(in, "output_format");
    if (!of) of = json_object_get(json_object_get(in, "output_config"), "format");
    if (of && !json_is_null(of)) {
        const char *ot = json_string_value(json_object_get(of, "type"));
        json_t *schema = json_object_get(of, "schema");
        if (!ot || strcmp(ot, "json_schema") || !json_is_object(schema))
            return srv_err_set(x, 400, "output_format: expected {\"type\": \"json_schema\", "
                                       "\"schema\": {...}}");
        json_object_set(out, "format", schema);
    }

    json_t *native = json_array();
    json_object_set_new(out, "messages", native);
    char *sys = NULL;
    if (!system_text(x, json_object_get(in, "system"), &sys)) return false;
    json_int_t chars = 0;
    if (sys && *sys) {
        json_array_append_new(native, json_pack("{s:s, s:s}", "role", "system", "content", sys));
        chars += (json_int_t)strlen(sys);
    }
    free(sys);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) if (!translate_message(x, i, m, native, &chars)) return false;

    json_t *tools = json_object_get(in, "tools");
    if (json_array_size(tools) > 0) {
        json_t *nt = json_array();
        json_object_set_new(out, "tools", nt);
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *name = json_string_value(json_object_get(t, "name"));
            if (!name) return srv_err_set(x, 400, "tools.%zu.name: Field required", i);
            json_t *schema = json_object_get(t, "input_schema");
            if (schema && !json_is_object(schema))
                return srv_err_set(x, 400, "invalid input_schema for tool \"%s\": expected an object", name);
            json_t *fn = json_pack("{s:s}", "name", name);
            json_t *desc = json_object_get(t, "description");
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            json_object_set_new(fn, "parameters",
                                schema ? json_incref(schema) : json_pack("{s:s}", "type", "object"));
            json_array_append_new(nt, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
        compat_tool_choice(json_object_get(in, "tool_choice"), out);
    }
    if (count_only || json_is_true(json_object_get(in, "_debug_render_only")))
        json_object_set_new(out, "_debug_render_only", json_true());
    a->input_estimate = chars / 4;
    return true;
}

static enum MHD_Result handle(srv_request *r, bool count_only) {
    anth_enc *a = attach(r);
    if (!a) return srv_reply_error(r, 500, "out of memory");
    a->count_only = count_only;
    enum MHD_Result ret;
    json_t *in = srv_parse_body(r, &ret);
    if (!in) return ret;
    json_t *out = json_object();
    srv_err x = {0};
    bool ok = translate(&x, a, in, out, count_only);
    json_decref(in);
    if (!ok) {
        json_decref(out);
        return srv_reply_error(r, x.status, "%s", x.msg);
    }
    return srv_native_run(r, SRV_NATIVE_CHAT, out);
}

enum MHD_Result srv_handle_anth_messages(srv_request *r) { return handle(r, false); }
enum MHD_Result srv_handle_anth_count_tokens(srv_request *r) { return handle(r, true); }
