/* libFuzzer target: compile arbitrary bytes as an Ollama Go template, execute it over a
 * small conversation, and run the output processors (stop strings, thinking, tool calls,
 * the JSON-format recognizer) over the same bytes. Any crash, hang or sanitizer report is
 * a bug; errors are fine. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/gotmpl.h"
#include "server/jsonfmt.h"
#include "server/outproc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *ctx, *tools;
    if (!ctx) {
        ctx = json_loads("{\"System\": \"sys\", \"Prompt\": \"p\", \"Response\": \"\", \"Messages\":"
                         " [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\","
                         " \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
                         " \"arguments\": {\"a\": [1, 2.5, null]}}}]}],"
                         " \"Tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", 0, NULL);
        tools = json_object_get(ctx, "Tools");
    }
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    gotmpl *t;
    if (gotmpl_compile(src, &t, NULL) == HL_OK) {
        char *out;
        if (gotmpl_exec(t, ctx, size % 2 == 0, &out, NULL) == HL_OK) free(out);
        gotmpl_free(t);
    }
    /* output processing, fed in uneven pieces */
    char *stops[] = {"</s>", "\n\nUser:"};
    stop_matcher sm;
    think_parser th;
    tool_parser tp;
    outbuf ready = {0}, thinking = {0}, content = {0};
    json_t *calls = json_array();
    json_prefix jp;
    json_prefix_init(&jp);
    stop_init(&sm, stops, 2);
    think_init(&th, "<think>", "</think>", size % 3 == 0);
    tool_init(&tp, size % 5 == 0 ? "{" : "<tool_call>", tools);
    for (size_t i = 0; i < size;) {
        size_t n = 1 + (data[i] % 7);
        if (n > size - i) n = size - i;
        outbuf_clear(&ready);
        bool stopped = stop_feed(&sm, src + i, n, &ready);
        think_feed(&th, ready.p ? ready.p : "", ready.len, &thinking, &content);
        (void)json_prefix_feed_all(&jp, src + i, n);
        i += n;
        if (stopped) break;
    }
    think_flush(&th, &thinking, &content);
    tool_feed(&tp, content.p ? content.p : "", content.len, &ready);
    tool_flush(&tp, calls, &ready);
    stop_free(&sm);
    think_free(&th);
    tool_free(&tp);
    outbuf_free(&ready);
    outbuf_free(&thinking);
    outbuf_free(&content);
    json_decref(calls);
    free(src);
    return 0;
}
