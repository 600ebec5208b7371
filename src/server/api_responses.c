/*
 * api_responses.c - the OpenAI Responses API: POST /v1/responses (spec section 3.5).
 *
 * Like the other compat layers (compat.h), a request is translated into a native
 * /api/chat request and its output re-encoded by an srv_encoder:
 *
 *   input        a string (one user message) or items: messages (roles user, system,
 *                developer, assistant; content a string or input_text / output_text /
 *                input_image parts), function_call (an assistant tool call: call_id,
 *                name, arguments as a JSON string), function_call_output (a tool
 *                message answering call_id), reasoning (thinking of the next assistant
 *                message); `instructions` becomes a leading system message;
 *   options      max_output_tokens -> num_predict, temperature (default 1.0), top_p,
 *                reasoning.effort -> think, text.format json_schema / json_object ->
 *                the native `format` (the same field /v1/chat/completions fills);
 *   tools        function tools in the Responses' flat shape ({type, name, description,
 *                parameters}) -> native {type, function:{...}}.
 *
 * The reply is a response object {id "resp_...", object "response", created_at,
 * completed_at, status, model, output [reasoning?, message?, function_call...], usage
 * {input_tokens, output_tokens, total_tokens, input_tokens_details.cached_tokens,
 * output_tokens_details.reasoning_tokens}, and the request's settings echoed}. With
 * stream: true, SSE `event: <type>\ndata: <json>\n\n` frames, each with type and an
 * increasing sequence_number: response.created, response.in_progress; per output item
 * response.output_item.added ... response.output_item.done (reasoning: reasoning_
 * summary_text.delta/done; message: content_part.added, output_text.delta...,
 * output_text.done, content_part.done; function_call: function_call_arguments.delta/
 * done); then response.completed with the whole response. Stateless, as in Ollama:
 * previous_response_id and conversation are refused with a 400. Errors are OpenAI's
 * {"error":{message, type, param, code}}; one after the first frame is a
 * response.failed event.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/compat.h"
#include "server/outproc.h"

typedef struct resp_enc {
    srv_encoder base; /* first: the encoder pointer is the resp_enc pointer */
    char id[40], msg_id[40], rs_id[40];
    int64_t created;
    json_t *echo; /* the request's settings every response object repeats */
    int seq;      /* next sequence_number */
    bool started; /* response.created sent */
    int next_index;
    bool rs_open, msg_open;
    int rs_index, msg_index;
    outbuf thinking, text;
    json_t *output; /* finished output items */
} resp_enc;

static const char *error_type(unsigned status) {
    if (status == 400) return "invalid_request_error";
    if (status == 404) return "not_found_error";
    return "api_error";
}

static json_t *enc_error_body(srv_encoder *e, unsigned status, const char *msg) {
    (void)e;
    return json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                     error_type(status), "param", "code");
}

static void enc_destroy(srv_encoder *e) {
    resp_enc *o = (resp_enc *)e;
    json_decref(o->echo);
    json_decref(o->output);
    outbuf_free(&o->thinking);
    outbuf_free(&o->text);
    free(o);
}

static json_t *buf_json(const outbuf *b) {
    json_t *s = json_stringn(b->p ? b->p : "", b->len);
    return s ? s : json_string("");
}

static void new_id(char *out, size_t cap, const char *prefix) {
    char hex[17];
    compat_random_hex(hex, 16);
    snprintf(out, cap, "%s%s", prefix, hex);
}

/* The response object: the echoed settings plus status, output (stolen), usage
 * (stolen; NULL -> null). */
