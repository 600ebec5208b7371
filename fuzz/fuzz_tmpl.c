/* libFuzzer target: compile arbitrary bytes as a chat template and render it with a small
 * conversation. Any crash, hang or sanitizer report is a bug; errors are fine. */
#include <stdint.h>
#include <stdlib.h>

#include "tmpl/tmpl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *ctx;
    if (!ctx)
        ctx = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
                         " {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
                         " {\"role\": \"assistant\", \"content\": \"Yo\", \"tool_calls\": [{\"function\":"
                         " {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null]}}}]}],"
                         " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
                         " \"add_generation_prompt\": true, \"bos_token\": \"<s>\"}", 0, NULL);
    tmpl *t;
    hl_err err;
    if (tmpl_compile((const char *)data, size, &t, &err) != HL_OK) return 0;
    tmpl_limits lim = tmpl_default_limits();
    lim.max_memory = 64u << 20;
    lim.max_iterations = 100000;
    lim.max_steps = 2000000;
    char *out;
    size_t n;
    if (tmpl_render_limited(t, ctx, &lim, &out, &n, &err) == HL_OK) free(out);
    tmpl_destroy(t);
    return 0;
}
