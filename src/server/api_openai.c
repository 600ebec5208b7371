/*
 * api_openai.c - the OpenAI-compatible endpoints (spec section 3): /v1/chat/completions,
 * /v1/completions, /v1/models, /v1/models/{id}, /v1/embeddings.
 *
 * Like Ollama's middleware, each request is translated into a native request (chat,
 * generate, embed) and run by the native handler; an oai_enc (srv_encoder) re-encodes
 * the native chunks: SSE `data: {...}\n\n` frames ending in `data: [DONE]`, or one
 * response object, and errors as {"error":{"message","type","param","code"}} with
 * type invalid_request_error (400), not_found_error (404) or api_error (other).
 * /v1/completions takes `prompt` as a string or a one-string list (several prompts are
 * a 400). The context length is the model's num_ctx as for the native API: the
 * Modelfile's PARAMETER num_ctx, else OLLAMA_CONTEXT_LENGTH / HEARTH_CONTEXT_LENGTH.
 * Usage carries prompt_tokens_details.cached_tokens: prompt tokens the prefix cache
 * supplied (the runner's count). A stream that fails after its first frame gets one
 * `data: {"error":{...}}` frame and no [DONE].
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/compat.h"

typedef enum oai_kind { OAI_PLAIN, OAI_CHAT, OAI_COMPLETION, OAI_EMBED } oai_kind;

typedef struct oai_enc {
    srv_encoder base; /* first: the encoder pointer is the oai_enc pointer */
    oai_kind kind;
    char id[40];
    int64_t created;
    bool include_usage;
    bool base64;        /* embeddings: encoding_format base64 */
    bool role_sent;
    bool tool_calls_seen;
    int n_tool_calls;
    int64_t text_offset; /* completions logprobs */
} oai_enc;

static const char *error_type(unsigned status) {
    if (status == 400) return "invalid_request_error";
    if (status == 404) return "not_found_error";
    return "api_error";
}

static json_t *oai_error_obj(unsigned status, const char *msg) {
    return json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                     error_type(status), "param", "code");
}

static json_t *enc_error_body(srv_encoder *e, unsigned status, const char *msg) {
    (void)e;
    return oai_error_obj(status, msg);
}

static char *enc_error_frame(srv_encoder *e, unsigned status, const char *msg) {
    (void)e;
    return compat_sse_data(oai_error_obj(status, msg));
}

static char *enc_end(srv_encoder *e) {
    (void)e;
    return strdup("data: [DONE]\n\n");
}

static void enc_destroy(srv_encoder *e) { free(e); }

static json_t *usage_obj(const json_t *fin) {
    json_int_t p = json_integer_value(json_object_get(fin, "prompt_eval_count"));
    json_int_t c = json_integer_value(json_object_get(fin, "eval_count"));
    json_int_t cached = json_integer_value(json_object_get(fin, "_cached_tokens"));
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", p, "completion_tokens", c,
                     "total_tokens", p + c, "prompt_tokens_details", "cached_tokens", cached);
}

static const char *finish_reason(const oai_enc *o, const json_t *fin) {
    const char *r = json_string_value(json_object_get(fin, "done_reason"));
    if (!r || !*r) r = "stop";
    if (!strcmp(r, "stop") && o->tool_calls_seen) return "tool_calls";
    return r;
}

/* Native tool calls ({id, function:{index, name, arguments:{...}}}) in OpenAI's shape,
 * arguments as a JSON string. */
static json_t *oai_tool_calls(oai_enc *o, const json_t *calls) {
    json_t *out = json_array();
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) {
        json_t *fn = json_object_get(tc, "function");
        json_t *a = json_object_get(fn, "arguments");
        char *args = a ? json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        const char *id = json_string_value(json_object_get(tc, "id"));
        char idbuf[32];
        if (!id) {
            strcpy(idbuf, "call_");
            compat_random_hex(idbuf + 5, 8);
            id = idbuf;
        }
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_array_append_new(out, json_pack("{s:s, s:i, s:s, s:{s:s, s:s}}", "id", id, "index",
                                             o->n_tool_calls++, "type", "function", "function",
                                             "name", name ? name : "", "arguments",
                                             args ? args : "{}"));
        free(args);
    }
    o->tool_calls_seen = o->tool_calls_seen || json_array_size(calls) > 0;
    return out;
}

