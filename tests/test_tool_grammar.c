/* test_tool_grammar.c - tool calls held to the tools' schemas (outproc.h's tool_grammar,
 * grammar.h's lazy grammars) through the server: a synthetic model that opens a
 * <tool_call> after every user turn and then samples uniformly among what the mask
 * leaves, at temperature 1 over many seeds; every call must parse and validate against
 * its tool's parameters (tests/schema_check.c, not the grammar). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tensor/types.h"
#include "grammar/grammar.h"
#include "schema_check.h"
#include "server/outproc.h"
#include "srvproc.h"
#include "test.h"

/* ---- tool_grammar on its own ---- */

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"unit\":{\"enum\":"
    "[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"},\"tags\":{\"type\":"
    "\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},\"maxItems\":3}},\"required\":"
    "[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set_mode\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"mode\":{\"$ref\":\"#/$defs/mode\"},\"on\":{\"type\":\"boolean\"}},"
    "\"required\":[\"mode\",\"on\"],\"$defs\":{\"mode\":{\"enum\":[\"fast\",\"slow\"]}}}}}]";

/* A byte matcher over the composed grammar: whether text is accepted as a whole reply. */
static int reply_ok(const char *format, const char *trig, const char *end, bool now,
                    const char *text) {
    hl_err err;
    gram_schema *s = NULL;
    if (gram_compile(format, strlen(format), &s, &err) != HL_OK) return -1;
    gram_think lz = {.trigger = trig, .trigger_end = end, .trigger_now = now};
    gram_matcher *m = NULL;
    int r = -1;
    if (gram_matcher_create(s, NULL, &lz, &m, &err) == HL_OK)
        r = gram_matcher_feed(m, text, strlen(text)) && gram_matcher_accepting(m);
    gram_matcher_free(m);
    gram_schema_free(s);
    return r;
}

TEST(tool_grammar_composes_tools) {
    json_t *tools = json_loads(k_tools, 0, NULL);
    CHECK(tools);
    const char *trig = NULL, *end = NULL;
    char *f = tool_grammar(tools, "<tool_call>", NULL, &trig, &end);
    CHECK(f && !strcmp(trig, "<tool_call>") && !strcmp(end, "</tool_call>"));
    static const struct {
        const char *text;
        int want;
    } cases[] = {
        {"Sure.", 1},
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 1},
        {"<tool_call>{\"arguments\": {\"a\": 1, \"b\": 2.5}, \"name\": \"add\"}</tool_call> ok", 1},
        {"<tool_call>{\"name\": \"set_mode\", \"arguments\": {\"mode\": \"fast\", \"on\": true}}"
         "</tool_call><tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>", 1},
        {"<tool_call>{\"name\": \"set_mode\", \"arguments\": {\"mode\": \"medium\", \"on\": true}}", 0},
        {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", 0},
        {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"x\": 1}}", 0},
        {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}</tool_call>", 0},
        {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 15}}", 0},
        {"<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", 0}, /* no closer */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_MSG(reply_ok(f, trig, end, false, cases[i].text) == cases[i].want, "case %zu: %s", i,
                  cases[i].text);
    CHECK_EQ_INT(reply_ok(f, trig, end, true, "Sure."), 0);
    CHECK_EQ_INT(reply_ok(f, trig, end, true, cases[1].text), 1);
    free(f);

    /* one tool named by tool_choice */
    f = tool_grammar(tools, "<tool_call>", "add", &trig, &end);
    CHECK(f);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, cases[1].text), 0);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, cases[2].text), 1);
    free(f);

    /* Mistral's [TOOL_CALLS] takes an array and has no closing tag */
    f = tool_grammar(tools, "[TOOL_CALLS]", NULL, &trig, &end);
    CHECK(f && !strcmp(trig, "[TOOL_CALLS]") && !*end);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": "
                                                "{\"a\": 1, \"b\": 2}}]"), 1);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "[TOOL_CALLS] {\"name\": \"add\"}"), 0);
    free(f);

    /* bare JSON calls ("{") have no trigger to wait for: nothing enforced */
    CHECK(tool_grammar(tools, "{", NULL, &trig, &end) == NULL);
    json_decref(tools);

    /* a schema the grammar cannot enforce: that tool's arguments are any object, the
     * others stay enforced (never an error) */
    tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"odd\",\"parameters\":"
                       "{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{\"type\":\"null\"}}}}}},"
                       "{\"type\":\"function\",\"function\":{\"name\":\"plain\",\"parameters\":"
                       "{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"integer\"}}}}},"
                       "{\"type\":\"function\",\"function\":{\"name\":\"noparams\"}}]", 0, NULL);
    CHECK(tools);
    f = tool_grammar(tools, "<tool_call>", NULL, &trig, &end);
    CHECK(f);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "<tool_call>{\"name\": \"odd\", \"arguments\": "
                                                "{\"x\": null, \"z\": [1]}}</tool_call>"), 1);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "<tool_call>{\"name\": \"plain\", \"arguments\": "
                                                "{\"y\": \"s\"}}</tool_call>"), 0);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "<tool_call>{\"name\": \"noparams\", \"arguments\": "
                                                "{\"q\": 1}}</tool_call>"), 1);
    free(f);
    json_decref(tools);

    /* many tools: names enforced, arguments any object */
    json_t *many = json_array();
    for (int i = 0; i < 12; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        json_array_append_new(many, json_pack("{s:s, s:{s:s, s:{s:s, s:{s:{s:s}}}}}", "type",
                                              "function", "function", "name", name, "parameters",
                                              "type", "object", "properties", "n", "type", "integer"));
    }
    f = tool_grammar(many, "<tool_call>", NULL, &trig, &end);
    CHECK(f);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "<tool_call>{\"name\": \"t11\", \"arguments\": "
                                                "{\"n\": \"x\"}}</tool_call>"), 1);
    CHECK_EQ_INT(reply_ok(f, trig, end, false, "<tool_call>{\"name\": \"t12\", \"arguments\": "
                                                "{}}</tool_call>"), 0);
    free(f);
    json_decref(many);
}

