/* test_api.c - the inference API end to end: $HEARTH_BIN serve on a free loopback port
 * with a temp store, models created from stories260K (plus a copy of it carrying a
 * ChatML Jinja chat template), driven over HTTP and through `hearth run`/`stop`/`ps`.
 * In-process tests cover the pieces (stop strings, thinking, tool calls, Go templates,
 * options). Every server started is stopped, also on failure. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "gguf/gguf.h"
#include "net/http_client.h"
#include "grammar/grammar.h"
#include "server/options.h"
#include "server/outproc.h"
#include "server/prompt.h"
#include "server/sched.h"
#include "srvproc.h"
#include "store/sha256.h"
#include "test.h"

/* ---------------- in-process: output processing ---------------- */

static void feed_all(stop_matcher *m, const char *const *pieces, outbuf *out, bool *stopped) {
    *stopped = false;
    for (int i = 0; pieces[i] && !*stopped; i++)
        *stopped = stop_feed(m, pieces[i], strlen(pieces[i]), out);
    if (!*stopped) stop_flush(m, out);
}

TEST(api_stop_strings_across_tokens) {
    char *stops[] = {"girl named", "XYZ"};
    stop_matcher m;
    outbuf out = {0};
    bool stopped;
    const char *pieces[] = {"a little g", "ir", "l na", "med Lily", NULL};
    stop_init(&m, stops, 2);
    /* nothing of the stop text may come out before the match is decided */
    CHECK(!stop_feed(&m, pieces[0], strlen(pieces[0]), &out));
    CHECK_STR(out.p, "a little ");
    CHECK(!stop_feed(&m, pieces[1], strlen(pieces[1]), &out));
    CHECK_STR(out.p, "a little ");
    CHECK(stop_feed(&m, pieces[2], strlen(pieces[2]), &out) == false);
    CHECK(stop_feed(&m, pieces[3], strlen(pieces[3]), &out));
    CHECK_STR(out.p, "a little ");
    stop_free(&m);
    outbuf_free(&out);

    /* a held-back partial match that fails is released intact */
    const char *p2[] = {"the g", "ood end", NULL};
    stop_init(&m, stops, 2);
    feed_all(&m, p2, &out, &stopped);
    CHECK(!stopped);
    CHECK_STR(out.p, "the good end");
    stop_free(&m);
    outbuf_free(&out);

    /* a partial stop at the very end is flushed as text */
    const char *p3[] = {"ends with XY", NULL};
    stop_init(&m, stops, 2);
    feed_all(&m, p3, &out, &stopped);
    CHECK(!stopped);
    CHECK_STR(out.p, "ends with XY");
    stop_free(&m);
    outbuf_free(&out);

    /* earliest of several stops wins; no stops = passthrough */
    char *s2[] = {"b", "a"};
    const char *p4[] = {"xxab", NULL};
    stop_init(&m, s2, 2);
    feed_all(&m, p4, &out, &stopped);
    CHECK(stopped);
    CHECK_STR(out.p, "xx");
    stop_free(&m);
    outbuf_free(&out);
}

TEST(api_thinking_parser) {
    think_parser t;
    outbuf th = {0}, co = {0};
    const char *pieces[] = {"  <thi", "nk>\n hmm, let", " me think \n</th", "ink>\n\nThe answer", "."};
    think_init(&t, "<think>", "</think>", false);
    for (int i = 0; i < 5; i++) think_feed(&t, pieces[i], strlen(pieces[i]), &th, &co);
    think_flush(&t, &th, &co);
    CHECK_STR(th.p, "hmm, let me think");
    CHECK_STR(co.p, "The answer.");
    think_free(&t);
    outbuf_free(&th);
    outbuf_free(&co);

    /* prompt already opened the tag */
    think_init(&t, "<think>", "</think>", true);
    think_feed(&t, "a</think>b", 10, &th, &co);
    think_flush(&t, &th, &co);
    CHECK_STR(th.p, "a");
    CHECK_STR(co.p, "b");
    think_free(&t);
    outbuf_free(&th);
    outbuf_free(&co);

    /* no tag: all content */
    think_init(&t, "<think>", "</think>", false);
    think_feed(&t, "  <b>hi", 7, &th, &co);
    think_flush(&t, &th, &co);
    CHECK(th.len == 0);
    CHECK_STR(co.p, "<b>hi");
    think_free(&t);
    outbuf_free(&th);
    outbuf_free(&co);
}

TEST(api_tool_call_parser) {
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                               "\"parameters\":{\"type\":\"object\"}}}]", 0, NULL);
    CHECK(tools != NULL);
    /* Qwen/Hermes */
    tool_parser p;
    outbuf content = {0};
    json_t *calls = json_array();
    tool_init(&p, "<tool_call>", tools);
    const char *q[] = {"Sure. <tool", "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",
                       "\"Paris\"}}\n</tool_call>"};
    for (int i = 0; i < 3; i++) tool_feed(&p, q[i], strlen(q[i]), &content);
    tool_flush(&p, calls, &content);
    CHECK_STR(content.p, "Sure. ");
    CHECK_EQ_INT((int)json_array_size(calls), 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK_STR(json_string_value(json_object_get(fn, "name")), "get_weather");
    CHECK_STR(json_string_value(json_object_get(json_object_get(fn, "arguments"), "city")), "Paris");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(fn, "index")), 0);
    const char *id = json_string_value(json_object_get(json_array_get(calls, 0), "id"));
    CHECK(id && strncmp(id, "call_", 5) == 0 && strlen(id) == 13);
    tool_free(&p);
    outbuf_free(&content);
    json_array_clear(calls);

    /* Llama 3.x: bare JSON with "parameters" */
    tool_init(&p, "{", tools);
    const char *l[] = {" {\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Oslo\"}}"};
    for (int i = 0; i < 2; i++) tool_feed(&p, l[i], strlen(l[i]), &content);
    tool_flush(&p, calls, &content);
    CHECK(content.len == 0);
    CHECK_EQ_INT((int)json_array_size(calls), 1);
    tool_free(&p);
    outbuf_free(&content);
    json_array_clear(calls);

    /* ... also after <|python_tag|>, which may arrive in pieces */
    tool_init(&p, "{", tools);
    const char *py[] = {"<|pyth", "on_tag|>", "{\"name\": \"get_weather\", \"parameters\": {}}"};
    for (int i = 0; i < 3; i++) tool_feed(&p, py[i], strlen(py[i]), &content);
    tool_flush(&p, calls, &content);
    CHECK(content.len == 0);
    CHECK_EQ_INT((int)json_array_size(calls), 1);
    tool_free(&p);
    outbuf_free(&content);
    json_array_clear(calls);

    /* an unknown function name or plain text stays content */
    tool_init(&p, "{", tools);
    tool_feed(&p, "{\"name\": \"other\", \"arguments\": {}}", 35, &content);
    tool_flush(&p, calls, &content);
    CHECK_EQ_INT((int)json_array_size(calls), 0);
    CHECK_STR(content.p, "{\"name\": \"other\", \"arguments\": {}}");
    tool_free(&p);
    outbuf_free(&content);
    tool_init(&p, "{", tools);
    tool_feed(&p, "Hello {x}", 9, &content);
    tool_flush(&p, calls, &content);
    CHECK_STR(content.p, "Hello {x}");
    tool_free(&p);
    outbuf_free(&content);
    json_decref(calls);
    json_decref(tools);
}