static json_t *response_obj(const resp_enc *o, const char *status, json_t *output, json_t *usage) {
    json_t *r = json_pack("{s:s, s:s, s:I, s:n, s:s, s:n}", "id", o->id, "object", "response",
                          "created_at", (json_int_t)o->created, "completed_at", "status", status,
                          "incomplete_details");
    json_object_set(r, "model", json_object_get(o->echo, "model"));
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set(r, "instructions", json_object_get(o->echo, "instructions"));
    json_object_set_new(r, "output", output ? output : json_array());
    json_object_set_new(r, "error", json_null());
    json_object_set(r, "tools", json_object_get(o->echo, "tools"));
    json_object_set_new(r, "tool_choice", json_string("auto"));
    json_object_set(r, "truncation", json_object_get(o->echo, "truncation"));
    json_object_set_new(r, "parallel_tool_calls", json_true());
    json_object_set(r, "text", json_object_get(o->echo, "text"));
    json_object_set(r, "top_p", json_object_get(o->echo, "top_p"));
    json_object_set_new(r, "presence_penalty", json_integer(0));
    json_object_set_new(r, "frequency_penalty", json_integer(0));
    json_object_set_new(r, "top_logprobs", json_integer(0));
    json_object_set(r, "temperature", json_object_get(o->echo, "temperature"));
    json_object_set(r, "reasoning", json_object_get(o->echo, "reasoning"));
    json_object_set_new(r, "usage", usage ? usage : json_null());
    json_object_set(r, "max_output_tokens", json_object_get(o->echo, "max_output_tokens"));
    json_object_set_new(r, "max_tool_calls", json_null());
    json_object_set_new(r, "store", json_false());
    json_object_set_new(r, "background", json_false());
    json_object_set_new(r, "service_tier", json_string("default"));
    json_object_set_new(r, "metadata", json_object());
    json_object_set_new(r, "safety_identifier", json_null());
    json_object_set_new(r, "prompt_cache_key", json_null());
    return r;
}

static json_t *usage_obj(const json_t *fin) {
    json_int_t p = json_integer_value(json_object_get(fin, "prompt_eval_count"));
    json_int_t c = json_integer_value(json_object_get(fin, "eval_count"));
    json_int_t cached = json_integer_value(json_object_get(fin, "_cached_tokens"));
    return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:i}}", "input_tokens", p, "output_tokens", c,
                     "total_tokens", p + c, "input_tokens_details", "cached_tokens", cached,
                     "output_tokens_details", "reasoning_tokens", 0);
}

/* One SSE event: {"type", ...payload (stolen), "sequence_number"}. */
static char *event(resp_enc *o, const char *type, json_t *payload) {
    json_t *d = json_pack("{s:s}", "type", type);
    json_object_update(d, payload);
    json_decref(payload);
    json_object_set_new(d, "sequence_number", json_integer(o->seq++));
    return compat_sse_event(type, d);
}

static json_t *text_part(json_t *text) {
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", text, "annotations",
                     "logprobs");
}

static json_t *reasoning_item(const char *id, json_t *text) {
    return json_pack("{s:s, s:s, s:[{s:s, s:O}], s:O}", "id", id, "type", "reasoning", "summary",
                     "type", "summary_text", "text", text, "encrypted_content", text);
}

static json_t *message_item(const char *id, const char *status, json_t *content) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status,
                     "role", "assistant", "content", content);
}

/* Native tool calls ({id?, function:{name, arguments:{...}}}) as function_call items. */
static json_t *call_item(const json_t *tc, const char *status, bool with_args) {
    json_t *fn = json_object_get(tc, "function");
    json_t *a = json_object_get(fn, "arguments");
    char *args = a ? json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *cid = json_string_value(json_object_get(tc, "id"));
    char idbuf[40], fcid[40];
    if (!cid) {
        new_id(idbuf, sizeof idbuf, "call_");
        cid = idbuf;
    }
    new_id(fcid, sizeof fcid, "fc_");
    json_t *item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", fcid, "type", "function_call",
                             "status", status, "call_id", cid, "name", name ? name : "",
                             "arguments", with_args ? (args ? args : "{}") : "");
    free(args);
    return item;
}

/* ---------------- streaming ---------------- */