static json_t *token_bytes(const json_t *t) {
    json_t *b = json_array();
    const unsigned char *p = (const unsigned char *)json_string_value(t);
    for (size_t i = 0, n = json_string_length(t); p && i < n; i++)
        json_array_append_new(b, json_integer(p[i]));
    return b;
}

/* Native logprobs entries ({token, logprob, top_logprobs?}) as OpenAI's chat
 * {"content":[{token, logprob, bytes, top_logprobs:[...]}]}; NULL when there are none. */
static json_t *chat_logprobs(const json_t *native) {
    if (json_array_size(native) == 0) return NULL;
    json_t *content = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(native, i, e) {
        json_t *top = json_array();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t) {
            json_array_append_new(top, json_pack("{s:o, s:O, s:o}", "token", compat_text(t, "token"),
                                                 "logprob", json_object_get(t, "logprob"),
                                                 "bytes", token_bytes(json_object_get(t, "token"))));
        }
        json_array_append_new(content, json_pack("{s:o, s:O, s:o, s:o}", "token",
                                                 compat_text(e, "token"), "logprob",
                                                 json_object_get(e, "logprob"), "bytes",
                                                 token_bytes(json_object_get(e, "token")),
                                                 "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* The legacy completions shape: tokens, token_logprobs, top_logprobs (token -> logprob),
 * text_offset (byte offsets from the start of the generated text; *offset carries on
 * across stream chunks). */
static json_t *completion_logprobs(const json_t *native, int64_t *offset) {
    if (json_array_size(native) == 0) return NULL;
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(native, i, e) {
        json_array_append_new(tokens, compat_text(e, "token"));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *top = json_object();
        size_t k;
        json_t *t;
        json_array_foreach(json_object_get(e, "top_logprobs"), k, t) {
            const char *tt = json_string_value(json_object_get(t, "token"));
            json_object_set(top, tt ? tt : "", json_object_get(t, "logprob"));
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += (int64_t)compat_text_len(e, "token");
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *chunk_base(const oai_enc *o, const json_t *native, const char *object) {
    const char *model = json_string_value(json_object_get(native, "model"));
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", o->id, "object", object, "created",
                     (json_int_t)o->created, "model", model ? model : "", "system_fingerprint",
                     "fp_ollama");
}

static char *chat_delta_frame(oai_enc *o, const json_t *native, json_t *delta, json_t *finish,
                              json_t *logprobs) {
    json_t *ch = chunk_base(o, native, "chat.completion.chunk");
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "finish_reason",
                               finish ? finish : json_null());
    if (logprobs) json_object_set_new(choice, "logprobs", logprobs);
    json_object_set_new(ch, "choices", json_pack("[o]", choice));
    return compat_sse_data(ch);
}

static char *chat_frame(srv_encoder *e, json_t *chunk) {
    oai_enc *o = (oai_enc *)e;
    if (json_object_get(chunk, "_debug_info")) return compat_sse_data(chunk);
    json_t *msg = json_object_get(chunk, "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    bool done = json_is_true(json_object_get(chunk, "done"));
    bool has_calls = json_array_size(calls) > 0;
    char *out = NULL;
    bool has_thinking = compat_text_len(msg, "thinking") > 0;
    /* a thinking-only chunk is just the reasoning one; otherwise content (empty kept) */
    bool content_chunk = compat_text_len(msg, "content") > 0 || has_calls || (!done && !has_thinking);
    json_t *lp = chat_logprobs(json_object_get(chunk, "logprobs"));
    if (has_thinking) { /* reasoning gets its own chunk, first */
        json_t *d = json_object();
        if (!o->role_sent) json_object_set_new(d, "role", json_string("assistant"));
        o->role_sent = true;
        json_object_set_new(d, "content", json_string(""));
        json_object_set_new(d, "reasoning", compat_text(msg, "thinking"));
        out = compat_cat(out, chat_delta_frame(o, chunk, d, NULL, content_chunk || done ? NULL : lp));
        if (!content_chunk && !done) lp = NULL;
    }
    if (content_chunk) {
        json_t *d = json_object();
        if (!o->role_sent) json_object_set_new(d, "role", json_string("assistant"));
        o->role_sent = true;
        json_object_set_new(d, "content", compat_text(msg, "content"));
        if (has_calls) json_object_set_new(d, "tool_calls", oai_tool_calls(o, calls));
        out = compat_cat(out, chat_delta_frame(o, chunk, d, NULL, lp));
        lp = NULL;
    }
    if (done) {
        out = compat_cat(out, chat_delta_frame(o, chunk, json_object(),
                                               json_string(finish_reason(o, chunk)), lp));
        lp = NULL;
        if (o->include_usage) {
            json_t *u = chunk_base(o, chunk, "chat.completion.chunk");
            json_object_set_new(u, "choices", json_array());
            json_object_set_new(u, "usage", usage_obj(chunk));
            out = compat_cat(out, compat_sse_data(u));
        }
    }
    json_decref(lp);
    json_decref(chunk);
    return out ? out : strdup("");
}

static json_t *chat_reply(srv_encoder *e, json_t *last) {
    oai_enc *o = (oai_enc *)e;
    if (json_object_get(last, "_debug_info")) return last;
    json_t *msg = json_object_get(last, "message");
    json_t *calls = json_object_get(msg, "tool_calls");
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", compat_text(msg, "content"));
    if (compat_text_len(msg, "thinking") > 0)
        json_object_set_new(m, "reasoning", compat_text(msg, "thinking"));
    if (json_array_size(calls) > 0) json_object_set_new(m, "tool_calls", oai_tool_calls(o, calls));
    json_t *r = chunk_base(o, last, "chat.completion");
    json_t *choice = json_pack("{s:i, s:o, s:s}", "index", 0, "message", m, "finish_reason",
                               finish_reason(o, last));
    json_t *lp = chat_logprobs(json_object_get(last, "logprobs"));
    if (lp) json_object_set_new(choice, "logprobs", lp);
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    json_object_set_new(r, "usage", usage_obj(last));
    json_decref(last);
    return r;
}

static char *completion_frame(srv_encoder *e, json_t *chunk) {
    oai_enc *o = (oai_enc *)e;
    if (json_object_get(chunk, "_debug_info")) return compat_sse_data(chunk);
    bool done = json_is_true(json_object_get(chunk, "done"));
    json_t *ch = chunk_base(o, chunk, "text_completion");
    json_t *choice = json_pack("{s:o, s:i, s:o}", "text", compat_text(chunk, "response"), "index", 0,
                               "finish_reason",
                               done ? json_string(finish_reason(o, chunk)) : json_null());
    json_t *lp = completion_logprobs(json_object_get(chunk, "logprobs"), &o->text_offset);
    if (lp) json_object_set_new(choice, "logprobs", lp);
    json_object_set_new(ch, "choices", json_pack("[o]", choice));
    if (o->include_usage)
        json_object_set_new(ch, "usage", json_pack("{s:i, s:i, s:i}", "prompt_tokens", 0,
                                                   "completion_tokens", 0, "total_tokens", 0));
    char *out = compat_sse_data(ch);
    if (done && o->include_usage) {
        json_t *u = chunk_base(o, chunk, "text_completion");
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", usage_obj(chunk));
        out = compat_cat(out, compat_sse_data(u));
    }
    json_decref(chunk);
    return out;
}

static json_t *completion_reply(srv_encoder *e, json_t *last) {
    oai_enc *o = (oai_enc *)e;
    if (json_object_get(last, "_debug_info")) return last;
    json_t *r = chunk_base(o, last, "text_completion");
    json_t *choice = json_pack("{s:o, s:i, s:s}", "text", compat_text(last, "response"), "index", 0,
                               "finish_reason", finish_reason(o, last));
    json_t *lp = completion_logprobs(json_object_get(last, "logprobs"), &o->text_offset);
    if (lp) json_object_set_new(choice, "logprobs", lp);
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    json_object_set_new(r, "usage", usage_obj(last));
    json_decref(last);
    return r;
}

static char *b64_floats(const json_t *arr) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = json_array_size(arr), nb = n * 4;
    unsigned char *bytes = malloc(nb ? nb : 1);
    char *out = malloc((nb + 2) / 3 * 4 + 1);
    if (!bytes || !out) {
        free(bytes);
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        float f = (float)json_number_value(json_array_get(arr, i));
        uint32_t u;
        memcpy(&u, &f, 4);
        for (int k = 0; k < 4; k++) bytes[i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k));
    }
    size_t o = 0;
    for (size_t i = 0; i < nb; i += 3) {
        uint32_t v = (uint32_t)bytes[i] << 16;
        if (i + 1 < nb) v |= (uint32_t)bytes[i + 1] << 8;
        if (i + 2 < nb) v |= bytes[i + 2];
        out[o++] = tbl[(v >> 18) & 63];
        out[o++] = tbl[(v >> 12) & 63];
        out[o++] = i + 1 < nb ? tbl[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < nb ? tbl[v & 63] : '=';
    }
    out[o] = '\0';
    free(bytes);
    return out;
}

static json_t *embed_reply(srv_encoder *e, json_t *last) {
    oai_enc *o = (oai_enc *)e;
    json_t *data = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(last, "embeddings"), i, v) {
        json_t *emb;
        if (o->base64) {
            char *b = b64_floats(v);
            emb = json_string(b ? b : "");
            free(b);
        } else {
            emb = json_incref(v);
        }
        json_array_append_new(data, json_pack("{s:s, s:o, s:i}", "object", "embedding",
                                              "embedding", emb, "index", (int)i));
    }
    const char *model = json_string_value(json_object_get(last, "model"));
    json_int_t p = json_integer_value(json_object_get(last, "prompt_eval_count"));
    json_t *r = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data,
                          "model", model ? model : "", "usage", "prompt_tokens", p,
                          "total_tokens", p);
    json_decref(last);
    return r;
}

/* Allocates the request's encoder (errors are OpenAI-shaped from here on). */
static oai_enc *attach(srv_request *r, oai_kind kind) {
    oai_enc *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->created = (int64_t)time(NULL);
    /* Ollama's ids are small random numbers; the prefix is what clients look at */
    char hex[9];
    compat_random_hex(hex, 8);
    snprintf(o->id, sizeof o->id, "%s-%u", kind == OAI_COMPLETION ? "cmpl" : "chatcmpl",
             (unsigned)(strtoul(hex, NULL, 16) % 999));
    o->base.content_type = "text/event-stream";
    o->base.error_body = enc_error_body;
    o->base.error_frame = enc_error_frame;
    o->base.end = enc_end;
    o->base.destroy = enc_destroy;
    if (kind == OAI_CHAT) {
        o->base.frame = chat_frame;
        o->base.reply = chat_reply;
    } else if (kind == OAI_COMPLETION) {
        o->base.frame = completion_frame;
        o->base.reply = completion_reply;
    } else if (kind == OAI_EMBED) {
        o->base.reply = embed_reply;
    }
    srv_encoder_free(r->enc);
    r->enc = &o->base;
    return o;
}

bool compat_attach_openai_chat(srv_request *r) { return attach(r, OAI_CHAT) != NULL; }

/* ---------------- request translation ---------------- */

/* model, stream, stream_options, sampling options shared by chat and completions. */
static bool common_fields(srv_err *x, oai_enc *o, const json_t *in, json_t *out,
                          bool completion) {
    json_t *model = json_object_get(in, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return srv_err_set(x, 400, "invalid type for 'model': expected a string, got %s",
                           srv_json_kind(model));
    if (model) json_object_set(out, "model", model);
    json_t *stream = json_object_get(in, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream))
        return srv_err_set(x, 400, "invalid type for 'stream': expected a boolean, got %s",
                           srv_json_kind(stream));
    json_object_set_new(out, "stream", json_boolean(json_is_true(stream)));
    json_t *so = json_object_get(in, "stream_options");
    if (json_is_object(so)) o->include_usage = json_is_true(json_object_get(so, "include_usage"));

    json_t *opts = json_object();
    json_object_set_new(out, "options", opts);
    bool bad = false;
    double v;
    /* OpenAI's defaults, not the model's: temperature and top_p 1.0 */
    json_object_set_new(opts, "temperature",
                        json_real(compat_number(in, "temperature", &v, &bad) ? v : 1.0));
    if (bad) return srv_err_set(x, 400, "invalid type for 'temperature': expected a number");
    double top_p = 1.0;
    if (compat_number(in, "top_p", &v, &bad)) top_p = completion && v == 0 ? 1.0 : v;
    if (bad) return srv_err_set(x, 400, "invalid type for 'top_p': expected a number");
    json_object_set_new(opts, "top_p", json_real(top_p));
    static const char *const pen[] = {"frequency_penalty", "presence_penalty"};
    for (int i = 0; i < 2; i++) {
        if (compat_number(in, pen[i], &v, &bad)) json_object_set_new(opts, pen[i], json_real(v));
        else if (completion) json_object_set_new(opts, pen[i], json_real(0));
        if (bad) return srv_err_set(x, 400, "invalid type for '%s': expected a number", pen[i]);
    }
    json_t *seed = json_object_get(in, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return srv_err_set(x, 400, "invalid type for 'seed': expected an integer");
        json_object_set(opts, "seed", seed);
    }
    /* max_tokens; max_completion_tokens (its newer name) when max_tokens is absent */
    static const char *const mt[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        json_t *m = json_object_get(in, mt[i]);
        if (!m || json_is_null(m)) continue;
        if (!json_is_integer(m))
            return srv_err_set(x, 400, "invalid type for '%s': expected an integer", mt[i]);
        if (!json_object_get(opts, "num_predict")) json_object_set(opts, "num_predict", m);
    }
    json_t *stop = json_object_get(in, "stop");
    if (json_is_string(stop)) {
        json_object_set_new(opts, "stop", json_pack("[O]", stop));
    } else if (json_is_array(stop)) {
        size_t i;
        json_t *s;
        json_array_foreach(stop, i, s) if (!json_is_string(s)) return srv_err_set(
            x, 400, "invalid type for 'stop' field: %s", srv_json_kind(s));
        json_object_set(opts, "stop", stop);
    } else if (stop && !json_is_null(stop)) {
        return srv_err_set(x, 400, "invalid type for 'stop' field: %s", srv_json_kind(stop));
    }
    json_t *dbg = json_object_get(in, "_debug_render_only");
    if (json_is_true(dbg)) json_object_set_new(out, "_debug_render_only", json_true());
    return true;
}

/* Looks up a tool call's function name by id among earlier assistant messages. */
static const char *tool_name_for(const json_t *native_msgs, const char *id) {
    for (size_t i = json_array_size(native_msgs); i-- > 0;) {
        json_t *calls = json_object_get(json_array_get(native_msgs, i), "tool_calls");
        size_t k;
        json_t *tc;
        json_array_foreach(calls, k, tc) {
            const char *tid = json_string_value(json_object_get(tc, "id"));
            if (tid && !strcmp(tid, id))
                return json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        }
    }
    return NULL;
}

static bool translate_messages(srv_err *x, const json_t *in, json_t *out) {
    json_t *msgs = json_object_get(in, "messages");
    if (msgs && !json_is_null(msgs) && !json_is_array(msgs))
        return srv_err_set(x, 400, "invalid type for 'messages': expected an array, got %s",
                           srv_json_kind(msgs));
    if (json_array_size(msgs) == 0) return srv_err_set(x, 400, "[] is too short - 'messages'");
    json_t *native = json_array();
    json_object_set_new(out, "messages", native);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m))
            return srv_err_set(x, 400, "invalid type for 'messages[%zu]': expected an object", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role)
            return srv_err_set(x, 400, "missing required parameter: 'messages[%zu].role'", i);
        if (!strcmp(role, "developer")) role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return srv_err_set(x, 400,
                               "invalid value for 'messages[%zu].role': \"%s\" (must be \"system\", "
                               "\"developer\", \"user\", \"assistant\" or \"tool\")", i, role);
        json_t *content = json_object_get(m, "content");
        json_t *calls = json_object_get(m, "tool_calls");
        json_t *ncalls = NULL;
        if (json_array_size(calls) > 0) {
            ncalls = json_array();
            size_t k;
            json_t *tc;
            json_array_foreach(calls, k, tc) {
                json_t *fn = json_object_get(tc, "function");
                const char *name = json_string_value(json_object_get(fn, "name"));
                json_t *args = json_object_get(fn, "arguments");
                json_t *parsed = NULL;
                if (json_is_string(args)) {
                    const char *a = json_string_value(args);
                    parsed = *a ? json_loads(a, JSON_DECODE_ANY, NULL) : json_object();
                } else if (json_is_object(args)) {
                    parsed = json_incref(args);
                }
                if (!parsed || !name) {
                    json_decref(parsed);
                    json_decref(ncalls);
                    return srv_err_set(x, 400, "invalid tool call arguments");
                }
                json_t *nc = json_pack("{s:{s:s, s:o}}", "function", "name", name, "arguments", parsed);
                json_t *id = json_object_get(tc, "id");
                if (json_is_string(id)) json_object_set(nc, "id", id);
                json_array_append_new(ncalls, nc);
            }
        }
        json_t *base = json_pack("{s:s}", "role", role);
        json_t *reasoning = json_object_get(m, "reasoning");
        if (json_is_string(reasoning)) json_object_set(base, "thinking", reasoning);
        if (!strcmp(role, "tool")) {
            json_t *name = json_object_get(m, "name");
            const char *tid = json_string_value(json_object_get(m, "tool_call_id"));
            const char *tn = json_is_string(name) ? json_string_value(name)
                                                  : tid ? tool_name_for(native, tid) : NULL;
            if (tn) json_object_set_new(base, "tool_name", json_string(tn));
            if (tid) json_object_set_new(base, "tool_call_id", json_string(tid));
        }
        if (json_is_string(content)) {
            json_t *nm = json_deep_copy(base);
            json_object_set(nm, "content", content);
            if (ncalls) json_object_set(nm, "tool_calls", ncalls);
            json_array_append_new(native, nm);
        } else if (json_is_array(content)) {
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                const char *type = json_string_value(json_object_get(part, "type"));
                json_t *nm = json_deep_copy(base);
                if (type && !strcmp(type, "text") && json_is_string(json_object_get(part, "text"))) {
                    json_object_set(nm, "content", json_object_get(part, "text"));
                } else if (type && !strcmp(type, "image_url")) {
                    json_t *iu = json_object_get(part, "image_url");
                    const char *url = json_is_string(iu) ? json_string_value(iu)
                                                         : json_string_value(json_object_get(iu, "url"));
                    bool remote = url && (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8));
                    const char *b64 = url ? strstr(url, ";base64,") : NULL;
                    if (remote || !b64 || strncmp(url, "data:", 5)) {
                        json_decref(nm);
                        json_decref(base);
                        json_decref(ncalls);
                        if (!remote) return srv_err_set(x, 400, "invalid image input");
                        return srv_err_set(x, 400, "image URLs are not currently supported, "
                                                   "please use base64 encoded data instead");
                    }
                    /* the native layer says whether the model does vision */
                    json_object_set_new(nm, "content", json_string(""));
                    json_object_set_new(nm, "images", json_pack("[s]", b64 + 8));
                } else {
                    json_decref(nm);
                    json_decref(base);
                    json_decref(ncalls);
                    return srv_err_set(x, 400, "invalid message content type: %s",
                                       type ? type : srv_json_kind(part));
                }
                if (ncalls && k + 1 == json_array_size(content))
                    json_object_set(nm, "tool_calls", ncalls);
                json_array_append_new(native, nm);
            }
        } else if ((!content || json_is_null(content)) && ncalls) {
            json_t *nm = json_deep_copy(base);
            json_object_set_new(nm, "content", json_string(""));
            json_object_set(nm, "tool_calls", ncalls);
            json_array_append_new(native, nm);
        } else {
            json_decref(base);
            json_decref(ncalls);
            return srv_err_set(x, 400, "invalid message content type: %s", srv_json_kind(content));
        }
        json_decref(base);
        json_decref(ncalls);
    }
    return true;
}