TEST(api_go_template_subset) {
    char *out = NULL;
    hl_err err;
    CHECK_OK(prompt_render_go("{{ if .System }}<s>{{ .System }}</s>\n{{ end }}U: {{ .Prompt }}\nA: "
                              "{{ .Response }}<eos>",
                              "be nice", "hi", "", &out, &err),
             &err);
    CHECK_STR(out, "<s>be nice</s>\nU: hi\nA: ");
    free(out);
    CHECK_OK(prompt_render_go("{{- if not .System }}none{{ else if .Prompt }}both{{ end -}}  \n"
                              "[{{ .Prompt }}]{{ if and .Prompt .Suffix }}<FIM>{{ .Suffix }}{{ end }}",
                              "", "p", "s", &out, &err),
             &err);
    CHECK_STR(out, "none[p]<FIM>s");
    free(out);
    CHECK(prompt_go_uses_suffix("<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>"));
    CHECK(!prompt_go_uses_suffix("{{ .Prompt }}"));
    CHECK(prompt_render_go("{{ template \"x\" }}", "", "", "", &out, &err) == HL_ERR_UNSUPPORTED);
    CHECK(prompt_render_go("{{ upper .Prompt }}", "", "", "", &out, &err) == HL_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "\"upper\" is not supported") != NULL);
    CHECK(prompt_render_go("{{ $x }}", "", "", "", &out, &err) == HL_ERR_INVALID);
    /* hostile templates end with an error, not a hang or a crash */
    CHECK(prompt_render_go("{{ range 1000000000 }}x{{ end }}", "", "", "", &out, &err) == HL_ERR_INVALID);
    char deep[4096] = "{{ ";
    for (int i = 0; i < 200; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 200; i++) strcat(deep, ")");
    strcat(deep, " }}");
    CHECK(prompt_render_go(deep, "", "", "", &out, &err) != HL_OK);
    char nested[8192] = "";
    for (int i = 0; i < 300; i++) strcat(nested, "{{ if 1 }}");
    CHECK(prompt_render_go(nested, "", "", "", &out, &err) != HL_OK);
    CHECK(prompt_render_go("{{ index .Prompt 5 }}{{ slice .Prompt 9 }}", "", "ab", "", &out, &err) == HL_ERR_INVALID);
    /* functions, variables, pipelines, printf, with, range over a number */
    CHECK_OK(prompt_render_go("{{ $p := .Prompt }}{{ if and (eq $p \"hi\") (ne .System \"\") }}"
                              "{{ len $p }}|{{ slice $p 1 }}|{{ .Prompt | printf \"%q-%s\" \"x\" }}|"
                              "{{ json .System }}{{ end }}{{ with .Suffix }}[{{ . }}]{{ else }}none"
                              "{{ end }}{{ range $i, $c := 3 }}{{ $i }}{{ end }}{{ print 1 2 \"a\" }}",
                              "s", "hi", "", &out, &err),
             &err);
    CHECK_STR(out, "2|i|\"x\"-hi|\"s\"none0121 2a");
    free(out);
    CHECK(prompt_render_go("{{ if .System }}x", "", "", "", &out, &err) == HL_ERR_FORMAT);
    CHECK(prompt_render_go("{{ .Prompt", "", "", "", &out, &err) == HL_ERR_FORMAT);

    /* legacy chat: one run per turn, the last cut after .Response */
    prompt_renderer *pr;
    CHECK_OK(prompt_renderer_create("{{ if .System }}S:{{ .System }} {{ end }}U:{{ .Prompt }} "
                                    "A:{{ .Response }}|",
                                    NULL, NULL, &pr, &err),
             &err);
    json_t *msgs = json_loads("[{\"role\":\"system\",\"content\":\"sys\"},"
                              "{\"role\":\"user\",\"content\":\"one\"},"
                              "{\"role\":\"assistant\",\"content\":\"r1\"},"
                              "{\"role\":\"user\",\"content\":\"two\"}]", 0, NULL);
    CHECK_OK(prompt_render_chat(pr, msgs, NULL, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "S:sys U:one A:r1|U:two A:");
    free(out);
    json_decref(msgs);
    prompt_renderer_free(pr);

    /* Ollama appends {{ .Response }} to a template that mentions neither .Messages nor
     * .Response, so earlier replies stay: U1 A1 U2, not U1 U2; consecutive user messages
     * collate into one .Prompt */
    CHECK_OK(prompt_renderer_create("<{{ .Prompt }}>", NULL, NULL, &pr, &err), &err);
    msgs = json_loads("[{\"role\":\"user\",\"content\":\"U1\"},"
                      "{\"role\":\"assistant\",\"content\":\"A1\"},"
                      "{\"role\":\"user\",\"content\":\"U2\"},"
                      "{\"role\":\"user\",\"content\":\"U2b\"}]", 0, NULL);
    CHECK_OK(prompt_render_chat(pr, msgs, NULL, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "<U1>A1<U2\n\nU2b>");
    free(out);
    prompt_renderer_free(pr);
    /* no template at all: {{ .Prompt }}{{ .Response }} */
    CHECK_OK(prompt_renderer_create(NULL, NULL, NULL, &pr, &err), &err);
    CHECK_OK(prompt_render_chat(pr, msgs, NULL, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "U1A1U2\n\nU2b");
    free(out);
    prompt_renderer_free(pr);
    /* a template that mentions .Response anywhere (here lower-case, via $) is left alone */
    CHECK_OK(prompt_renderer_create("<{{ .Prompt }}>{{ if false }}{{ $.response }}{{ end }}", NULL,
                                    NULL, &pr, &err),
             &err);
    CHECK_OK(prompt_render_chat(pr, msgs, NULL, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "<U1><U2\n\nU2b>");
    free(out);
    prompt_renderer_free(pr);
    json_decref(msgs);

    /* an Ollama-style template over .Messages (Llama 3.2's shape), tools and tool calls */
    static const char *llama_tpl =
        "{{- if or .System .Tools }}<|start_header_id|>system<|end_header_id|>\n"
        "{{- if .System }}\n\n{{ .System }}\n{{- end }}\n"
        "{{- if .Tools }}\n\nTools: {{ range .Tools }}{{ . }}{{ end }}\n{{- end }}<|eot_id|>\n{{- end }}\n"
        "{{- range $i, $_ := .Messages }}\n"
        "{{- $last := eq (len (slice $.Messages $i)) 1 }}\n"
        "{{- if eq .Role \"user\" }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
        "{{ if $last }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ end }}\n"
        "{{- else if eq .Role \"assistant\" }}<|start_header_id|>assistant<|end_header_id|>\n"
        "{{- if .ToolCalls }}\n{{ range .ToolCalls }}{\"name\": \"{{ .Function.Name }}\", \"parameters\": "
        "{{ .Function.Arguments }}}{{ end }}\n"
        "{{- else }}\n\n{{ .Content }}\n{{- end }}{{ if not $last }}<|eot_id|>{{ end }}\n"
        "{{- else if eq .Role \"tool\" }}<|start_header_id|>ipython<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
        "{{ if $last }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ end }}\n"
        "{{- end }}\n{{- end }}";
    CHECK_OK(prompt_renderer_create(llama_tpl, NULL, NULL, &pr, &err), &err);
    CHECK(prompt_renderer_caps(pr).tools && !prompt_renderer_caps(pr).insert);
    msgs = json_loads("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q1\"},"
                      "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
                      "{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},{\"role\":\"tool\",\"content\":\"R\"},"
                      "{\"role\":\"user\",\"content\":\"Q2\"},{\"role\":\"user\",\"content\":\"Q3\"}]",
                      0, NULL);
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    CHECK_OK(prompt_render_chat(pr, msgs, tools, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "<|start_header_id|>system<|end_header_id|>\n\nS\n\nTools: "
                   "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n{\"name\": \"f\", \"parameters\": {\"a\":1}}"
                   "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\nR<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nQ2\n\nQ3<|eot_id|>" /* collated */
                   "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    json_decref(msgs);
    json_decref(tools);
    prompt_renderer_free(pr);

    /* a Jinja TEMPLATE given in a Modelfile is rendered as Jinja; caps from its text */
    CHECK_OK(prompt_renderer_create("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                                    "{% if tools %}T{% endif %}<think></think>",
                                    NULL, NULL, &pr, &err),
             &err);
    CHECK(prompt_renderer_caps(pr).tools && prompt_renderer_caps(pr).thinking);
    msgs = json_loads("[{\"role\":\"user\",\"content\":\"q\"}]", 0, NULL);
    CHECK_OK(prompt_render_chat(pr, msgs, NULL, -1, NULL, &out, &err), &err);
    CHECK_STR(out, "[user]q<think></think>");
    free(out);
    json_decref(msgs);
    prompt_renderer_free(pr);
}

TEST(api_options_and_durations) {
    int64_t ns;
    hl_err err;
    CHECK_OK(opt_parse_duration("5m", &ns, &err), &err);
    CHECK(ns == 300LL * 1000000000);
    CHECK_OK(opt_parse_duration("1h30m", &ns, &err), &err);
    CHECK(ns == 5400LL * 1000000000);
    CHECK_OK(opt_parse_duration("300ms", &ns, &err), &err);
    CHECK(ns == 300000000);
    CHECK_OK(opt_parse_duration("1.5s", &ns, &err), &err);
    CHECK(ns == 1500000000);
    CHECK_OK(opt_parse_duration("-1s", &ns, &err), &err);
    CHECK(ns < 0);
    CHECK(opt_parse_duration("5", &ns, &err) != HL_OK);
    CHECK_STR(err.msg, "time: missing unit in duration \"5\"");
    CHECK(opt_parse_duration("abc", &ns, &err) != HL_OK);
    CHECK(opt_parse_duration("5x", &ns, &err) != HL_OK);

    json_t *v = json_integer(10);
    CHECK_OK(opt_keep_alive(v, &ns, &err), &err);
    CHECK(ns == 10LL * 1000000000);
    json_decref(v);
    v = json_integer(-1);
    CHECK_OK(opt_keep_alive(v, &ns, &err), &err);
    CHECK(ns == SCHED_KEEP_FOREVER);
    json_decref(v);
    v = json_string("-5m");
    CHECK_OK(opt_keep_alive(v, &ns, &err), &err);
    CHECK(ns == SCHED_KEEP_FOREVER);
    json_decref(v);
    CHECK_OK(opt_keep_alive(NULL, &ns, &err), &err);
    CHECK(ns == SCHED_KEEP_UNSET);
    v = json_true();
    CHECK(opt_keep_alive(v, &ns, &err) != HL_OK);
    CHECK_STR(err.msg, "Unsupported type: 'bool'");

    /* every option field maps; params layer under the request's */
    infer_opts o;
    json_t *params = json_loads("{\"temperature\":0.5,\"stop\":[\"a\"],\"num_ctx\":128}", 0, NULL);
    json_t *opts = json_loads(
        "{\"num_ctx\":64,\"num_predict\":7,\"temperature\":0.25,\"top_k\":5,\"top_p\":0.5,"
        "\"min_p\":0.1,\"repeat_penalty\":1.2,\"repeat_last_n\":32,\"presence_penalty\":0.3,"
        "\"frequency_penalty\":0.4,\"seed\":42,\"stop\":[\"x\",\"y\"],\"num_thread\":2,"
        "\"num_batch\":16,\"num_keep\":3,\"bogus_option\":1,\"num_gpu\":0,\"use_mmap\":true}",
        0, NULL);
    CHECK_OK(opt_parse(params, opts, true, &o, &err), &err);
    CHECK_EQ_INT(o.load.num_ctx, 64);
    CHECK_EQ_INT((int)o.num_predict, 7);
    CHECK_NEAR(o.sp.temperature, 0.25, 1e-6);
    CHECK_EQ_INT(o.sp.top_k, 5);
    CHECK_NEAR(o.sp.top_p, 0.5, 1e-6);
    CHECK_NEAR(o.sp.min_p, 0.1, 1e-6);
    CHECK_NEAR(o.sp.repeat_penalty, 1.2, 1e-6);
    CHECK_EQ_INT(o.sp.repeat_last_n, 32);
    CHECK_NEAR(o.sp.presence_penalty, 0.3, 1e-6);
    CHECK_NEAR(o.sp.frequency_penalty, 0.4, 1e-6);
    CHECK(o.sp.seed == 42);
    CHECK_EQ_INT((int)o.n_stop, 2);
    CHECK_STR(o.stop[1], "y");
    CHECK_EQ_INT(o.load.n_threads, 2);
    CHECK_EQ_INT(o.load.num_batch, 16);
    CHECK_EQ_INT(o.num_keep, 3);
    CHECK(o.load.use_mmap);
    opt_free(&o);
    CHECK_OK(opt_parse(params, NULL, true, &o, &err), &err);
    CHECK(!o.load.use_mmap);
    CHECK_NEAR(o.sp.temperature, 0.5, 1e-6);
    CHECK_EQ_INT(o.load.num_ctx, 128);
    CHECK_STR(o.stop[0], "a");
    opt_free(&o);
    json_decref(opts);
    opts = json_loads("{\"temperature\":\"hot\"}", 0, NULL);
    CHECK(opt_parse(NULL, opts, true, &o, &err) != HL_OK);
    CHECK_STR(err.msg, "option \"temperature\" must be of type float32");
    json_decref(opts);
    opts = json_loads("{\"stop\":5}", 0, NULL);
    CHECK(opt_parse(NULL, opts, true, &o, &err) != HL_OK);
    CHECK_STR(err.msg, "option \"stop\" must be of an array of strings");
    json_decref(opts);
    opts = json_loads("{\"temperature\":-1}", 0, NULL);
    CHECK(opt_parse(NULL, opts, true, &o, &err) != HL_OK);
    json_decref(opts);
    json_decref(params);

    opt_format f;
    v = json_string("json");
    CHECK_OK(opt_format_parse(v, &f, &err), &err);
    CHECK(f == OPT_FORMAT_JSON);
    json_decref(v);
    v = json_string("xml");
    CHECK(opt_format_parse(v, &f, &err) != HL_OK);
    CHECK_STR(err.msg, "invalid format: \"xml\"; expected \"json\" or a valid JSON Schema object");
    json_decref(v);
}

/* Feeds text to a byte recognizer of format "json" (grammar.h): 1 when it continues a
 * JSON object (*done: the object is complete), 0 when it cannot, -1 on setup failure. */
static int json_object_prefix(const char *text, size_t n, bool *done) {
    gram_schema *s = NULL;
    gram_matcher *m = NULL;
    if (gram_compile("\"json\"", 6, &s, NULL) != HL_OK) return -1;
    if (gram_matcher_create(s, NULL, NULL, &m, NULL) != HL_OK) {
        gram_schema_free(s);
        return -1;
    }
    int r = gram_matcher_feed(m, text, n);
    if (done) *done = gram_matcher_complete(m);
    gram_matcher_free(m);
    gram_schema_free(s);
    return r;
}

TEST(api_json_format_recognizer) {
    const char *good[] = {"{}", " {\"a\": [1, -2.5e3, 0, 0.5E-2, true, false, null, {\"b\": \"x\\u00e9\\n\\\"\"}]}",
                          "{\"k\":{\"n\":[[],[{}]]}}", "{\"\u00e9t\u00e9\": 1}"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        bool done = false;
        CHECK_MSG(json_object_prefix(good[i], strlen(good[i]), &done) == 1 && done, "%s", good[i]);
        /* every prefix is accepted and not done */
        CHECK(json_object_prefix(good[i], strlen(good[i]) - 1, &done) == 1 && !done);
    }
    const char *bad[] = {"[1]", "\"s\"", "{\"a\" 1}", "{\"a\":01}", "{\"a\":tru }", "{\"a\":1,}",
                         "{}x", "{} ", "{a:1}", "{\"a\":\"\\q\"}", "{\"a\":-}", "{\"a\":1.}",
                         "{\"a\":\"\n\"}", "{\"a\":[1 2]}", "{\"a\":]",
                         "{                     \"a\":1}" /* whitespace run over the cap */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(json_object_prefix(bad[i], strlen(bad[i]), NULL) == 0, "accepted %s", bad[i]);
}

/* ---------------- the server process ---------------- */

#define WITH_SERVER(body_fn)                                                              \
    do {                                                                                 \
        if (!test_shared_path("models/stories260K/stories260K.gguf"))                    \
            SKIP("models/stories260K/stories260K.gguf not found");                       \
        SP_WITH_SERVER("api", NULL, NULL, body_fn);                                            \
    } while (0)

static char *g_resp;
static json_t *g_json; /* g_resp parsed (NULL when not JSON) */

static int req(const srv_proc *p, const char *method, const char *path, const char *body) {
    free(g_resp);
    json_decref(g_json);
    g_resp = NULL;
    g_json = NULL;
    int status = -1;
    hl_err err;
    if (net_http_request(&p->host, method, path, body, body ? strlen(body) : 0, &status, &g_resp,
                         NULL, &err) != HL_OK) {
        fprintf(stderr, "    request %s %s: %s\n", method, path, err.msg);
        return -1;
    }
    g_json = g_resp ? json_loads(g_resp, 0, NULL) : NULL;
    return status;
}

static const char *jstr(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static long long jint(const json_t *o, const char *k) {
    return (long long)json_integer_value(json_object_get(o, k));
}

static const char *resp_error(void) { return jstr(g_json, "error"); }

/* Streams a request: every NDJSON line parsed into an array (g_lines). */
static json_t *g_lines;
static int req_stream(const srv_proc *p, const char *path, const char *body) {
    json_decref(g_lines);
    g_lines = json_array();
    net_http *h;
    hl_err err;
    if (net_http_open(&p->host, "POST", path, "application/json", (int64_t)strlen(body), &h,
                      &err) != HL_OK)
        return -1;
    int code = -1;
    if (net_http_send(h, body, strlen(body), &err) == HL_OK && net_http_finish(h, &err) == HL_OK) {
        code = net_http_status(h);
        char *line;
        size_t len;
        while (net_http_read_line(h, &line, &len, &err) == HL_OK && line) {
            json_t *j = json_loadb(line, len, 0, NULL);
            json_array_append_new(g_lines, j ? j : json_null());
        }
    }
    net_http_close(h);
    return code;
}

/* Creates `name` from a GGUF file with extra create fields (a JSON fragment or ""). */
static bool create_model(const srv_proc *p, const char *name, const char *gguf,
                         const char *extra) {
    char digest[80];
    int up = sp_upload_file(p, gguf, digest);
    if (up != 201 && up != 200) {
        fprintf(stderr, "    upload %s: %d\n", gguf, up);
        return false;
    }
    char body[4096];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"files\":{\"m.gguf\":\"%s\"},\"stream\":false%s%s}",
             name, digest, *extra ? "," : "", extra);
    int st = req(p, "POST", "/api/create", body);
    if (st != 200) fprintf(stderr, "    create %s: %d %s\n", name, st, g_resp ? g_resp : "");
    return st == 200;
}

/* A copy of stories260K with tokenizer.chat_template set (and optionally more keys). */
static const char *k_chatml =
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if not (tools and loop.first and m.role == 'system') %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

static bool write_gguf_ex(const char *src, const char *dst, const char *chat_template,
                          const char *pooling_key, const char *arch);
static bool write_gguf_edit(const char *src, const char *dst, const char *chat_template,
                            const char *pooling_key, const char *arch, int nul_every);

static bool write_templated_gguf(const char *src, const char *dst, const char *chat_template,
                                 const char *pooling_key) {
    return write_gguf_ex(src, dst, chat_template, pooling_key, NULL);
}

/* arch (may be NULL) replaces general.architecture. */
static bool write_gguf_ex(const char *src, const char *dst, const char *chat_template,
                          const char *pooling_key, const char *arch) {
    return write_gguf_edit(src, dst, chat_template, pooling_key, arch, 0);
}

/* nul_every > 0: every nul_every-th token past the byte tokens becomes the byte token
 * <0x00>, so that a generation soon produces NUL bytes. */
static bool write_gguf_edit(const char *src, const char *dst, const char *chat_template,
                            const char *pooling_key, const char *arch, int nul_every) {
    gguf_file *f;
    if (gguf_open(src, &f, NULL) != HL_OK) return false;
    gguf_writer *w = gguf_writer_create();
    bool ok = w != NULL;
    for (int64_t i = 0; ok && i < gguf_n_kv(f); i++) {
        gguf_str ks = gguf_kv_key(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)ks.len, ks.ptr);
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f32;
        bool b;
        gguf_str s;
        switch (gguf_kv_type(f, i)) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_UINT32:
            ok = gguf_get_u32(f, key, &u32) && gguf_writer_set_u32(w, key, u32) == HL_OK;
            break;
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_INT16:
        case GGUF_TYPE_INT32:
            ok = gguf_get_i32(f, key, &i32) && gguf_writer_set_i32(w, key, i32) == HL_OK;
            break;
        case GGUF_TYPE_UINT64:
            ok = gguf_get_u64(f, key, &u64) && gguf_writer_set_u64(w, key, u64) == HL_OK;
            break;
        case GGUF_TYPE_FLOAT32:
        case GGUF_TYPE_FLOAT64:
            ok = gguf_get_f32(f, key, &f32) && gguf_writer_set_f32(w, key, f32) == HL_OK;
            break;
        case GGUF_TYPE_BOOL:
            ok = gguf_get_bool(f, key, &b) && gguf_writer_set_bool(w, key, b) == HL_OK;
            break;
        case GGUF_TYPE_STRING: {
            ok = gguf_get_str(f, key, &s);
            char *v = ok ? strndup(s.ptr, s.len) : NULL;
            ok = v && gguf_writer_set_str(w, key, v) == HL_OK;
            free(v);
            break;
        }
        case GGUF_TYPE_ARRAY: {
            gguf_type et;
            uint64_t n;
            ok = gguf_get_arr(f, key, &et, &n);
            if (!ok) break;
            if (et == GGUF_TYPE_STRING) {
                char **v = calloc(n ? n : 1, sizeof *v);
                bool nul = nul_every > 0 && strcmp(key, "tokenizer.ggml.tokens") == 0;
                for (uint64_t j = 0; v && j < n; j++) {
                    gguf_str e = gguf_arr_str(f, key, j);
                    v[j] = nul && j > 258 && j % (uint64_t)nul_every == 0
                               ? strdup("<0x00>") : strndup(e.ptr ? e.ptr : "", e.len);
                }
                ok = v && gguf_writer_set_arr_str(w, key, (const char *const *)v, n) == HL_OK;
                for (uint64_t j = 0; v && j < n; j++) free(v[j]);
                free(v);
            } else if (nul_every > 0 && strcmp(key, "tokenizer.ggml.token_type") == 0 &&
                       et == GGUF_TYPE_INT32) {
                int32_t *types = malloc((n ? n : 1) * sizeof *types);
                ok = types != NULL;
                if (ok) memcpy(types, gguf_arr_data(f, key), n * sizeof *types);
                for (uint64_t j = 259; ok && j < n; j++)
                    if (j % (uint64_t)nul_every == 0) types[j] = 6; /* byte */
                ok = ok && gguf_writer_set_arr(w, key, et, types, n) == HL_OK;
                free(types);
            } else {
                ok = gguf_writer_set_arr(w, key, et, gguf_arr_data(f, key), n) == HL_OK;
            }
            break;
        }
        default: ok = false;
        }
    }
    if (ok && chat_template) ok = gguf_writer_set_str(w, "tokenizer.chat_template", chat_template) == HL_OK;
    if (ok && pooling_key) ok = gguf_writer_set_u32(w, pooling_key, 3) == HL_OK; /* last */
    if (ok && arch) ok = gguf_writer_set_str(w, "general.architecture", arch) == HL_OK;
    for (int64_t i = 0; ok && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        ok = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes, NULL) == HL_OK;
    }
    if (ok) ok = gguf_writer_write_file(w, dst, NULL) == HL_OK;
    gguf_writer_destroy(w);
    gguf_close(f);
    return ok;
}

static const char *stories(void) { return test_shared_path("models/stories260K/stories260K.gguf"); }

/* The text `hearth generate --temp 0` prints for a prompt. */
static bool cli_generate_text(const char *prompt, int n, char *out, size_t cap);

/* ---------------- /api/generate ---------------- */

static void concat_responses(const json_t *lines, const char *field, char *out, size_t cap) {
    out[0] = '\0';
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l) {
        const json_t *holder = strcmp(field, "message") == 0 ? json_object_get(l, "message") : l;
        const char *t = jstr(holder, strcmp(field, "message") == 0 ? "content" : field);
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s", t);
    }
}

static void generate_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    /* streamed, raw, greedy, exact num_predict */
    const char *body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,"
                       "\"options\":{\"temperature\":0,\"num_predict\":20}}";
    CHECK_EQ_INT(req_stream(p, "/api/generate", body), 200);
    size_t n = json_array_size(g_lines);
    CHECK(n >= 2);
    json_t *last = json_array_get(g_lines, n - 1);
    CHECK(json_is_true(json_object_get(last, "done")));
    CHECK_STR(jstr(last, "done_reason"), "length");
    CHECK_EQ_INT((int)jint(last, "eval_count"), 20);
    CHECK(json_object_get(last, "context") == NULL); /* omitted when raw */
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *l = json_array_get(g_lines, i);
        CHECK(json_is_false(json_object_get(l, "done")));
        CHECK_STR(jstr(l, "model"), "s260");
        const char *ts = jstr(l, "created_at");
        CHECK(strlen(ts) == 30 && ts[29] == 'Z' && ts[19] == '.'); /* RFC 3339, ns, UTC */
    }
    char streamed[4096], expect[4096];
    concat_responses(g_lines, "response", streamed, sizeof streamed);
    CHECK(cli_generate_text("Once upon a time", 20, expect, sizeof expect));
    CHECK_STR(streamed, expect);

    /* non-stream: same text, metrics sane */
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"temperature\":0,\"num_predict\":20}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    CHECK_STR(jstr(g_json, "response"), expect);
    CHECK(json_is_true(json_object_get(g_json, "done")));
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 20);
    CHECK_EQ_INT((int)jint(g_json, "prompt_eval_count"), 5);
    long long total = jint(g_json, "total_duration"), load = jint(g_json, "load_duration");
    long long pd = jint(g_json, "prompt_eval_duration"), ed = jint(g_json, "eval_duration");
    CHECK(total > 0 && pd > 0 && ed > 0 && load >= 0);
    CHECK(total >= pd + ed && total >= load);

    /* logprobs: one entry per generated token, with the requested alternatives */
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"logprobs\":true,\"top_logprobs\":3,\"options\":{\"temperature\":0,\"num_predict\":6}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    json_t *lps = json_object_get(g_json, "logprobs");
    CHECK_EQ_INT((int)json_array_size(lps), 6);
    char joined[1024] = "";
    for (size_t k = 0; k < json_array_size(lps); k++) {
        json_t *e = json_array_get(lps, k);
        double lp = json_number_value(json_object_get(e, "logprob"));
        CHECK(lp <= 0);
        json_t *top = json_object_get(e, "top_logprobs");
        CHECK_EQ_INT((int)json_array_size(top), 3);
        CHECK_STR(jstr(json_array_get(top, 0), "token"), jstr(e, "token")); /* greedy */
        CHECK(json_number_value(json_object_get(json_array_get(top, 1), "logprob")) <=
              json_number_value(json_object_get(json_array_get(top, 0), "logprob")));
        strncat(joined, jstr(e, "token"), sizeof joined - strlen(joined) - 1);
    }
    CHECK(strncmp(expect, joined, strlen(joined)) == 0);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"a\",\"stream\":false,"
                     "\"options\":{\"num_predict\":2}}"), 200);
    CHECK(json_object_get(g_json, "logprobs") == NULL);

    /* templated (default {{ .Prompt }}) with the context round trip */
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"stream\":false,"
           "\"options\":{\"temperature\":0,\"num_predict\":8}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    json_t *ctx = json_incref(json_object_get(g_json, "context"));
    CHECK(json_is_array(ctx));
    CHECK_EQ_INT((int)json_array_size(ctx), 5 + 8);
    char first[1024];
    snprintf(first, sizeof first, "%s", jstr(g_json, "response"));
    char *ctxs = json_dumps(ctx, JSON_COMPACT);
    char b2[8192];
    snprintf(b2, sizeof b2, "{\"model\":\"s260\",\"prompt\":\" The\",\"stream\":false,\"context\":%s,"
             "\"options\":{\"temperature\":0,\"num_predict\":4}}", ctxs);
    free(ctxs);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", b2), 200);
    long long pe = jint(g_json, "prompt_eval_count"); /* context + " The" (no second BOS) */
    CHECK(pe > 13 && pe <= 13 + 3);
    json_t *ctx2 = json_object_get(g_json, "context");
    CHECK_EQ_INT((int)json_array_size(ctx2), (int)pe + 4);
    CHECK(json_integer_value(json_array_get(ctx2, 13)) != 1);
    for (size_t i = 0; i < json_array_size(ctx); i++)
        CHECK(json_integer_value(json_array_get(ctx, i)) == json_integer_value(json_array_get(ctx2, i)));
    json_decref(ctx);

    /* stop sequences, across token boundaries ("g"+"ir"+"l"), streamed and not */
    const char *cut = strstr(expect, "irl n");
    CHECK(cut != NULL);
    char want[4096];
    snprintf(want, sizeof want, "%.*s", cut ? (int)(cut - expect) : 0, expect);
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"temperature\":0,\"num_predict\":20,\"stop\":[\"irl n\",\"zzz\"]}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    CHECK_STR(jstr(g_json, "response"), want);
    CHECK_STR(jstr(g_json, "done_reason"), "stop");
    CHECK(jint(g_json, "eval_count") < 20);
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,"
           "\"options\":{\"temperature\":0,\"num_predict\":20,\"stop\":[\"irl n\"]}}";
    CHECK_EQ_INT(req_stream(p, "/api/generate", body), 200);
    concat_responses(g_lines, "response", streamed, sizeof streamed);
    CHECK_STR(streamed, want);
    size_t i;
    json_t *l;
    json_array_foreach(g_lines, i, l) CHECK(strstr(jstr(l, "response"), "ir") == NULL ||
                                            strstr(want, jstr(l, "response")) != NULL);

    /* options: seed makes sampling reproducible; top_k 1 is greedy; num_ctx clamps */
    body = "{\"model\":\"s260\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"temperature\":1.5,\"seed\":7,\"num_predict\":12,\"top_k\":100,"
           "\"top_p\":1,\"repeat_penalty\":1.1,\"presence_penalty\":0.2,\"frequency_penalty\":0.1}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    char seeded[1024];
    snprintf(seeded, sizeof seeded, "%s", jstr(g_json, "response"));
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    CHECK_STR(jstr(g_json, "response"), seeded);
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"temperature\":5,\"top_k\":1,\"num_predict\":20,\"num_ctx\":100000}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    CHECK_STR(jstr(g_json, "response"), expect);
    CHECK_EQ_INT(req(p, "GET", "/api/ps", NULL), 200);
    json_t *m0 = json_array_get(json_object_get(g_json, "models"), 0);
    CHECK_EQ_INT((int)jint(m0, "context_length"), 2048); /* stories260K's trained context */
    /* context overflow: the runner's message, 400 */
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"num_ctx\":4}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 400);
    CHECK_STR(resp_error(), "input length (5 tokens) exceeds the model's maximum context length (4 tokens)");
    /* filling the context ends with done_reason length */
    body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
           "\"options\":{\"num_ctx\":16,\"num_predict\":-2,\"temperature\":0}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", body), 200);
    CHECK_STR(jstr(g_json, "done_reason"), "length");
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 11);

    /* a Go TEMPLATE and SYSTEM from the Modelfile; request system and template override */
    CHECK(create_model(p, "s260t", stories(),
                       "\"template\":\"{{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}\","
                       "\"system\":\"Lily\""));
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260t\",\"prompt\":\"went home\",\"_debug_render_only\":true,"
                     "\"stream\":false}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "Lily went home");
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260t\",\"prompt\":\"went home\",\"system\":\"Tom\","
                     "\"_debug_render_only\":true,\"stream\":false}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "Tom went home");
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260t\",\"prompt\":\"x\",\"template\":\"<{{ .Prompt }}>\","
                     "\"_debug_render_only\":true,\"stream\":false}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "<x>");
    /* suffix needs a template with .Suffix */
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260t\",\"prompt\":\"a\",\"suffix\":\"b\",\"stream\":false}"), 400);
    CHECK_STR(resp_error(), "registry.ollama.ai/library/s260t:latest does not support insert");
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260t\",\"prompt\":\"a\",\"suffix\":\"b\",\"template\":"
                     "\"<P>{{ .Prompt }}<S>{{ .Suffix }}<M>\",\"_debug_render_only\":true}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "<P>a<S>b<M>");
    /* format: json and schemas are accepted, other values are not */
    for (int seed = 1; seed <= 3; seed++) { /* "json" constrains the output to a JSON object */
        char fb[512];
        snprintf(fb, sizeof fb, "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"format\":"
                 "\"json\",\"stream\":false,\"options\":{\"num_predict\":60,\"seed\":%d}}", seed);
        CHECK_EQ_INT(req(p, "POST", "/api/generate", fb), 200);
        const char *r = jstr(g_json, "response");
        bool done = false;
        CHECK_MSG(json_object_prefix(r, strlen(r), &done) == 1, "not a JSON object prefix: %s", r);
        CHECK(strchr(r, '{') != NULL);
        json_t *whole = json_loads(r, 0, NULL); /* complete only when the model closed it */
        if (done) CHECK_MSG(whole != NULL, "complete but not JSON: %s", r);
        json_decref(whole);
    }
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260\",\"prompt\":\"a\",\"format\":{\"type\":\"object\"},"
                     "\"stream\":false,\"options\":{\"num_predict\":2}}"), 200);
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260\",\"prompt\":\"a\",\"format\":\"yaml\"}"), 400);
    CHECK_STR(resp_error(), "invalid format: \"yaml\"; expected \"json\" or a valid JSON Schema object");
}