static char *close_reasoning(resp_enc *o) {
    if (!o->rs_open) return NULL;
    o->rs_open = false;
    json_t *t = buf_json(&o->thinking);
    char *out = event(o, "response.reasoning_summary_text.done",
                      json_pack("{s:s, s:i, s:i, s:O}", "item_id", o->rs_id, "output_index",
                                o->rs_index, "summary_index", 0, "text", t));
    json_t *item = reasoning_item(o->rs_id, t);
    out = compat_cat(out, event(o, "response.output_item.done",
                                json_pack("{s:i, s:O}", "output_index", o->rs_index, "item", item)));
    json_array_append_new(o->output, item);
    json_decref(t);
    return out;
}

static char *close_message(resp_enc *o) {
    if (!o->msg_open) return NULL;
    o->msg_open = false;
    json_t *t = buf_json(&o->text);
    char *out = event(o, "response.output_text.done",
                      json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", o->msg_id, "output_index",
                                o->msg_index, "content_index", 0, "text", t, "logprobs"));
    out = compat_cat(out, event(o, "response.content_part.done",
                                json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->msg_id,
                                          "output_index", o->msg_index, "content_index", 0,
                                          "part", text_part(json_incref(t)))));
    json_t *item = message_item(o->msg_id, "completed", json_pack("[o]", text_part(json_incref(t))));
    out = compat_cat(out, event(o, "response.output_item.done",
                                json_pack("{s:i, s:O}", "output_index", o->msg_index, "item", item)));
    json_array_append_new(o->output, item);
    json_decref(t);
    return out;
}

static char *frame(srv_encoder *e, json_t *chunk) {
    resp_enc *o = (resp_enc *)e;
    if (json_object_get(chunk, "_debug_info")) return compat_sse_data(chunk);
    char *out = NULL;
    if (!o->started) {
        o->started = true;
        out = event(o, "response.created",
                    json_pack("{s:o}", "response", response_obj(o, "in_progress", NULL, NULL)));
        out = compat_cat(out, event(o, "response.in_progress",
                                    json_pack("{s:o}", "response",
                                              response_obj(o, "in_progress", NULL, NULL))));
    }
    json_t *msg = json_object_get(chunk, "message");
    if (compat_text_len(msg, "thinking") > 0) {
        if (!o->rs_open) {
            o->rs_open = true;
            o->rs_index = o->next_index++;
            new_id(o->rs_id, sizeof o->rs_id, "rs_");
            out = compat_cat(out, event(o, "response.output_item.added",
                                        json_pack("{s:i, s:{s:s, s:s, s:[]}}", "output_index",
                                                  o->rs_index, "item", "id", o->rs_id, "type",
                                                  "reasoning", "summary")));
        }
        json_t *d = compat_text(msg, "thinking");
        outbuf_add(&o->thinking, json_string_value(d), json_string_length(d));
        out = compat_cat(out, event(o, "response.reasoning_summary_text.delta",
                                    json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->rs_id,
                                              "output_index", o->rs_index, "summary_index", 0,
                                              "delta", d)));
    }
    if (compat_text_len(msg, "content") > 0) {
        out = compat_cat(out, close_reasoning(o));
        if (!o->msg_open) {
            o->msg_open = true;
            o->msg_index = o->next_index++;
            out = compat_cat(out, event(o, "response.output_item.added",
                                        json_pack("{s:i, s:o}", "output_index", o->msg_index, "item",
                                                  message_item(o->msg_id, "in_progress",
                                                               json_array()))));
            out = compat_cat(out, event(o, "response.content_part.added",
                                        json_pack("{s:s, s:i, s:i, s:o}", "item_id", o->msg_id,
                                                  "output_index", o->msg_index, "content_index", 0,
                                                  "part", text_part(json_string("")))));
        }
        json_t *d = compat_text(msg, "content");
        outbuf_add(&o->text, json_string_value(d), json_string_length(d));
        out = compat_cat(out, event(o, "response.output_text.delta",
                                    json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", o->msg_id,
                                              "output_index", o->msg_index, "content_index", 0,
                                              "delta", d, "logprobs")));
    }
    json_t *calls = json_object_get(msg, "tool_calls");
    if (json_array_size(calls) > 0) {
        out = compat_cat(out, close_reasoning(o));
        out = compat_cat(out, close_message(o));
        size_t i;
        json_t *tc;
        json_array_foreach(calls, i, tc) {
            int idx = o->next_index++;
            json_t *done_item = call_item(tc, "completed", true);
            json_t *added = json_deep_copy(done_item);
            json_object_set_new(added, "status", json_string("in_progress"));
            json_object_set_new(added, "arguments", json_string(""));
            const char *item_id = json_string_value(json_object_get(done_item, "id"));
            json_t *args = json_object_get(done_item, "arguments");
            out = compat_cat(out, event(o, "response.output_item.added",
                                        json_pack("{s:i, s:o}", "output_index", idx, "item", added)));
            out = compat_cat(out, event(o, "response.function_call_arguments.delta",
                                        json_pack("{s:s, s:i, s:O}", "item_id", item_id,
                                                  "output_index", idx, "delta", args)));
            out = compat_cat(out, event(o, "response.function_call_arguments.done",
                                        json_pack("{s:s, s:i, s:O}", "item_id", item_id,
                                                  "output_index", idx, "arguments", args)));
            out = compat_cat(out, event(o, "response.output_item.done",
                                        json_pack("{s:i, s:O}", "output_index", idx, "item",
                                                  done_item)));
            json_array_append_new(o->output, done_item);
        }
    }
    if (json_is_true(json_object_get(chunk, "done"))) {
        out = compat_cat(out, close_reasoning(o));
        out = compat_cat(out, close_message(o));
        json_t *r = response_obj(o, "completed", json_incref(o->output), usage_obj(chunk));
        json_object_set_new(r, "completed_at", json_integer((json_int_t)time(NULL)));
        out = compat_cat(out, event(o, "response.completed", json_pack("{s:o}", "response", r)));
    }
    json_decref(chunk);
    return out ? out : strdup("");
}