/* ---- a model that opens a tool call and then samples uniformly ---- */

/* A one-layer llama GGUF built as a bigram machine (as test_compat.c's toolbot): the
 * embedding of token t is the one-hot e_t and the attention and FFN outputs are zero,
 * so the logits are column t of the output matrix. Column <Q> puts a large logit on
 * <tool_call>; every other column is zero, so the next token is uniform over the
 * vocabulary at temperature 1: without the grammar, the "arguments" would be noise.
 * The template ends the prompt with <Q> after a user turn and with <R> (uniform) after
 * a tool result. */
static const char *const k_cb_tokens[] = {
    "<unk>", "<s>", "</s>", "<Q>", "<R>", "<tool_call>", "</tool_call>", "<0x0A>", "\xe2\x96\x81",
    "{", "}", "[", "]", "\"", ":", ",", "-", ".", "e", "0", "1", "2", "3", "4", "5", "6", "7",
    "8", "9", "\"name\"", "\"arguments\"", "name", "arguments", "get_weather", "add", "set_mode",
    "city", "unit", "days", "celsius", "fahrenheit", "tags", "mode", "fast", "slow", "on",
    "true", "false", "null", "a", "b", "c", "d", "f", "g", "h", "i", "l", "m", "n", "o", "r",
    "s", "t", "u", "w", "y", "_", "Paris", "x"};
enum { CB_V = sizeof k_cb_tokens / sizeof *k_cb_tokens };