TEST(api_generate_end_to_end) { WITH_SERVER(generate_api); }

/* ---------------- generated NUL bytes ---------------- */

/* A generation's text from one route: whole (stream false) or concatenated from its
 * NDJSON / SSE frames (stream true). Parsed with JSON_ALLOW_NUL: the text holds NULs. */
static bool route_text(const srv_proc *p, const char *path, const char *body, bool stream,
                       outbuf *text) {
    char *resp = NULL;
    size_t len = 0;
    int status = -1;
    hl_err err;
    if (net_http_request(&p->host, "POST", path, body, strlen(body), &status, &resp, &len,
                         &err) != HL_OK || status != 200) {
        fprintf(stderr, "    %s: %d %s\n", path, status, resp ? resp : err.msg);
        free(resp);
        return false;
    }
    bool oai = strncmp(path, "/v1/chat", 8) == 0, anth = strncmp(path, "/v1/messages", 12) == 0;
    bool ok = true;
    for (char *line = resp, *end; ok && line < resp + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(resp + len - line));
        if (!end) end = resp + len;
        char *j = line;
        if (stream && (oai || anth)) {
            if (end - line < 6 || strncmp(line, "data: ", 6) != 0 || strncmp(line, "data: [DONE]", 12) == 0)
                continue;
            j = line + 6;
        }
        if (end == j) continue;
        json_error_t je;
        json_t *o = json_loadb(j, (size_t)(end - j), JSON_ALLOW_NUL, &je);
        if (!o) {
            fprintf(stderr, "    %s: bad JSON: %s\n", path, je.text);
            ok = false;
            break;
        }
        json_t *t = NULL;
        if (oai) {
            json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
            t = json_object_get(json_object_get(ch, stream ? "delta" : "message"), "content");
        } else if (anth && stream) {
            json_t *d = json_object_get(o, "delta");
            if (!strcmp(jstr(d, "type"), "text_delta")) t = json_object_get(d, "text");
        } else if (anth) {
            size_t i;
            json_t *b;
            json_array_foreach(json_object_get(o, "content"), i, b)
                if (!strcmp(jstr(b, "type"), "text")) t = json_object_get(b, "text");
        } else if (strcmp(path, "/api/chat") == 0) {
            t = json_object_get(json_object_get(o, "message"), "content");
        } else {
            t = json_object_get(o, "response");
        }
        if (json_is_string(t)) outbuf_add(text, json_string_value(t), json_string_length(t));
        json_decref(o);
        if (!stream) break;
    }
    free(resp);
    return ok;
}