static char *error_frame(srv_encoder *e, unsigned status, const char *msg) {
    resp_enc *o = (resp_enc *)e;
    json_t *r = response_obj(o, "failed", json_incref(o->output), NULL);
    json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code",
                                              status == 400 ? "invalid_prompt" : "server_error",
                                              "message", msg));
    return event(o, "response.failed", json_pack("{s:o}", "response", r));
}

/* ---------------- one reply ---------------- */

static json_t *reply(srv_encoder *e, json_t *last) {
    resp_enc *o = (resp_enc *)e;
    if (json_object_get(last, "_debug_info")) return last;
    json_t *msg = json_object_get(last, "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *output = json_array();
    if (compat_text_len(msg, "thinking") > 0) {
        char rs[40];
        new_id(rs, sizeof rs, "rs_");
        json_t *t = compat_text(msg, "thinking");
        json_array_append_new(output, reasoning_item(rs, t));
        json_decref(t);
    }
    if (compat_text_len(msg, "content") > 0 || json_array_size(calls) == 0)
        json_array_append_new(output, message_item(o->msg_id, "completed",
                                                   json_pack("[o]", text_part(compat_text(msg, "content")))));
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) json_array_append_new(output, call_item(tc, "completed", true));
    json_t *r = response_obj(o, "completed", output, usage_obj(last));
    json_object_set_new(r, "completed_at", json_integer((json_int_t)time(NULL)));
    json_decref(last);
    return r;
}

static resp_enc *attach(srv_request *r) {
    resp_enc *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->output = json_array();
    o->echo = json_object();
    if (!o->output || !o->echo) {
        enc_destroy(&o->base);
        return NULL;
    }
    o->created = (int64_t)time(NULL);
    new_id(o->id, sizeof o->id, "resp_");
    new_id(o->msg_id, sizeof o->msg_id, "msg_");
    o->base.content_type = "text/event-stream";
    o->base.frame = frame;
    o->base.error_frame = error_frame;
    o->base.reply = reply;
    o->base.error_body = enc_error_body;
    o->base.destroy = enc_destroy;
    srv_encoder_free(r->enc);
    r->enc = &o->base;
    return o;
}