static bool write_callbot(const char *path) {
    int32_t types[CB_V];
    float scores[CB_V];
    for (int i = 0; i < CB_V; i++) {
        types[i] = i == 0 ? 2 : i <= 4 ? 3 : i <= 6 ? 4 : i == 7 ? 6 : 1;
        scores[i] = (float)-i;
    }
    gguf_writer *w = gguf_writer_create();
    if (!w) return false;
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.context_length", 1024);
    gguf_writer_set_u32(w, "llama.embedding_length", CB_V);
    gguf_writer_set_u32(w, "llama.block_count", 1);
    gguf_writer_set_u32(w, "llama.feed_forward_length", CB_V);
    gguf_writer_set_u32(w, "llama.attention.head_count", 1);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", 1);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", k_cb_tokens, CB_V);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, CB_V);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, CB_V);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    size_t mat_n = (size_t)CB_V * CB_V;
    float *eye = calloc(mat_n, sizeof *eye), *out = calloc(mat_n, sizeof *out);
    float *zeros = calloc(mat_n, sizeof *zeros), ones[CB_V];
    if (!eye || !out || !zeros) {
        free(eye), free(out), free(zeros);
        gguf_writer_destroy(w);
        return false;
    }
    for (int t = 0; t < CB_V; t++) {
        eye[t * CB_V + t] = 1.0f;
        ones[t] = 1.0f;
    }
    out[5 * CB_V + 3] = 10.0f; /* <Q> -> <tool_call> */
    static const char *const zero_mats[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                            "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                                            "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                                            "blk.0.ffn_down.weight"};
    static const char *const norms[] = {"output_norm.weight", "blk.0.attn_norm.weight",
                                        "blk.0.ffn_norm.weight"};
    int64_t ne2[2] = {CB_V, CB_V}, ne1[1] = {CB_V};
    uint64_t mat = sizeof(float) * mat_n;
    hl_err err;
    hl_status st = gguf_writer_add_tensor(w, "token_embd.weight", HL_TYPE_F32, 2, ne2, eye, mat, &err);
    if (!st) st = gguf_writer_add_tensor(w, "output.weight", HL_TYPE_F32, 2, ne2, out, mat, &err);
    for (size_t i = 0; !st && i < sizeof norms / sizeof norms[0]; i++)
        st = gguf_writer_add_tensor(w, norms[i], HL_TYPE_F32, 1, ne1, ones, sizeof ones, &err);
    for (size_t i = 0; !st && i < sizeof zero_mats / sizeof zero_mats[0]; i++)
        st = gguf_writer_add_tensor(w, zero_mats[i], HL_TYPE_F32, 2, ne2, zeros, mat, &err);
    if (!st) st = gguf_writer_write_file(w, path, &err);
    gguf_writer_destroy(w);
    free(eye), free(out), free(zeros);
    if (st) fprintf(stderr, "    callbot model: %s\n", err.msg);
    return st == HL_OK;
}

static const char *k_cb_template =
    "{{- if .Tools }}{{ range .Tools }}{{ end }}{{ end }}"
    "{{- range $i, $_ := .Messages }}{{ .Content }}"
    "{{- if .ToolCalls }}<tool_call>{{ range .ToolCalls }}{{ json .Function.Arguments }}{{ end }}"
    "</tool_call>{{ end }}"
    "{{- if eq (len (slice $.Messages $i)) 1 }}{{ if eq .Role \"tool\" }}<R>{{ else }}<Q>{{ end }}"
    "{{- end }}{{- end }}";

static bool create_callbot(const srv_proc *p) {
    char path[1100], digest[80];
    snprintf(path, sizeof path, "%s/callbot.gguf", test_tmpdir());
    if (!write_callbot(path)) return false;
    int up = sp_upload_file(p, path, digest);
    if (up != 201 && up != 200) return false;
    json_t *body = json_pack("{s:s, s:{s:s}, s:s, s:b}", "model", "callbot", "files", "m.gguf",
                             digest, "template", k_cb_template, "stream", 0);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    int st = sp_req(p, "POST", "/api/create", text, NULL);
    free(text);
    return st == 200;
}

/* The parameters schema of the tool called name, or NULL. */
static const json_t *tool_params(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        if (!strcmp(json_string_value(json_object_get(fn, "name")), name))
            return json_object_get(fn, "parameters");
    }
    return NULL;
}

static const char *const k_names[3] = {"get_weather", "add", "set_mode"};
static unsigned g_seen; /* bit k: k_names[k] was called */

/* The number of calls in calls (native or OpenAI shape: arguments an object or JSON
 * text) when each names a tool (only, when given) and its arguments validate against
 * its parameters; else -1 with the reason in why. */
static int check_calls(const json_t *tools, const json_t *calls, const char *only, char *why,
                       size_t cap) {
    size_t i;
    json_t *c;
    snprintf(why, cap, "no tool call");
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const json_t *params = name ? tool_params(tools, name) : NULL;
        json_t *args = json_object_get(fn, "arguments"), *parsed = NULL;
        if (json_is_string(args)) args = parsed = json_loads(json_string_value(args), 0, NULL);
        char w[512] = "arguments are not an object";
        bool ok = params && (!only || !strcmp(name, only)) && json_is_object(args) &&
                  schema_check(args, params, params, w, sizeof w);
        json_decref(parsed);
        for (int k = 0; ok && k < 3; k++)
            if (!strcmp(name, k_names[k])) g_seen |= 1u << k;
        if (!ok) {
            char *text = json_dumps(fn, JSON_COMPACT);
            snprintf(why, cap, "%s: %s", params ? w : "not one of the tools", text ? text : "?");
            free(text);
            return -1;
        }
    }
    return (int)json_array_size(calls);
}