static void nul_tokens_api(srv_proc *p) {
    char path[1024];
    snprintf(path, sizeof path, "%s/nul.gguf", test_tmpdir());
    /* a quarter of the vocabulary is <0x00>: greedy decoding meets several soon */
    CHECK(write_gguf_edit(stories(), path, k_chatml, NULL, NULL, 4));
    CHECK(create_model(p, "nul", path, ""));
    static const char *const cases[][2] = {
        {"/api/generate", "{\"model\":\"nul\",\"prompt\":\"Once upon a time\",\"raw\":true,"
                          "\"stream\":%s,\"options\":{\"temperature\":0,\"num_predict\":40}}"},
        {"/api/chat", "{\"model\":\"nul\",\"messages\":[{\"role\":\"user\",\"content\":\"Once upon"
                      " a time\"}],\"stream\":%s,\"options\":{\"temperature\":0,\"num_predict\":40}}"},
        {"/v1/chat/completions", "{\"model\":\"nul\",\"messages\":[{\"role\":\"user\",\"content\":"
                                 "\"Once upon a time\"}],\"stream\":%s,\"temperature\":0,"
                                 "\"max_tokens\":40}"},
        {"/v1/messages", "{\"model\":\"nul\",\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"Once upon a time\"}],\"stream\":%s,\"temperature\":0,"
                         "\"max_tokens\":40}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        outbuf whole = {0}, parts = {0};
        snprintf(body, sizeof body, cases[i][1], "false");
        CHECK(route_text(p, cases[i][0], body, false, &whole));
        snprintf(body, sizeof body, cases[i][1], "true");
        CHECK(route_text(p, cases[i][0], body, true, &parts));
        const char *nul = whole.p ? memchr(whole.p, '\0', whole.len) : NULL;
        CHECK_MSG(nul && (size_t)(nul - whole.p) + 1 < whole.len,
                  "%s: no NUL inside the answer (%zu bytes)", cases[i][0], whole.len);
        CHECK_MSG(whole.len == parts.len && memcmp(whole.p, parts.p, whole.len) == 0,
                  "%s: stream=false %zu bytes, stream=true %zu bytes", cases[i][0], whole.len,
                  parts.len);
        outbuf_free(&whole);
        outbuf_free(&parts);
    }
}

TEST(api_generated_nul_bytes_kept) { WITH_SERVER(nul_tokens_api); }

/* ---------------- keep_alive, ps, load/unload ---------------- */

static int ps_count(const srv_proc *p) {
    if (req(p, "GET", "/api/ps", NULL) != 200) return -1;
    return (int)json_array_size(json_object_get(g_json, "models"));
}

typedef struct par_req {
    const srv_proc *p;
    const char *body;
    int status;
    long long eval_count;
} par_req;

static void *par_main(void *arg) {
    par_req *r = arg;
    char *out = NULL;
    r->status = -1;
    if (net_http_request(&r->p->host, "POST", "/api/generate", r->body, strlen(r->body), &r->status,
                         &out, NULL, NULL) == HL_OK) {
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        r->eval_count = jint(j, "eval_count");
        json_decref(j);
    }
    free(out);
    return NULL;
}

/* Whether a runner process of the server maps a model blob file: 1 yes, 0 no (the weights
 * were read into memory), -1 when no runner child was found. */
static int runner_maps_blob(const srv_proc *p) {
    DIR *d = opendir("/proc");
    if (!d) return -1;
    int found = -1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && found != 1) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
        char state;
        int ppid;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != (int)p->pid) continue;
        snprintf(path, sizeof path, "/proc/%s/maps", de->d_name);
        f = fopen(path, "r");
        if (!f) continue;
        found = 0;
        while (fgets(buf, sizeof buf, f))
            if (strstr(buf, "/blobs/sha256-")) found = 1;
        fclose(f);
    }
    closedir(d);
    return found;
}