bool compat_attach_openai_responses(srv_request *r) { return attach(r) != NULL; }

/* ---------------- request translation ---------------- */

/* Concatenated text of content parts (input_text / output_text); input_image data URLs
 * go to *images. where: the path for errors ("input[2]"). */
static bool content_parts(srv_err *x, const json_t *content, const char *where, outbuf *text,
                          json_t *images) {
    if (!content || json_is_null(content)) return true; /* no content: empty, as in Ollama */
    if (json_is_string(content)) {
        outbuf_add(text, json_string_value(content), json_string_length(content));
        return true;
    }
    if (!json_is_array(content))
        return srv_err_set(x, 400, "%s: content must be a string or array", where);
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *t = json_object_get(part, "text");
        if (type && (!strcmp(type, "input_text") || !strcmp(type, "output_text"))) {
            if (!json_is_string(t))
                return srv_err_set(x, 400, "%s: content[%zu]: missing text", where, k);
            outbuf_add(text, json_string_value(t), json_string_length(t));
        } else if (type && !strcmp(type, "input_image")) {
            const char *url = json_string_value(json_object_get(part, "image_url"));
            if (!url) continue; /* file_id: not supported, as in Ollama */
            bool remote = !strncmp(url, "http://", 7) || !strncmp(url, "https://", 8);
            const char *b64 = strstr(url, ";base64,");
            if (remote)
                return srv_err_set(x, 400, "image URLs are not currently supported, please use "
                                           "base64 encoded data instead");
            if (!b64 || strncmp(url, "data:", 5)) return srv_err_set(x, 400, "invalid image input");
            json_array_append_new(images, json_string(b64 + 8));
        } else if (type && !strcmp(type, "input_file")) {
            return srv_err_set(x, 400, "file inputs are not currently supported");
        } else {
            return srv_err_set(x, 400, "%s: content[%zu]: unknown content type: %s", where, k,
                               type ? type : srv_json_kind(part));
        }
    }
    return true;
}

static const char *tool_name_for(const json_t *native, const char *id) {
    for (size_t i = json_array_size(native); i-- > 0;) {
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(json_array_get(native, i), "tool_calls"), k, tc) {
            const char *tid = json_string_value(json_object_get(tc, "id"));
            if (tid && !strcmp(tid, id))
                return json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        }
    }
    return NULL;
}

static json_t *new_text_msg(const char *role, const outbuf *text) {
    return json_pack("{s:s, s:o}", "role", role, "content", buf_json(text));
}