/* response_format -> the native format (enforced by the grammar engine, grammar.h). */
static bool translate_response_format(srv_err *x, const json_t *in, json_t *out) {
    json_t *rf = json_object_get(in, "response_format");
    if (json_is_object(rf)) {
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (t && !strcmp(t, "json_object")) {
            json_object_set_new(out, "format", json_string("json"));
        } else if (t && !strcmp(t, "json_schema")) {
            json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
            json_object_set(out, "format", json_is_object(schema) ? schema : json_string("json"));
        } else if (t && strcmp(t, "text")) {
            return srv_err_set(x, 400, "invalid value for 'response_format.type': \"%s\"", t);
        }
    } else if (rf && !json_is_null(rf)) {
        return srv_err_set(x, 400, "invalid type for 'response_format': expected an object");
    }
    return true;
}

static bool translate_chat(srv_err *x, oai_enc *o, const json_t *in, json_t *out) {
    if (!common_fields(x, o, in, out, false) || !translate_messages(x, in, out)) return false;
    if (!translate_response_format(x, in, out)) return false;
    json_t *tools = json_object_get(in, "tools");
    if (tools && !json_is_null(tools)) json_object_set(out, "tools", tools);
    compat_tool_choice(json_object_get(in, "tool_choice"), out);
    const char *effort = json_string_value(json_object_get(in, "reasoning_effort"));
    if (!effort) effort = json_string_value(json_object_get(json_object_get(in, "reasoning"), "effort"));
    if (effort && *effort) {
        if (!strcmp(effort, "none")) json_object_set_new(out, "think", json_false());
        else if (!strcmp(effort, "minimal")) json_object_set_new(out, "think", json_string("low"));
        else if (!strcmp(effort, "low") || !strcmp(effort, "medium") || !strcmp(effort, "high") ||
                 !strcmp(effort, "max"))
            json_object_set_new(out, "think", json_string(effort));
        else if (!strcmp(effort, "xhigh") || !strcmp(effort, "ultra"))
            json_object_set_new(out, "think", json_string("max"));
        else
            return srv_err_set(x, 400,
                               "invalid reasoning value: \"%s\" (must be \"minimal\", \"low\", "
                               "\"medium\", \"high\", \"xhigh\", \"ultra\", \"max\", or \"none\")",
                               effort);
    }
    json_t *tl = json_object_get(in, "top_logprobs");
    if (tl && !json_is_null(tl)) json_object_set(out, "top_logprobs", tl);
    json_t *lp = json_object_get(in, "logprobs");
    if (json_is_boolean(lp)) json_object_set(out, "logprobs", lp);
    return true;
}