static void keepalive_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    CHECK(create_model(p, "other", stories(), "\"system\":\"x\""));
    CHECK_EQ_INT(ps_count(p), 0);
    /* empty prompt loads */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\"}"), 200);
    CHECK_STR(jstr(g_json, "done_reason"), "load");
    CHECK(json_is_true(json_object_get(g_json, "done")));
    CHECK_STR(jstr(g_json, "response"), "");
    CHECK_EQ_INT(ps_count(p), 1);
    json_t *m = json_array_get(json_object_get(g_json, "models"), 0);
    CHECK_STR(jstr(m, "name"), "s260:latest");
    CHECK_STR(jstr(m, "model"), "s260:latest");
    CHECK(strlen(jstr(m, "digest")) == 64);
    CHECK(jint(m, "size") > 1000000); /* weights + KV + scratch, measured */
    CHECK_EQ_INT((int)jint(m, "size_vram"), 0);
    CHECK_EQ_INT((int)jint(m, "context_length"), 2048);
    CHECK_STR(jstr(json_object_get(m, "details"), "format"), "gguf");
    /* default keep-alive: about 5 minutes from now */
    struct tm tm = {0};
    const char *exp = jstr(m, "expires_at");
    CHECK(strptime(exp, "%Y-%m-%dT%H:%M:%S", &tm) != NULL);
    double left = difftime(timegm(&tm), time(NULL));
    CHECK_MSG(left > 280 && left <= 301, "expires in %.0f s", left);
    /* keep_alive as a number and a duration string; remembered by the model */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":\"1h30m\"}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    m = json_array_get(json_object_get(g_json, "models"), 0);
    CHECK(strptime(jstr(m, "expires_at"), "%Y-%m-%dT%H:%M:%S", &tm) != NULL);
    left = difftime(timegm(&tm), time(NULL));
    CHECK_MSG(left > 5300 && left <= 5401, "expires in %.0f s", left);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"a\","
                     "\"stream\":false,\"options\":{\"num_predict\":1}}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    m = json_array_get(json_object_get(g_json, "models"), 0);
    CHECK(strptime(jstr(m, "expires_at"), "%Y-%m-%dT%H:%M:%S", &tm) != NULL);
    left = difftime(timegm(&tm), time(NULL));
    CHECK_MSG(left > 5300, "remembered keep_alive: expires in %.0f s", left);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":-1}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    m = json_array_get(json_object_get(g_json, "models"), 0);
    CHECK(strncmp(jstr(m, "expires_at"), "22", 2) == 0); /* forever: far future */
    /* a bad keep_alive */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":\"5\"}"), 400);
    CHECK_STR(resp_error(), "time: missing unit in duration \"5\"");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":true}"), 400);
    CHECK_STR(resp_error(), "Unsupported type: 'bool'");
    /* keep_alive 0 with an empty prompt unloads */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":0}"), 200);
    CHECK_STR(jstr(g_json, "done_reason"), "unload");
    CHECK_EQ_INT(ps_count(p), 0);
    /* chat: empty messages load/unload */
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"s260\",\"messages\":[]}"), 200);
    CHECK_STR(jstr(g_json, "done_reason"), "load");
    CHECK_STR(jstr(json_object_get(g_json, "message"), "role"), "assistant");
    CHECK_EQ_INT(ps_count(p), 1);
    /* another model loads beside it (several resident: see test_sched.c) */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"other\"}"), 200);
    CHECK_EQ_INT(ps_count(p), 2);
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"other\",\"keep_alive\":0}"), 200);
    CHECK_STR(jstr(g_json, "done_reason"), "unload");
    CHECK_EQ_INT(ps_count(p), 1);
    CHECK_STR(jstr(json_array_get(json_object_get(g_json, "models"), 0), "name"), "s260:latest");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"s260\",\"keep_alive\":0}"), 200);
    CHECK_EQ_INT(ps_count(p), 0);
    /* a request with keep_alive 0 unloads when it finishes */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"a\","
                     "\"keep_alive\":0,\"stream\":false,\"options\":{\"num_predict\":1}}"), 200);
    CHECK_EQ_INT(ps_count(p), 0);
    /* expiry: a short keep_alive unloads by itself */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"keep_alive\":\"300ms\"}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    int n = 1;
    for (int i = 0; i < 60 && n != 0; i++) {
        sp_sleep_ms(50);
        n = ps_count(p);
    }
    CHECK_EQ_INT(n, 0);
    /* concurrent requests for two models and the same one: all are served in turn */
    static const char *bodies[2] = {
        "{\"model\":\"s260\",\"prompt\":\"a\",\"stream\":false,\"options\":{\"num_predict\":30}}",
        "{\"model\":\"other\",\"prompt\":\"b\",\"stream\":false,\"options\":{\"num_predict\":30}}"};
    par_req rq[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        rq[i] = (par_req){p, bodies[(i / 2 + i) % 2], 0, 0};
        pthread_create(&th[i], NULL, par_main, &rq[i]);
    }
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(rq[i].status, 200);
        CHECK_EQ_INT((int)rq[i].eval_count, 30);
    }
    CHECK_EQ_INT(ps_count(p), 2);
    /* deleting a loaded model unloads it */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"other\"}"), 200);
    CHECK_EQ_INT(ps_count(p), 2);
    CHECK_EQ_INT(req(p, "DELETE", "/api/delete", "{\"model\":\"other\"}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    /* a different num_ctx reloads with the new context */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"options\":{\"num_ctx\":64}}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    CHECK_EQ_INT((int)jint(json_array_get(json_object_get(g_json, "models"), 0), "context_length"), 64);
    /* the weights are read into the runner's memory by default; use_mmap maps the blob
     * instead, and changing it reloads */
    CHECK_EQ_INT(runner_maps_blob(p), 0);
    CHECK_EQ_INT(req(p, "POST", "/api/generate",
                     "{\"model\":\"s260\",\"prompt\":\"Once\",\"stream\":false,\"options\":{\"num_ctx\":64,"
                     "\"use_mmap\":true,\"num_predict\":3}}"),
                 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 3);
    CHECK_EQ_INT(ps_count(p), 1);
    CHECK_EQ_INT(runner_maps_blob(p), 1);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"options\":{\"num_ctx\":64}}"), 200);
    CHECK_EQ_INT(runner_maps_blob(p), 0);
}

TEST(api_keep_alive_ps_load_unload) { WITH_SERVER(keepalive_api); }

/* ---------------- /api/chat with a Jinja template ---------------- */

static void chat_api(srv_proc *p) {
    char path[1100];
    snprintf(path, sizeof path, "%s/chatml.gguf", test_tmpdir());
    CHECK(write_templated_gguf(stories(), path, k_chatml, NULL));
    CHECK(create_model(p, "chat", path, "\"system\":\"You tell stories.\","
                       "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"hello\"}]"));
    /* system from the Modelfile, MESSAGEs prepended, history and roles */
    const char *body = "{\"model\":\"chat\",\"_debug_render_only\":true,\"messages\":["
                       "{\"role\":\"USER\",\"content\":\"Once\"},"
                       "{\"role\":\"assistant\",\"content\":\"upon\"},"
                       "{\"role\":\"user\",\"content\":\"a time\"}]}";
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"),
              "<|im_start|>system\nYou tell stories.<|im_end|>\n"
              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
              "<|im_start|>user\nOnce<|im_end|>\n<|im_start|>assistant\nupon<|im_end|>\n"
              "<|im_start|>user\na time<|im_end|>\n<|im_start|>assistant\n");
    /* a request system message replaces the Modelfile's */
    body = "{\"model\":\"chat\",\"_debug_render_only\":true,\"messages\":["
           "{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]}";
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"),
              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
              "<|im_start|>assistant\n");
    /* tools reach the template */
    body = "{\"model\":\"chat\",\"_debug_render_only\":true,\"messages\":["
           "{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[{\"type\":\"function\","
           "\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":"
           "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]}";
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    const char *r = jstr(json_object_get(g_json, "_debug_info"), "rendered_template");
    CHECK(strstr(r, "<tools>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"") != NULL);
    CHECK(strstr(r, "You tell stories.\n# Tools") != NULL);
    /* generate with this model renders through the chat template too */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"chat\",\"prompt\":\"P\","
                     "\"_debug_render_only\":true}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"),
              "<|im_start|>system\nYou tell stories.<|im_end|>\n"
              "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
              "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\n");
    /* a real chat, streamed and not: same text, message shape, metrics */
    body = "{\"model\":\"chat\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":"
           "\"Once upon a time\"}],\"options\":{\"temperature\":0,\"num_predict\":10}}";
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    json_t *msg = json_object_get(g_json, "message");
    CHECK_STR(jstr(msg, "role"), "assistant");
    char text[2048];
    snprintf(text, sizeof text, "%s", jstr(msg, "content"));
    CHECK(strlen(text) > 0);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 10);
    CHECK(jint(g_json, "prompt_eval_count") > 20);
    CHECK_STR(jstr(g_json, "done_reason"), "length");
    CHECK(json_object_get(g_json, "context") == NULL);
    body = "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":"
           "\"Once upon a time\"}],\"options\":{\"temperature\":0,\"num_predict\":10}}";
    CHECK_EQ_INT(req_stream(p, "/api/chat", body), 200);
    char streamed[2048];
    concat_responses(g_lines, "message", streamed, sizeof streamed);
    CHECK_STR(streamed, text);
    /* with tools: the model's output is plain text here (no tool call) */
    body = "{\"model\":\"chat\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":"
           "\"Once upon a time\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
           "\"options\":{\"temperature\":0,\"num_predict\":10}}";
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK(json_object_get(json_object_get(g_json, "message"), "tool_calls") == NULL);
    /* capability errors */
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"chat\",\"think\":true,\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"x\"}]}"), 400);
    CHECK_STR(resp_error(), "\"chat\" does not support thinking");
    CHECK(create_model(p, "plain", stories(), ""));
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"plain\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}"), 400);
    CHECK_STR(resp_error(), "registry.ollama.ai/library/plain:latest does not support tools");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\",\"images\":[\"aGk=\"]}]}"), 400);
    CHECK_STR(resp_error(), "registry.ollama.ai/library/chat:latest does not support vision");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"chat\",\"think\":\"hard\"}"), 400);
    CHECK_STR(resp_error(), "invalid think value: \"hard\" (must be \"high\", \"medium\", \"low\", "
                            "\"max\", true, or false)");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"chat\",\"messages\":{}}"), 400);
    /* history truncation: the oldest messages go until the prompt fits num_ctx */
    char big[8192] = "{\"model\":\"chat\",\"stream\":false,\"options\":{\"num_ctx\":192,"
                     "\"num_predict\":4},\"messages\":[";
    for (int i = 0; i < 12; i++) {
        size_t bl = strlen(big);
        snprintf(big + bl, sizeof big - bl, "%s{\"role\":\"%s\",\"content\":\"Lily and Ben went to "
                 "the park to play number %d\"}", i ? "," : "", i % 2 ? "assistant" : "user", i);
    }
    strcat(big, "]}");
    CHECK_MSG(req(p, "POST", "/api/chat", big) == 200, "%s", g_resp);
    CHECK(jint(g_json, "prompt_eval_count") < 192 && jint(g_json, "prompt_eval_count") > 100);
    CHECK(strstr(big, "\"truncate\"") == NULL);
    big[strlen(big) - 1] = '\0';
    strcat(big, ",\"truncate\":false}");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", big), 400);
    CHECK(strstr(resp_error(), "exceeds the model's maximum context length (192 tokens)") != NULL);
    /* thinking-capable template: think on by default; the prompt opens <think> */
    snprintf(path, sizeof path, "%s/think.gguf", test_tmpdir());
    CHECK(write_templated_gguf(stories(), path,
                               "{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}"
                               "{% for m in messages %}{{ m.content }}{% endfor %}"
                               "{% if enable_thinking is defined and not enable_thinking %}"
                               "<think></think>{% else %} <think>{% endif %}", NULL));
    CHECK(create_model(p, "thinker", path, ""));
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"thinker\",\"stream\":false,\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                     "\"options\":{\"temperature\":0,\"num_predict\":6}}"), 200);
    msg = json_object_get(g_json, "message");
    CHECK(strlen(jstr(msg, "thinking")) > 0); /* never closed: all of it is thinking */
    CHECK_STR(jstr(msg, "content"), "");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"thinker\",\"stream\":false,\"think\":false,"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                     "\"options\":{\"temperature\":0,\"num_predict\":6}}"), 200);
    msg = json_object_get(g_json, "message");
    CHECK(json_object_get(msg, "thinking") == NULL);
    CHECK(strlen(jstr(msg, "content")) > 0);
    /* think levels reach the template as reasoning_effort; true is "medium" */
    CHECK_EQ_INT(req(p, "POST", "/api/chat", "{\"model\":\"thinker\",\"think\":\"high\",\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"Q\"}],\"_debug_render_only\":true}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "[high]Q <think>");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"thinker\",\"think\":true,\"prompt\":\"Q\","
                     "\"_debug_render_only\":true}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "[medium]Q <think>");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"thinker\",\"think\":false,\"prompt\":\"Q\","
                     "\"_debug_render_only\":true}"), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "Q<think></think>");
    /* generate with thinking: the thinking field */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"thinker\",\"prompt\":\"Once upon a time\","
                     "\"stream\":false,\"options\":{\"temperature\":0,\"num_predict\":6}}"), 200);
    CHECK(strlen(jstr(g_json, "thinking")) > 0);
    CHECK_STR(jstr(g_json, "response"), "");
    /* a format applies after the thinking part: the thinking is what it is without one */
    const char *think_body = "{\"model\":\"thinker\",\"stream\":false,%s\"messages\":[{\"role\":"
                             "\"user\",\"content\":\"Once upon a time\"}],\"options\":{\"temperature\":0,"
                             "\"num_predict\":12}}";
    char tb[512];
    snprintf(tb, sizeof tb, think_body, "");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", tb), 200);
    char *free_thinking = strdup(jstr(json_object_get(g_json, "message"), "thinking"));
    snprintf(tb, sizeof tb, think_body, "\"format\":{\"type\":\"object\"},");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", tb), 200);
    bool same = free_thinking && strlen(free_thinking) > 0 &&
                !strcmp(free_thinking, jstr(json_object_get(g_json, "message"), "thinking"));
    free(free_thinking);
    CHECK(same);
    /* without thinking the answer is constrained from its first token */
    snprintf(tb, sizeof tb, think_body, "\"think\":false,\"format\":\"json\",");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", tb), 200);
    const char *answer = jstr(json_object_get(g_json, "message"), "content");
    CHECK_MSG(json_object_prefix(answer, strlen(answer), NULL) == 1 && strchr(answer, '{'), "%s", answer);
}