static bool translate_item(srv_err *x, const json_t *item, size_t i, json_t *native,
                           json_t **pending_thinking) {
    char where[32];
    snprintf(where, sizeof where, "input[%zu]", i);
    if (!json_is_object(item)) return srv_err_set(x, 400, "%s: expected an object", where);
    const char *type = json_string_value(json_object_get(item, "type"));
    const char *role = json_string_value(json_object_get(item, "role"));
    if ((!type || !*type) && role) type = "message";
    if (!type || !*type) return srv_err_set(x, 400, "%s: input item missing required 'type' field", where);
    json_t *last = json_array_size(native) ? json_array_get(native, json_array_size(native) - 1) : NULL;
    const char *last_role = json_string_value(json_object_get(last, "role"));
    if (!strcmp(type, "message")) {
        if (!role) return srv_err_set(x, 400, "%s: missing required parameter 'role'", where);
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "assistant"))
            return srv_err_set(x, 400, "%s: invalid role \"%s\" (must be \"user\", \"system\", "
                                       "\"developer\" or \"assistant\")", where, role);
        outbuf text = {0};
        json_t *images = json_array();
        bool ok = content_parts(x, json_object_get(item, "content"), where, &text, images);
        json_t *m = ok && !text.oom ? new_text_msg(role, &text) : NULL;
        outbuf_free(&text);
        if (!m) {
            json_decref(images);
            return ok ? srv_err_set(x, 500, "out of memory") : false;
        }
        if (json_array_size(images)) json_object_set(m, "images", images);
        json_decref(images);
        if (!strcmp(role, "assistant") && *pending_thinking) {
            json_object_set_new(m, "thinking", *pending_thinking);
            *pending_thinking = NULL;
        }
        json_array_append_new(native, m);
    } else if (!strcmp(type, "function_call")) {
        const char *name = json_string_value(json_object_get(item, "name"));
        const char *call_id = json_string_value(json_object_get(item, "call_id"));
        json_t *a = json_object_get(item, "arguments");
        if (!name) return srv_err_set(x, 400, "%s: missing required parameter 'name'", where);
        if (a && !json_is_null(a) && !json_is_string(a))
            return srv_err_set(x, 400, "%s: 'arguments' must be a JSON string", where);
        const char *as = json_string_value(a);
        json_error_t je;
        json_t *args = as && *as ? json_loads(as, JSON_DECODE_ANY, &je) : json_object();
        if (!json_is_object(args)) {
            json_decref(args);
            return srv_err_set(x, 400, "failed to parse function call arguments: %s",
                               as && *as ? "not a JSON object" : "empty");
        }
        json_t *call = json_pack("{s:{s:s, s:o}}", "function", "name", name, "arguments", args);
        if (call_id) json_object_set_new(call, "id", json_string(call_id));
        json_t *target = last_role && !strcmp(last_role, "assistant") ? last : NULL;
        if (!target) {
            target = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
            json_array_append_new(native, target);
        }
        json_t *calls = json_object_get(target, "tool_calls");
        if (!calls) json_object_set_new(target, "tool_calls", calls = json_array());
        json_array_append_new(calls, call);
        if (*pending_thinking) {
            json_object_set_new(target, "thinking", *pending_thinking);
            *pending_thinking = NULL;
        }
    } else if (!strcmp(type, "function_call_output")) {
        const char *call_id = json_string_value(json_object_get(item, "call_id"));
        if (!call_id) return srv_err_set(x, 400, "%s: missing required parameter 'call_id'", where);
        outbuf text = {0};
        json_t *images = json_array();
        json_t *out = json_object_get(item, "output");
        bool ok = content_parts(x, out, where, &text, images);
        json_t *m = ok && !text.oom ? new_text_msg("tool", &text) : NULL;
        outbuf_free(&text);
        if (!m) {
            json_decref(images);
            return ok ? srv_err_set(x, 500, "out of memory") : false;
        }
        if (json_array_size(images)) json_object_set(m, "images", images);
        json_decref(images);
        json_object_set_new(m, "tool_call_id", json_string(call_id));
        const char *tn = tool_name_for(native, call_id);
        if (tn) json_object_set_new(m, "tool_name", json_string(tn));
        json_array_append_new(native, m);
    } else if (!strcmp(type, "reasoning")) {
        /* Ollama's reasoning items carry the thinking as plain text */
        json_t *enc = json_object_get(item, "encrypted_content");
        outbuf t = {0};
        if (json_is_string(enc)) {
            outbuf_add(&t, json_string_value(enc), json_string_length(enc));
        } else {
            size_t k;
            json_t *s;
            json_array_foreach(json_object_get(item, "summary"), k, s) {
                json_t *st = json_object_get(s, "text");
                if (json_is_string(st)) outbuf_add(&t, json_string_value(st), json_string_length(st));
            }
        }
        json_decref(*pending_thinking);
        *pending_thinking = buf_json(&t);
        outbuf_free(&t);
    } else {
        return srv_err_set(x, 400, "%s: unknown input item type: \"%s\"", where, type);
    }
    return true;
}