static bool translate_completion(srv_err *x, oai_enc *o, const json_t *in, json_t *out) {
    if (!common_fields(x, o, in, out, true)) return false;
    json_t *prompt = json_object_get(in, "prompt");
    /* a list of prompts asks for one completion each (OpenAI's batch form): one prompt
     * in a list is that prompt; several are refused, as n > 1 is */
    if (json_is_array(prompt)) {
        if (json_array_size(prompt) != 1)
            return srv_err_set(x, 400, "'prompt' as a list must hold exactly one string (got %zu): "
                                       "send one request per prompt", json_array_size(prompt));
        prompt = json_array_get(prompt, 0);
        if (!json_is_string(prompt))
            return srv_err_set(x, 400, "invalid type for 'prompt[0]': %s (token ids are not "
                                       "supported, send text)", srv_json_kind(prompt));
    }
    if (prompt && !json_is_null(prompt) && !json_is_string(prompt))
        return srv_err_set(x, 400, "invalid type for 'prompt' field: %s", srv_json_kind(prompt));
    json_object_set_new(out, "prompt", json_string(json_is_string(prompt) ? json_string_value(prompt) : ""));
    json_t *suffix = json_object_get(in, "suffix");
    if (json_is_string(suffix)) json_object_set(out, "suffix", suffix);
    if (!translate_response_format(x, in, out)) return false;
    json_t *lp = json_object_get(in, "logprobs");
    if (json_is_integer(lp) && json_integer_value(lp) > 0) {
        json_object_set_new(out, "logprobs", json_true());
        json_object_set(out, "top_logprobs", lp);
    }
    return true;
}