TEST(api_chat_templates_tools_thinking) { WITH_SERVER(chat_api); }

/* A Modelfile TEMPLATE without .Messages or .Response (and a model without any
 * template): Ollama appends {{ .Response }} and runs the template once per turn, so a
 * multi-turn chat keeps the assistant's replies. Expected strings follow that rule by
 * hand: each finished turn renders with its .Prompt and .Response (.System only where a
 * system message came first), the last one is cut after the (empty) .Response. */
static void legacy_template_api(srv_proc *p) {
    CHECK(create_model(p, "legacy", stories(),
                       "\"template\":\"{{ if .System }}[S]{{ .System }}\\n{{ end }}[U]{{ .Prompt }}\\n[A]\","
                       "\"system\":\"Be brief.\""));
    const char *conv = "\"messages\":[{\"role\":\"user\",\"content\":\"U1\"},"
                       "{\"role\":\"assistant\",\"content\":\"A1\"},"
                       "{\"role\":\"user\",\"content\":\"U2\"},"
                       "{\"role\":\"assistant\",\"content\":\"A2\"},"
                       "{\"role\":\"user\",\"content\":\"U3\"}]";
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"legacy\",\"_debug_render_only\":true,%s}", conv);
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"),
              "[S]Be brief.\n[U]U1\n[A]A1[U]U2\n[A]A2[U]U3\n[A]");
    /* a request system message replaces the Modelfile's; one in mid-conversation starts
     * a new turn */
    snprintf(body, sizeof body, "{\"model\":\"legacy\",\"_debug_render_only\":true,"
             "\"messages\":[{\"role\":\"system\",\"content\":\"S1\"},"
             "{\"role\":\"user\",\"content\":\"U1\"},{\"role\":\"assistant\",\"content\":\"A1\"},"
             "{\"role\":\"system\",\"content\":\"S2\"},{\"role\":\"user\",\"content\":\"U2\"}]}");
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"),
              "[S]S1\n[U]U1\n[A]A1[S]S2\n[U]U2\n[A]");
    /* no template: {{ .Prompt }}{{ .Response }} per turn */
    CHECK(create_model(p, "bare", stories(), ""));
    snprintf(body, sizeof body, "{\"model\":\"bare\",\"_debug_render_only\":true,%s}", conv);
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_STR(jstr(json_object_get(g_json, "_debug_info"), "rendered_template"), "U1A1U2A2U3");
    /* and a real multi-turn chat on it generates after the whole history */
    snprintf(body, sizeof body, "{\"model\":\"legacy\",\"stream\":false,%s,"
             "\"options\":{\"temperature\":0,\"num_predict\":3}}", conv);
    CHECK_EQ_INT(req(p, "POST", "/api/chat", body), 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 3);
}

TEST(api_chat_template_without_response_keeps_replies) { WITH_SERVER(legacy_template_api); }

/* ---------------- embeddings ---------------- */

static double l2(const json_t *v) {
    double s = 0;
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) s += json_number_value(x) * json_number_value(x);
    return sqrt(s);
}

static void embed_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":[\"Once upon a time\","
                     "\"Lily went home\"]}"), 200);
    json_t *e = json_object_get(g_json, "embeddings");
    CHECK_EQ_INT((int)json_array_size(e), 2);
    CHECK_EQ_INT((int)json_array_size(json_array_get(e, 0)), 64); /* stories260K n_embd */
    CHECK_NEAR(l2(json_array_get(e, 0)), 1.0, 1e-5);
    CHECK_NEAR(l2(json_array_get(e, 1)), 1.0, 1e-5);
    CHECK(jint(g_json, "prompt_eval_count") > 5 + 2); /* both inputs' tokens */
    CHECK(jint(g_json, "total_duration") > 0);
    CHECK(json_object_get(g_json, "load_duration") != NULL);
    CHECK_STR(jstr(g_json, "model"), "s260");
    double first0 = json_number_value(json_array_get(json_array_get(e, 0), 0));
    /* a single string; deterministic */
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"Once upon a time\"}"), 200);
    e = json_object_get(g_json, "embeddings");
    CHECK_EQ_INT((int)json_array_size(e), 1);
    CHECK_NEAR(json_number_value(json_array_get(json_array_get(e, 0), 0)), first0, 1e-6);
    /* dimensions: truncated and re-normalized */
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"Once upon a time\","
                     "\"dimensions\":8}"), 200);
    e = json_array_get(json_object_get(g_json, "embeddings"), 0);
    CHECK_EQ_INT((int)json_array_size(e), 8);
    CHECK_NEAR(l2(e), 1.0, 1e-5);
    /* empty input: no embeddings */
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"\"}"), 200);
    CHECK_EQ_INT((int)json_array_size(json_object_get(g_json, "embeddings")), 0);
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":[1,2]}"), 400);
    CHECK_STR(resp_error(), "invalid input type");
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":5}"), 400);
    /* truncate */
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"Once upon a time\","
                     "\"truncate\":false,\"options\":{\"num_ctx\":4}}"), 400);
    CHECK_STR(resp_error(), "the input length exceeds the context length");
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"Once upon a time\","
                     "\"options\":{\"num_ctx\":4}}"), 200);
    CHECK_EQ_INT((int)jint(g_json, "prompt_eval_count"), 4);
    /* legacy: prompt -> embedding, not normalized */
    CHECK_EQ_INT(req(p, "POST", "/api/embeddings", "{\"model\":\"s260\",\"prompt\":\"Once upon a time\"}"), 200);
    e = json_object_get(g_json, "embedding");
    CHECK_EQ_INT((int)json_array_size(e), 64);
    CHECK(fabs(l2(e) - 1.0) > 1e-3);
    CHECK_EQ_INT(req(p, "POST", "/api/embeddings", "{\"model\":\"s260\",\"prompt\":\"\"}"), 200);
    CHECK_EQ_INT((int)json_array_size(json_object_get(g_json, "embedding")), 0);
    CHECK_EQ_INT(req(p, "POST", "/api/embeddings", "{\"prompt\":\"x\"}"), 400);
    CHECK_STR(resp_error(), "model is required");
    /* pooling from the GGUF (<arch>.pooling_type = last) changes the vector */
    char path[1100];
    snprintf(path, sizeof path, "%s/pool.gguf", test_tmpdir());
    CHECK(write_templated_gguf(stories(), path, NULL, "llama.pooling_type"));
    CHECK(create_model(p, "pooled", path, ""));
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"pooled\",\"input\":\"Once upon a time\"}"), 200);
    e = json_array_get(json_object_get(g_json, "embeddings"), 0);
    CHECK_NEAR(l2(e), 1.0, 1e-5);
    CHECK(fabs(json_number_value(json_array_get(e, 0)) - first0) > 1e-6);
}

TEST(api_embed_and_embeddings) { WITH_SERVER(embed_api); }

/* ---------------- documented errors ---------------- */

static void errors_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    const char *eps[] = {"/api/generate", "/api/chat", "/api/embed", "/api/embeddings"};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(req(p, "POST", eps[i], "{\"model\":\"nope\"}"), 404);
        CHECK_STR(resp_error(), "model 'nope' not found");
        CHECK_EQ_INT(req(p, "POST", eps[i], "{}"), 400);
        CHECK_STR(resp_error(), "model is required");
        CHECK_EQ_INT(req(p, "POST", eps[i], ""), 400);
        CHECK_STR(resp_error(), "missing request body");
        CHECK_EQ_INT(req(p, "POST", eps[i], "{\"model\":"), 400);
        CHECK_EQ_INT(req(p, "POST", eps[i], "{\"model\":\"s260\",\"options\":{\"temperature\":\"x\"}}"), 500);
        CHECK_STR(resp_error(), "option \"temperature\" must be of type float32");
        CHECK_EQ_INT(req(p, "POST", eps[i], "{\"model\":\"a b c\"}"), 400);
        CHECK_STR(resp_error(), "invalid model name");
    }
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":5}"), 400);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"raw\":true,\"system\":\"s\","
                     "\"prompt\":\"x\"}"), 400);
    CHECK_STR(resp_error(), "raw mode does not support template, system, or context");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\","
                     "\"images\":[\"aGk=\"]}"), 400);
    CHECK_STR(resp_error(), "registry.ollama.ai/library/s260:latest does not support vision");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"think\":true}"), 400);
    CHECK_STR(resp_error(), "\"s260\" does not support thinking");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"top_logprobs\":21}"), 400);
    CHECK_STR(resp_error(), "top_logprobs must be between 0 and 20");
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"context\":[1,99999],"
                     "\"stream\":false}"), 400);
    /* out-of-range load options are clamped, not trusted */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"stream\":false,"
                     "\"options\":{\"num_batch\":100000000,\"num_thread\":1,\"num_ctx\":-5,"
                     "\"num_predict\":1}}"), 200);
    CHECK_EQ_INT(ps_count(p), 1);
    CHECK_EQ_INT((int)jint(json_array_get(json_object_get(g_json, "models"), 0), "context_length"), 4);
    /* unknown options are ignored */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"stream\":false,"
                     "\"options\":{\"no_such_option\":1,\"num_predict\":1}}"), 200);
    /* a streamed error before any chunk is an HTTP status, not a line */
    CHECK_EQ_INT(req_stream(p, "/api/generate", "{\"model\":\"s260\",\"prompt\":\"Once upon a time\","
                            "\"raw\":true,\"options\":{\"num_ctx\":4}}"), 400);
    CHECK_STR(jstr(json_array_get(g_lines, 0), "error"),
              "input length (5 tokens) exceeds the model's maximum context length (4 tokens)");
    /* the blob vanished: schedule-time 404 */
    char path[1100], blob[1400], digest[80];
    snprintf(path, sizeof path, "%s/gone.gguf", test_tmpdir());
    CHECK(write_templated_gguf(stories(), path, "{{ messages }}", NULL));
    CHECK(create_model(p, "gone", path, ""));
    CHECK(sp_upload_file(p, path, digest) == 200);
    snprintf(blob, sizeof blob, "%s/blobs/sha256-%s", p->models, digest + 7);
    CHECK_EQ_INT(unlink(blob), 0);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"gone\",\"prompt\":\"x\"}"), 404);
    CHECK_STR(resp_error(), "model \"gone\" not found, try pulling it first");
    /* a model the engine cannot load: a clear 500, nothing stays loaded */
    snprintf(path, sizeof path, "%s/mamba.gguf", test_tmpdir());
    CHECK(write_gguf_ex(stories(), path, NULL, NULL, "mamba"));
    CHECK(create_model(p, "mamba", path, ""));
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"mamba\",\"prompt\":\"x\"}"), 500);
    CHECK_MSG(strstr(resp_error(), "mamba") != NULL, "%s", resp_error());
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"mamba\",\"input\":\"x\"}"), 500);
    CHECK(ps_count(p) >= 0 && strstr(g_resp, "mamba") == NULL); /* others may stay resident */
    /* the server is healthy after all of that */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"x\",\"stream\":false,"
                     "\"options\":{\"num_predict\":2}}"), 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 2);
}