static bool translate_tools(srv_err *x, const json_t *tools, json_t *out) {
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return srv_err_set(x, 400, "invalid type for 'tools': expected an array");
    if (json_array_size(tools) == 0) return true;
    json_t *native = json_array();
    json_object_set_new(out, "tools", native);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function"))
            return srv_err_set(x, 400, "tools[%zu]: tool type \"%s\" is not supported (only "
                                       "\"function\")", i, type ? type : "");
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!name || !*name) return srv_err_set(x, 400, "tools[%zu]: missing required parameter 'name'", i);
        json_t *fn = json_pack("{s:s}", "name", name);
        json_t *d = json_object_get(t, "description");
        if (json_is_string(d)) json_object_set(fn, "description", d);
        json_t *p = json_object_get(t, "parameters");
        if (json_is_object(p)) {
            json_object_set(fn, "parameters", p);
        } else if (p && !json_is_null(p)) {
            json_decref(fn);
            return srv_err_set(x, 400, "tools[%zu]: 'parameters' must be an object", i);
        }
        json_array_append_new(native, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return true;
}

static bool translate(srv_err *x, resp_enc *o, const json_t *in, json_t *out) {
    json_t *echo = o->echo;
    json_t *model = json_object_get(in, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return srv_err_set(x, 400, "invalid type for 'model': expected a string, got %s",
                           srv_json_kind(model));
    if (model) json_object_set(out, "model", model);
    json_object_set_new(echo, "model", json_string(json_is_string(model) ? json_string_value(model) : ""));
    static const char *const stateful[] = {"previous_response_id", "conversation"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(in, stateful[i]);
        if (v && !json_is_null(v))
            return srv_err_set(x, 400, "'%s' is not supported: responses are not stored, send the "
                                       "whole conversation in 'input'", stateful[i]);
    }
    json_t *stream = json_object_get(in, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream))
        return srv_err_set(x, 400, "invalid type for 'stream': expected a boolean, got %s",
                           srv_json_kind(stream));
    json_object_set_new(out, "stream", json_boolean(json_is_true(stream)));

    /* messages */
    json_t *native = json_array();
    json_object_set_new(out, "messages", native);
    json_t *instr = json_object_get(in, "instructions");
    if (instr && !json_is_null(instr) && !json_is_string(instr))
        return srv_err_set(x, 400, "invalid type for 'instructions': expected a string");
    json_object_set_new(echo, "instructions", json_string_length(instr) ? json_incref(instr) : json_null());
    if (json_string_length(instr))
        json_array_append_new(native, json_pack("{s:s, s:O}", "role", "system", "content", instr));
    json_t *input = json_object_get(in, "input");
    if (json_is_string(input)) {
        json_array_append_new(native, json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (json_is_array(input)) {
        json_t *pending = NULL;
        size_t i;
        json_t *item;
        json_array_foreach(input, i, item) {
            if (!translate_item(x, item, i, native, &pending)) {
                json_decref(pending);
                return false;
            }
        }
        if (pending)
            json_array_append_new(native, json_pack("{s:s, s:s, s:o}", "role", "assistant",
                                                    "content", "", "thinking", pending));
    } else if (!input || json_is_null(input)) {
        return srv_err_set(x, 400, "missing required parameter: 'input'");
    } else {
        return srv_err_set(x, 400, "invalid type for 'input': expected a string or an array, got %s",
                           srv_json_kind(input));
    }
    if (json_array_size(native) == 0) return srv_err_set(x, 400, "'input' is empty");

    /* options: OpenAI's temperature default, not the model's */
    json_t *opts = json_object();
    json_object_set_new(out, "options", opts);
    bool bad = false;
    double v;
    double temp = compat_number(in, "temperature", &v, &bad) ? v : 1.0;
    if (bad) return srv_err_set(x, 400, "invalid type for 'temperature': expected a number");
    json_object_set_new(opts, "temperature", json_real(temp));
    json_object_set_new(echo, "temperature", json_real(temp));
    double top_p = 1.0;
    if (compat_number(in, "top_p", &v, &bad)) {
        top_p = v;
        json_object_set_new(opts, "top_p", json_real(v));
    }
    if (bad) return srv_err_set(x, 400, "invalid type for 'top_p': expected a number");
    json_object_set_new(echo, "top_p", json_real(top_p));
    json_t *mot = json_object_get(in, "max_output_tokens");
    if (mot && !json_is_null(mot) && !json_is_integer(mot))
        return srv_err_set(x, 400, "invalid type for 'max_output_tokens': expected an integer");
    if (json_is_integer(mot)) json_object_set(opts, "num_predict", mot);
    json_object_set_new(echo, "max_output_tokens", json_is_integer(mot) ? json_incref(mot) : json_null());
    json_t *trunc = json_object_get(in, "truncation");
    json_object_set_new(echo, "truncation", json_is_string(trunc) ? json_incref(trunc)
                                                                  : json_string("disabled"));

    /* reasoning.effort -> think (the chat completions mapping) */
    json_t *reasoning = json_object_get(in, "reasoning");
    const char *effort = json_string_value(json_object_get(reasoning, "effort"));
    json_object_set_new(echo, "reasoning", json_is_object(reasoning) ? json_deep_copy(reasoning)
                                                                     : json_null());
    if (effort && *effort) {
        if (!strcmp(effort, "none")) json_object_set_new(out, "think", json_false());
        else if (!strcmp(effort, "minimal")) json_object_set_new(out, "think", json_string("low"));
        else if (!strcmp(effort, "low") || !strcmp(effort, "medium") || !strcmp(effort, "high") ||
                 !strcmp(effort, "max"))
            json_object_set_new(out, "think", json_string(effort));
        else if (!strcmp(effort, "xhigh")) json_object_set_new(out, "think", json_string("max"));
        else
            return srv_err_set(x, 400, "invalid reasoning value: \"%s\" (must be \"minimal\", "
                                       "\"low\", \"medium\", \"high\", \"xhigh\", \"max\", or "
                                       "\"none\")", effort);
    }

    /* text.format -> format */
    json_t *fmt = json_object_get(json_object_get(in, "text"), "format");
    json_t *fmt_echo = json_is_object(fmt) ? json_incref(fmt) : json_pack("{s:s}", "type", "text");
    json_object_set_new(echo, "text", json_pack("{s:o}", "format", fmt_echo));
    if (json_is_object(fmt)) {
        const char *t = json_string_value(json_object_get(fmt, "type"));
        if (t && !strcmp(t, "json_object")) {
            json_object_set_new(out, "format", json_string("json"));
        } else if (t && !strcmp(t, "json_schema")) {
            json_t *schema = json_object_get(fmt, "schema");
            if (!json_is_object(schema))
                return srv_err_set(x, 400, "missing required parameter: 'text.format.schema'");
            json_object_set(out, "format", schema);
        } else if (!t || strcmp(t, "text")) {
            return srv_err_set(x, 400, "invalid value for 'text.format.type': \"%s\" (must be "
                                       "\"text\", \"json_schema\" or \"json_object\")", t ? t : "");
        }
    } else if (fmt && !json_is_null(fmt)) {
        return srv_err_set(x, 400, "invalid type for 'text.format': expected an object");
    }

    json_t *tools = json_object_get(in, "tools");
    if (!translate_tools(x, tools, out)) return false;
    compat_tool_choice(json_object_get(in, "tool_choice"), out);
    json_object_set_new(echo, "tools", json_is_array(tools) ? json_incref(tools) : json_array());
    json_t *dbg = json_object_get(in, "_debug_render_only");
    if (json_is_true(dbg)) json_object_set_new(out, "_debug_render_only", json_true());
    return true;
}

enum MHD_Result srv_handle_oai_responses(srv_request *r) {
    resp_enc *o = attach(r);
    if (!o) return srv_reply_error(r, 500, "out of memory");
    enum MHD_Result ret;
    json_t *in = srv_parse_body(r, &ret);
    if (!in) return ret;
    json_t *out = json_object();
    srv_err x = {0};
    bool ok = out && translate(&x, o, in, out);
    json_decref(in);
    if (!ok) {
        json_decref(out);
        return srv_reply_error(r, x.status ? x.status : 500, "%s", x.status ? x.msg : "out of memory");
    }
    return srv_native_run(r, SRV_NATIVE_CHAT, out);
}