static enum MHD_Result run_translated(srv_request *r, oai_kind kind,
                                      bool (*tr)(srv_err *, oai_enc *, const json_t *, json_t *),
                                      srv_native native) {
    oai_enc *o = attach(r, kind);
    if (!o) return srv_reply_error(r, 500, "out of memory");
    enum MHD_Result ret;
    json_t *in = srv_parse_body(r, &ret);
    if (!in) return ret;
    json_t *out = json_object();
    srv_err x = {0};
    bool ok = tr(&x, o, in, out);
    json_decref(in);
    if (!ok) {
        json_decref(out);
        return srv_reply_error(r, x.status, "%s", x.msg);
    }
    return srv_native_run(r, native, out);
}

enum MHD_Result srv_handle_oai_chat(srv_request *r) {
    return run_translated(r, OAI_CHAT, translate_chat, SRV_NATIVE_CHAT);
}

enum MHD_Result srv_handle_oai_completions(srv_request *r) {
    return run_translated(r, OAI_COMPLETION, translate_completion, SRV_NATIVE_GENERATE);
}

static bool translate_embed(srv_err *x, oai_enc *o, const json_t *in, json_t *out) {
    json_t *model = json_object_get(in, "model");
    if (model) json_object_set(out, "model", model);
    json_t *input = json_object_get(in, "input");
    json_t *list = json_array();
    json_object_set_new(out, "input", list);
    if (json_is_string(input)) {
        json_array_append(list, input);
    } else if (json_is_array(input) && json_array_size(input) > 0) {
        size_t i;
        json_t *v;
        json_array_foreach(input, i, v) {
            if (!json_is_string(v)) return srv_err_set(x, 400, "invalid input");
            json_array_append(list, v);
        }
    } else {
        return srv_err_set(x, 400, "invalid input");
    }
    json_t *dims = json_object_get(in, "dimensions");
    if (dims && !json_is_null(dims)) json_object_set(out, "dimensions", dims);
    json_t *fmt = json_object_get(in, "encoding_format");
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (f && !strcmp(f, "base64")) o->base64 = true;
        else if (!f || strcmp(f, "float")) {
            char *raw = json_dumps(fmt, JSON_ENCODE_ANY);
            srv_err_set(x, 400, "Invalid value for 'encoding_format' = %s. Supported values: "
                          "['float', 'base64'].", f ? f : raw ? raw : "?");
            free(raw);
            return false;
        }
    }
    return true;
}