TEST(api_documented_errors) { WITH_SERVER(errors_api); }

/* ---------------- client mistakes, leaks and leftovers ---------------- */

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* The error message and type of an OpenAI ({"error":{message,type}}) or Anthropic
 * ({"type":"error","error":{type,message}}) error body. */
static const char *compat_error_type(void) { return jstr(json_object_get(g_json, "error"), "type"); }

static void mistakes_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), "\"system\":\"keep me\""));
    /* bad sampling values are the client's mistake (400) in each API's shape */
    static const char *const oai[] = {
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":-1}",
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":1e300}",
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_p\":1e300}",
        "{\"model\":\"s260\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"frequency_penalty\":1e300}",
    };
    for (size_t i = 0; i < sizeof oai / sizeof oai[0]; i++) {
        CHECK_EQ_INT(req(p, "POST", "/v1/chat/completions", oai[i]), 400);
        CHECK_STR(compat_error_type(), "invalid_request_error");
    }
    CHECK_EQ_INT(req(p, "POST", "/v1/completions",
                     "{\"model\":\"s260\",\"prompt\":\"hi\",\"temperature\":-2}"), 400);
    CHECK_STR(compat_error_type(), "invalid_request_error");
    CHECK_EQ_INT(req(p, "POST", "/v1/messages", "{\"model\":\"s260\",\"max_tokens\":4,\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":-1}"), 400);
    CHECK_STR(jstr(g_json, "type"), "error");
    CHECK_STR(compat_error_type(), "invalid_request_error");
    CHECK_EQ_INT(req(p, "POST", "/v1/messages", "{\"model\":\"s260\",\"max_tokens\":4,\"messages\":"
                     "[{\"role\":\"user\",\"content\":\"hi\"}],\"top_p\":1e300}"), 400);
    /* a model id that is not UTF-8: not found, with a JSON body */
    CHECK_EQ_INT(req(p, "GET", "/v1/models/%ff%fe", NULL), 404);
    CHECK(g_json != NULL);

    /* unknown option names are escaped in the log: no forged line */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"hi\",\"stream\":false,"
                     "\"options\":{\"num_predict\":1,\"x\\n[hearth] 200 | forged\":1}}"), 200);
    CHECK_EQ_INT(req(p, "GET", "/api/version%0a[hearth]%20forged%20too", NULL), 404);
    char *log = NULL;
    size_t log_len = 0;
    sp_sleep_ms(100);
    CHECK(hl_file_read(p->log, &log, &log_len, NULL) == HL_OK);
    CHECK(log && strstr(log, "\n[hearth] 200 | forged") == NULL);
    CHECK(log && strstr(log, "\n[hearth] forged too") == NULL);
    CHECK(log && strstr(log, "option=\"x\\n[hearth] 200 | forged\"") != NULL);
    CHECK(log && strstr(log, "path=\"/api/version\\n[hearth] forged too\"") != NULL);
    free(log);

    /* a failed create leaves no blobs and no manifest folders behind */
    char blobs[2048], mdir[2048];
    snprintf(blobs, sizeof blobs, "%s/blobs", p->models);
    snprintf(mdir, sizeof mdir, "%s/manifests/registry.ollama.ai/library/orphan", p->models);
    int before = count_files(blobs);
    CHECK_EQ_INT(req(p, "POST", "/api/create", "{\"model\":\"orphan\",\"from\":\"s260\",\"stream\":false,"
                     "\"template\":\"a template only this create stores\","
                     "\"messages\":[{\"role\":1}]}"), 400);
    CHECK_EQ_INT(count_files(blobs), before);
    CHECK(access(mdir, F_OK) != 0);
    /* an upload that is no GGUF is not kept once a create finds that out */
    const char junk[] = "this is not a GGUF file";
    char junk_path[1200], junk_digest[80], body[512];
    snprintf(junk_path, sizeof junk_path, "%s/junk.bin", test_tmpdir());
    CHECK(hl_file_write(junk_path, junk, sizeof junk - 1, NULL) == HL_OK);
    CHECK_EQ_INT(sp_upload_file(p, junk_path, junk_digest), 201);
    CHECK_EQ_INT(count_files(blobs), before + 1);
    snprintf(body, sizeof body, "{\"model\":\"junk\",\"files\":{\"j.gguf\":\"%s\"},\"stream\":false}",
             junk_digest);
    CHECK_EQ_INT(req(p, "POST", "/api/create", body), 400);
    CHECK(strstr(resp_error(), "GGUF") != NULL);
    CHECK_EQ_INT(count_files(blobs), before);
    snprintf(mdir, sizeof mdir, "%s/manifests/registry.ollama.ai/library/junk", p->models);
    CHECK(access(mdir, F_OK) != 0);

    /* a blob gone from under a model: the error names it without the store's path */
    char blob[2048], digest[80] = "sha256:";
    sha256_hex("keep me", 7, digest + 7);
    snprintf(blob, sizeof blob, "%s/blobs/sha256-%s", p->models, digest + 7);
    CHECK(unlink(blob) == 0);
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"s260\"}"), 500);
    CHECK(strstr(resp_error(), "blobs/sha256-") != NULL);
    CHECK_MSG(strstr(g_resp ? g_resp : "", p->models) == NULL, "store path in: %s", g_resp);
    CHECK(req(p, "POST", "/v1/chat/completions", "{\"model\":\"s260\",\"messages\":[{\"role\":"
              "\"user\",\"content\":\"hi\"}]}") >= 400);
    CHECK_MSG(strstr(g_resp ? g_resp : "", p->models) == NULL, "store path in: %s", g_resp);
}

TEST(api_client_mistakes_leaks_leftovers) { WITH_SERVER(mistakes_api); }

/* ---------------- runner port ---------------- */

/* The port of the runner the server started, from its startup line in the server log. */
static int runner_port(const srv_proc *p) {
    char *log = NULL;
    size_t len;
    int port = -1;
    if (hl_file_read(p->log, &log, &len, NULL) != HL_OK) return -1;
    const char *at = strstr(log, "runner: serving ");
    const char *on = at ? strstr(at, " on 127.0.0.1:") : NULL;
    if (on) port = atoi(on + strlen(" on 127.0.0.1:"));
    free(log);
    return port;
}

/* A runner answers only its own protocol, and only with the secret its server gave it:
 * the public API (tags, delete, generate...) and secret-less requests are refused. */
static void runner_secret_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    const char *gen = "{\"model\":\"s260\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,"
                      "\"options\":{\"temperature\":0,\"num_predict\":3}}";
    CHECK_EQ_INT(req(p, "POST", "/api/generate", gen), 200);
    int port = -1;
    for (int i = 0; i < 50 && port <= 0; i++) {
        port = runner_port(p);
        if (port <= 0) sp_sleep_ms(20);
    }
    CHECK(port > 0);
    srv_proc rp = *p;
    rp.host.port = port;
    CHECK_EQ_INT(req(&rp, "GET", "/api/tags", NULL), 403);
    CHECK_EQ_INT(req(&rp, "DELETE", "/api/delete", "{\"model\":\"s260\"}"), 403);
    CHECK_EQ_INT(req(&rp, "POST", "/api/generate", gen), 403);
    CHECK_EQ_INT(req(&rp, "GET", "/health", NULL), 403);
    CHECK_EQ_INT(req(&rp, "POST", "/completion", "{\"prompt\":[1,2],\"num_predict\":1}"), 403);
    CHECK_EQ_INT(req(&rp, "GET", "/0123456789abcdef0123456789abcdef/health", NULL), 403);
    CHECK_EQ_INT(req(&rp, "GET", "//health", NULL), 403);
    /* the model is still there and its runner still serves the server */
    CHECK_EQ_INT(req(p, "POST", "/api/show", "{\"model\":\"s260\"}"), 200);
    CHECK_EQ_INT(req(p, "POST", "/api/generate", gen), 200);
    CHECK_EQ_INT(sp_ps_count(p), 1);
}

TEST(api_runner_refuses_requests_without_its_secret) { WITH_SERVER(runner_secret_api); }

/* ---------------- client disconnect ---------------- */

static void disconnect_api(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    /* format json keeps the end-of-generation token out until the object closes, which
     * this model practically never does: a run goes on to the context end (2048) */
    const char *calib = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,"
                        "\"format\":\"json\",\"stream\":false,\"options\":{\"num_predict\":100}}";
    uint64_t c0 = hl_time_ns();
    CHECK_EQ_INT(req(p, "POST", "/api/generate", calib), 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 100);
    double t100 = (double)(hl_time_ns() - c0) / 1e9;
    /* long generations, abandoned after the first chunk */
    const char *body = "{\"model\":\"s260\",\"prompt\":\"Once upon a time\",\"raw\":true,"
                       "\"format\":\"json\",\"options\":{\"num_predict\":-1}}";
    for (int round = 0; round < 3; round++) {
        net_http *h;
        hl_err err;
        CHECK_OK(net_http_open(&p->host, "POST", "/api/generate", "application/json",
                               (int64_t)strlen(body), &h, &err), &err);
        CHECK_OK(net_http_send(h, body, strlen(body), &err), &err);
        CHECK_OK(net_http_finish(h, &err), &err);
        CHECK_EQ_INT(net_http_status(h), 200);
        char *line;
        size_t len;
        CHECK_OK(net_http_read_line(h, &line, &len, &err), &err);
        CHECK(line && strstr(line, "\"done\":false"));
        net_http_close(h);
    }
    /* the next request works at once: the abandoned runs were cancelled (uncancelled,
     * it would wait for at least one 2048-token run, about 20 x t100) */
    uint64_t t0 = hl_time_ns();
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"s260\",\"prompt\":\"Once\",\"raw\":true,"
                     "\"stream\":false,\"options\":{\"num_predict\":3}}"), 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 3);
    double secs = (double)(hl_time_ns() - t0) / 1e9;
    CHECK_MSG(secs < 6 * t100 + 0.5, "follow-up took %.2f s (100 tokens: %.2f s)", secs, t100);
    CHECK_EQ_INT(ps_count(p), 1);
    /* the non-stream variant: the client gives up waiting */
    net_http *h;
    hl_err err;
    const char *ns = "{\"model\":\"s260\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,"
                     "\"options\":{\"num_predict\":-1}}";
    CHECK_OK(net_http_open(&p->host, "POST", "/api/generate", "application/json",
                           (int64_t)strlen(ns), &h, &err), &err);
    CHECK_OK(net_http_send(h, ns, strlen(ns), &err), &err);
    sp_sleep_ms(30);
    net_http_close(h);
    CHECK_EQ_INT(req(p, "POST", "/api/embed", "{\"model\":\"s260\",\"input\":\"x\"}"), 200);
}

TEST(api_client_disconnect_cancels) { WITH_SERVER(disconnect_api); }

/* ---------------- the CLI: run, stop, ps, the REPL ---------------- */