enum { N_SEEDS = 40 };

static void callbot_api(srv_proc *p) {
    json_t *tools = json_loads(k_tools, 0, NULL);
    CHECK(tools);
    int calls = 0;
    /* /api/chat: the model opens a call after the user turn (every seed) */
    for (int seed = 1; seed <= N_SEEDS && !test_failed(); seed++) {
        json_t *body = json_pack("{s:s, s:[{s:s, s:s}], s:O, s:b, s:{s:f, s:i, s:i}}", "model",
                                 "callbot", "messages", "role", "user", "content", "Weather?",
                                 "tools", tools, "stream", 0, "options", "temperature", 1.0,
                                 "seed", seed, "num_predict", 600);
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/api/chat", text, &r), 200);
        free(text);
        const json_t *msg = json_object_get(r, "message");
        char why[1024];
        int n = check_calls(tools, json_object_get(msg, "tool_calls"), NULL, why, sizeof why);
        const char *content = json_string_value(json_object_get(msg, "content"));
        CHECK_MSG(n >= 1, "seed %d: %s (content %s)", seed, why, content ? content : "");
        calls += n;
        json_decref(r);
    }
    /* OpenAI chat completions: tool_calls with arguments as JSON text */
    for (int seed = 1; seed <= 10 && !test_failed(); seed++) {
        json_t *body = json_pack("{s:s, s:[{s:s, s:s}], s:O, s:f, s:i, s:i}", "model", "callbot",
                                 "messages", "role", "user", "content", "Weather?", "tools", tools,
                                 "temperature", 1.0, "seed", seed, "max_tokens", 600);
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/v1/chat/completions", text, &r), 200);
        free(text);
        const json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
        const json_t *calls_j = json_object_get(json_object_get(c0, "message"), "tool_calls");
        CHECK(json_is_string(json_object_get(json_object_get(json_array_get(calls_j, 0),
                                                             "function"), "arguments")));
        char why[1024];
        CHECK_MSG(check_calls(tools, calls_j, NULL, why, sizeof why) >= 1, "seed %d: %s", seed, why);
        CHECK_STR(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls");
        json_decref(r);
    }
    /* the Responses API: function_call items (its tools are flat: {type, name, parameters}) */
    json_t *flat = json_array();
    size_t ti;
    json_t *tv;
    json_array_foreach(tools, ti, tv) {
        const json_t *fn = json_object_get(tv, "function");
        json_array_append_new(flat, json_pack("{s:s, s:O, s:O}", "type", "function", "name",
                                              json_object_get(fn, "name"), "parameters",
                                              json_object_get(fn, "parameters")));
    }
    for (int run = 0; run < 5 && !test_failed(); run++) {
        json_t *body = json_pack("{s:s, s:s, s:O, s:f, s:i}", "model", "callbot", "input",
                                 "Weather?", "tools", flat, "temperature", 1.0,
                                 "max_output_tokens", 600);
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/v1/responses", text, &r), 200);
        free(text);
        json_t *calls_j = json_array(), *item;
        size_t k;
        json_array_foreach(json_object_get(r, "output"), k, item) { /* as chat's tool_calls */
            const char *type = json_string_value(json_object_get(item, "type"));
            if (type && !strcmp(type, "function_call"))
                json_array_append_new(calls_j, json_pack("{s:{s:O, s:O}}", "function", "name",
                                                         json_object_get(item, "name"),
                                                         "arguments",
                                                         json_object_get(item, "arguments")));
        }
        char why[1024];
        CHECK_MSG(check_calls(tools, calls_j, NULL, why, sizeof why) >= 1, "responses run %d: %s",
                  run, why);
        json_decref(calls_j);
        json_decref(r);
    }
    json_decref(flat);
    /* after a tool result the model is uniform: tool_choice "required" and a named function
     * make it open a call at once (OpenAI chat, Responses, Anthropic) */
    static const char *const choices[] = {
        "\"required\"", "{\"type\":\"function\",\"function\":{\"name\":\"set_mode\"}}"};
    for (int seed = 1; seed <= 16 && !test_failed(); seed++) {
        const char *only = seed % 2 ? NULL : "set_mode";
        char *tj = json_dumps(tools, JSON_COMPACT);
        char body[8192];
        snprintf(body, sizeof body,
                 "{\"model\":\"callbot\",\"messages\":[{\"role\":\"user\",\"content\":\"Go\"},"
                 "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
                 "\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":"
                 "\"{\\\"a\\\":1,\\\"b\\\":2}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
                 "\"content\":\"3\"}],\"tools\":%s,\"tool_choice\":%s,\"temperature\":1,"
                 "\"seed\":%d,\"max_tokens\":600}", tj, choices[seed % 2 ? 0 : 1], seed);
        free(tj);
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/v1/chat/completions", body, &r), 200);
        const json_t *c0 = json_array_get(json_object_get(r, "choices"), 0);
        const json_t *m = json_object_get(c0, "message");
        char why[1024];
        const char *content = json_string_value(json_object_get(m, "content"));
        CHECK_MSG(check_calls(tools, json_object_get(m, "tool_calls"), only, why, sizeof why) >= 1,
                  "seed %d, tool_choice: %s (content %s)", seed, why, content ? content : "");
        json_decref(r);
    }
    {
        json_t *r = NULL;
        char *tj = json_dumps(tool_params(tools, "get_weather"), JSON_COMPACT);
        char body[8192];
        snprintf(body, sizeof body, /* Anthropic: input_schema, tool_choice {"type":"tool"} */
                 "{\"model\":\"callbot\",\"max_tokens\":600,\"temperature\":1,\"messages\":["
                 "{\"role\":\"user\",\"content\":\"Go\"},{\"role\":\"assistant\",\"content\":["
                 "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"add\",\"input\":{\"a\":1,\"b\":2}}]},"
                 "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
                 "\"content\":\"3\"}]}],\"tools\":[{\"name\":\"get_weather\",\"input_schema\":%s}],"
                 "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\"}}", tj);
        free(tj);
        CHECK_EQ_INT(sp_req(p, "POST", "/v1/messages", body, &r), 200);
        const json_t *b0 = json_array_get(json_object_get(r, "content"), 0);
        size_t i;
        json_t *b;
        bool found = false;
        json_array_foreach(json_object_get(r, "content"), i, b) {
            const char *type = json_string_value(json_object_get(b, "type"));
            if (!type || strcmp(type, "tool_use")) continue;
            found = true;
            char why[512] = "";
            const json_t *ps = tool_params(tools, "get_weather");
            CHECK_MSG(schema_check(json_object_get(b, "input"), ps, ps, why, sizeof why), "%s", why);
        }
        const char *t0 = json_string_value(json_object_get(b0, "text"));
        CHECK_MSG(found, "no tool_use block: %s", t0 ? t0 : "?");
        json_decref(r);
    }
    /* a tool schema outside what the grammar enforces: still served (200), never a 400 */
    {
        json_t *r = NULL;
        CHECK_EQ_INT(sp_req(p, "POST", "/api/chat",
                            "{\"model\":\"callbot\",\"stream\":false,\"messages\":[{\"role\":\"user\","
                            "\"content\":\"x\"}],\"options\":{\"seed\":1,\"num_predict\":200},"
                            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"odd\","
                            "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"not\":"
                            "{\"type\":\"null\"}}}}}}]}", &r), 200);
        const json_t *calls_j = json_object_get(json_object_get(r, "message"), "tool_calls");
        CHECK_MSG(json_array_size(calls_j) >= 1, "no call of the unconstrained tool");
        CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(calls_j, 0),
                                                                    "function"), "name")), "odd");
        json_decref(r);
    }
    CHECK(calls >= N_SEEDS);
    CHECK_EQ_INT(g_seen, 7); /* every tool was called in some run */
    json_decref(tools);
}

TEST(tool_grammar_calls_validate_at_temperature_1) {
    SP_WITH_SERVER("toolgram", NULL, create_callbot, callbot_api);
}