enum MHD_Result srv_handle_oai_embeddings(srv_request *r) {
    return run_translated(r, OAI_EMBED, translate_embed, SRV_NATIVE_EMBED);
}

/* ---------------- models ---------------- */

static json_t *model_obj(const store_entry *e) {
    char name[512];
    store_name_display(&e->name, name, sizeof name);
    return json_pack("{s:s, s:s, s:I, s:s}", "id", name, "object", "model", "created",
                     (json_int_t)(e->mtime_ns / 1000000000), "owned_by", e->name.ns);
}

enum MHD_Result srv_handle_oai_models(srv_request *r) {
    if (!attach(r, OAI_PLAIN)) return srv_reply_error(r, 500, "out of memory");
    store_entry *entries;
    size_t n;
    hl_err err;
    if (store_list(r->srv->st, &entries, &n, &err) != HL_OK) return srv_reply_error(r, 500, "%s", err.msg);
    json_t *data = n ? json_array() : json_null();
    for (size_t i = 0; i < n; i++) json_array_append_new(data, model_obj(&entries[i]));
    store_list_free(entries, n);
    return srv_reply_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

enum MHD_Result srv_handle_oai_model(srv_request *r) {
    if (!attach(r, OAI_PLAIN)) return srv_reply_error(r, 500, "out of memory");
    const char *id = r->path + strlen("/v1/models/");
    store_name want, canon;
    if (store_name_parse(id, &want, NULL) != HL_OK || !store_find(r->srv->st, &want, &canon))
        return srv_reply_error(r, 404, "model '%s' not found", id);
    store_entry *entries;
    size_t n;
    hl_err err;
    if (store_list(r->srv->st, &entries, &n, &err) != HL_OK) return srv_reply_error(r, 500, "%s", err.msg);
    json_t *found = NULL;
    char want_name[512], name[512];
    store_name_display(&canon, want_name, sizeof want_name);
    for (size_t i = 0; i < n && !found; i++) {
        store_name_display(&entries[i].name, name, sizeof name);
        if (!strcmp(name, want_name)) found = model_obj(&entries[i]);
    }
    store_list_free(entries, n);
    if (!found) return srv_reply_error(r, 404, "model '%s' not found", id);
    return srv_reply_json(r, 200, found);
}