static int g_port;
static char g_out[65536], g_err[8192];

/* Runs $HEARTH_BIN with args; stdin_text (NULL: empty) is piped in. */
static int run_cli(const char *stdin_text, const char *const *args) {
    return sp_run_cli(g_port, stdin_text ? stdin_text : "", args, g_out, sizeof g_out, g_err,
                      sizeof g_err);
}

static bool cli_generate_text(const char *prompt, int n, char *out, size_t cap) {
    char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", n);
    const char *args[] = {"generate", "-m", stories(), "-p", prompt, "-n", nbuf, "--temp", "0", NULL};
    if (run_cli(NULL, args) != 0) return false;
    size_t len = strlen(g_out);
    if (len && g_out[len - 1] == '\n') g_out[--len] = '\0';
    snprintf(out, cap, "%s", g_out);
    return true;
}

/* Runs the REPL on a pseudo-terminal, typing input; collects the output. */
static int run_pty(const char *input, const char *const *args, char *out, size_t cap) {
    const char *bin = getenv("HEARTH_BIN");
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) return -1;
    char slave_name[256];
    if (ptsname_r(master, slave_name, sizeof slave_name)) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int s = open(slave_name, O_RDWR);
        dup2(s, 0);
        dup2(s, 1);
        dup2(s, 2);
        close(master);
        char hostv[64];
        snprintf(hostv, sizeof hostv, "127.0.0.1:%d", g_port);
        setenv("HEARTH_HOST", hostv, 1);
        setenv("HOME", test_tmpdir(), 1); /* the REPL's history file goes there */
        const char *argv[16];
        int n = 0;
        argv[n++] = bin;
        for (int i = 0; args[i] && n < 15; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    /* type line by line, reading what comes back */
    size_t len = 0;
    out[0] = '\0';
    fcntl(master, F_SETFL, O_NONBLOCK);
    const char *p = input;
    size_t sent_at = 0;
    int status = 0;
    bool exited = false;
    for (int tick = 0; tick < 600 && !exited; tick++) { /* 30 s at most */
        char buf[4096];
        ssize_t n;
        while ((n = read(master, buf, sizeof buf)) > 0) {
            size_t k = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
            memcpy(out + len, buf, k);
            len += k;
            out[len] = '\0';
        }
        /* a "\x03" line: Ctrl-C once the response has started streaming */
        if (p[0] == '\x03' && len > sent_at + 60) {
            if (write(master, "\x03", 1) < 0) break;
            p += p[1] == '\n' ? 2 : 1;
            sent_at = len;
        }
        /* send the next line once the REPL is waiting at a prompt */
        else if (*p && p[0] != '\x03' && len >= 4 &&
                 (strcmp(out + len - 4, ">>> ") == 0 || strcmp(out + len - 4, "... ") == 0)) {
            const char *nl = strchr(p, '\n');
            size_t l = nl ? (size_t)(nl - p + 1) : strlen(p);
            if (write(master, p, l) < 0) break;
            p += l;
            sent_at = len;
            if (!*p) { /* after the script: Ctrl-D ends it */
            }
        } else if (!*p && len >= 4 && strcmp(out + len - 4, ">>> ") == 0) {
            if (write(master, "\x04", 1) < 0) break;
        }
        if (waitpid(pid, &status, WNOHANG) == pid) exited = true;
        else sp_sleep_ms(50);
    }
    if (!exited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    close(master);
    return exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void cli_api(srv_proc *p) {
    g_port = p->port;
    CHECK(create_model(p, "s260", stories(), "\"parameters\":{\"temperature\":0,\"num_predict\":20}"));
    char expect[4096];
    CHECK(cli_generate_text("Once upon a time", 20, expect, sizeof expect));
    /* one-shot with a prompt argument (the prompt goes through {{ .Prompt }}) */
    const char *a1[] = {"run", "s260", "Once", "upon", "a", "time", NULL};
    CHECK_EQ_INT(run_cli(NULL, a1), 0);
    char want[4200];
    snprintf(want, sizeof want, "%s\n\n", expect);
    CHECK_STR(g_out, want);
    /* piped stdin */
    const char *a2[] = {"run", "s260", NULL};
    CHECK_EQ_INT(run_cli("Once upon a time", a2), 0);
    CHECK_STR(g_out, want);
    /* stdin then the argument */
    const char *a3[] = {"run", "s260", "a time", NULL};
    CHECK_EQ_INT(run_cli("Once upon", a3), 0);
    CHECK_STR(g_out, want);
    /* --verbose prints the stats to stderr */
    const char *a4[] = {"run", "s260", "--verbose", "Once", NULL};
    CHECK_EQ_INT(run_cli(NULL, a4), 0);
    CHECK(strstr(g_err, "eval count:           20 token(s)") != NULL);
    CHECK(strstr(g_err, "prompt eval rate:") != NULL);
    /* ps shows it; stop unloads it */
    const char *a5[] = {"ps", NULL};
    CHECK_EQ_INT(run_cli(NULL, a5), 0);
    CHECK(strstr(g_out, "NAME") && strstr(g_out, "PROCESSOR") && strstr(g_out, "CONTEXT") &&
          strstr(g_out, "UNTIL"));
    CHECK_MSG(strstr(g_out, "s260:latest") && strstr(g_out, "100% CPU") && strstr(g_out, "2048") &&
                  strstr(g_out, "minutes from now"), "%s", g_out);
    const char *a6[] = {"stop", "s260", NULL};
    CHECK_EQ_INT(run_cli(NULL, a6), 0);
    CHECK_EQ_INT(ps_count(p), 0);
    const char *a7[] = {"stop", "nope", NULL};
    CHECK_EQ_INT(run_cli(NULL, a7), 1);
    CHECK_STR(g_err, "Error: couldn't find model \"nope\" to stop\n");
    /* a missing model is pulled first (as Ollama does); a loopback host with no
     * registry keeps the attempt on this machine */
    const char *a8[] = {"run", "127.0.0.1:1/library/nope", "hi", NULL};
    CHECK_EQ_INT(run_cli(NULL, a8), 1);
    CHECK_MSG(strncmp(g_err, "pulling manifest\nError: pull model manifest: ", 45) == 0, "%s", g_err);

    /* the REPL on a terminal */
    static char out[65536];
    const char *script = "/?\n"
                         "/set parameter num_predict 5\n"
                         "/set parameter bogus 1\n"
                         "/set system You are Lily.\n"
                         "/show system\n"
                         "/show parameters\n"
                         "\"\"\"Once\n"
                         "upon a time\"\"\"\n"
                         "/show template\n"
                         "/clear\n"
                         "/nope\n"
                         "/bye\n";
    const char *ar[] = {"run", "s260", NULL};
    int rc = run_pty(script, ar, out, sizeof out);
    CHECK_EQ_INT(rc, 0);
    CHECK(strstr(out, "Available Commands:") != NULL);
    CHECK(strstr(out, "Set parameter 'num_predict' to '5'") != NULL);
    CHECK(strstr(out, "Couldn't set parameter: unknown parameter 'bogus'") != NULL);
    CHECK(strstr(out, "Set system message.") != NULL);
    CHECK(strstr(out, "You are Lily.") != NULL);
    CHECK(strstr(out, "num_predict") != NULL);
    CHECK(strstr(out, "... ") != NULL);
    CHECK(strstr(out, "Cleared session context") != NULL);
    CHECK(strstr(out, "Unknown command '/nope'. Type /? for help") != NULL);
    CHECK_MSG(ps_count(p) == 1, "the REPL loads the model");
    /* Ctrl-C stops a response (format json keeps it from ending by itself); the REPL
     * goes on, and the server is free at once */
    rc = run_pty("/set format json\n/set parameter num_predict -1\nOnce upon a time\n\x03\n/bye\n", ar,
                 out, sizeof out);
    CHECK_EQ_INT(rc, 0);
    CHECK(strstr(out, "Set format to 'json' mode.") != NULL);
    CHECK(strstr(out, "{") != NULL);
    const char *a9[] = {"run", "s260", "Once", NULL};
    CHECK_EQ_INT(run_cli(NULL, a9), 0);
    CHECK_MSG(strlen(g_out) > 0, "after Ctrl-C: %s", g_err);
    /* Ctrl-D at the prompt exits too */
    rc = run_pty("", ar, out, sizeof out);
    CHECK_EQ_INT(rc, 0);
}

TEST(api_cli_run_stop_ps_repl) { WITH_SERVER(cli_api); }

/* ---------------- the official ollama npm client ---------------- */

static void npm_client(srv_proc *p) {
    CHECK(create_model(p, "s260", stories(), ""));
    char *text = NULL;
    bool ok = sp_run_node(p, "tests/npm/ollama_client.mjs", "s260", NULL, &text);
    CHECK_MSG(ok, "node client: %s", text ? text : "(no output)");
    free(text);
}

TEST(api_npm_ollama_client) {
    if (!sp_node_available()) SKIP("node is not installed (the npm client test needs Node.js)");
    if (access("tests/npm/node_modules/ollama/package.json", R_OK) != 0)
        SKIP("tests/npm/node_modules is missing: run `npm ci` in tests/npm (.ci/run does)");
    WITH_SERVER(npm_client);
}

/* ---------------- robustness: every field with every JSON type ---------------- */

static void fuzz_api(srv_proc *p) {
    char path[1100];
    snprintf(path, sizeof path, "%s/chatml.gguf", test_tmpdir());
    CHECK(write_templated_gguf(stories(), path, k_chatml, NULL));
    /* bounded work whatever the request says */
    CHECK(create_model(p, "f", path, "\"parameters\":{\"num_predict\":2,\"num_ctx\":64}"));
    static const char *values[] = {"null", "true", "-1", "1e308", "\"x\"", "[]", "{}",
                                   "[1,\"a\",{},null]", "{\"role\":5,\"content\":[]}",
                                   "[{\"role\":\"user\",\"content\":{}},{}]"};
    static const struct {
        const char *path;
        const char *fields[18];
    } eps[] = {
        {"/api/generate", {"prompt", "suffix", "system", "template", "context", "stream", "raw",
                           "format", "keep_alive", "images", "options", "think", "truncate",
                           "top_logprobs", "_debug_render_only", "logprobs", "model", NULL}},
        {"/api/chat", {"messages", "tools", "format", "options", "keep_alive", "think", "stream",
                       "truncate", "model", NULL}},
        {"/api/embed", {"input", "truncate", "dimensions", "keep_alive", "options", "model", NULL}},
        {"/api/embeddings", {"prompt", "options", "keep_alive", "model", NULL}},
    };
    int n = 0;
    for (size_t e = 0; e < sizeof eps / sizeof eps[0]; e++)
        for (int f = 0; eps[e].fields[f]; f++)
            for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
                char body[512];
                const char *base = strcmp(eps[e].path, "/api/chat") == 0
                                       ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
                                       : strstr(eps[e].path, "embed") ? "\"input\":\"hi\",\"prompt\":\"hi\""
                                                                      : "\"prompt\":\"hi\"";
                if (strcmp(eps[e].fields[f], "model") == 0)
                    snprintf(body, sizeof body, "{\"model\":%s,%s,\"stream\":false}", values[v], base);
                else
                    snprintf(body, sizeof body, "{\"model\":\"f\",%s,\"stream\":false,\"%s\":%s}",
                             base, eps[e].fields[f], values[v]);
                int st = req(p, "POST", eps[e].path, body);
                CHECK_MSG(st == 200 || st == 400 || st == 404 || st == 500,
                          "%s %s -> %d", eps[e].path, body, st);
                /* errors are JSON objects with a message */
                if (st >= 400) CHECK_MSG(*resp_error() != '\0', "%s %s -> %s", eps[e].path, body, g_resp);
                n++;
            }
    CHECK(n > 300);
    /* still healthy */
    CHECK_EQ_INT(req(p, "POST", "/api/generate", "{\"model\":\"f\",\"prompt\":\"x\",\"stream\":false}"), 200);
    CHECK_EQ_INT((int)jint(g_json, "eval_count"), 2);
}

TEST(api_every_field_every_type) { WITH_SERVER(fuzz_api); }
