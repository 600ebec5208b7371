/* compat.c - helpers shared by the OpenAI and Anthropic layers (compat.h). */
#define _GNU_SOURCE
#include "server/compat.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static char *dump(json_t *obj) {
    char *s = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15))
                  : NULL;
    json_decref(obj);
    return s;
}

char *compat_sse_data(json_t *obj) {
    char *s = dump(obj), *out = NULL;
    if (s && asprintf(&out, "data: %s\n\n", s) < 0) out = NULL;
    free(s);
    return out;
}

char *compat_sse_event(const char *name, json_t *obj) {
    char *s = dump(obj), *out = NULL;
    if (s && asprintf(&out, "event: %s\ndata: %s\n\n", name, s) < 0) out = NULL;
    free(s);
    return out;
}

char *compat_cat(char *a, char *b) {
    if (!a) return b;
    if (!b) return a;
    size_t na = strlen(a), nb = strlen(b);
    char *r = realloc(a, na + nb + 1);
    if (!r) {
        free(b);
        return a;
    }
    memcpy(r + na, b, nb + 1);
    free(b);
    return r;
}

/* splitmix64 over a clock-seeded counter: ids only need to be unlikely to repeat. */
static pthread_mutex_t g_rng_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_rng_state;

static uint64_t next_random(void) {
    pthread_mutex_lock(&g_rng_lock);
    if (!g_rng_state) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_rng_state = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                      ((uint64_t)(uintptr_t)&ts << 17);
    }
    uint64_t z = (g_rng_state += 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&g_rng_lock);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void compat_random_hex(char *out, size_t n) {
    static const char hex[] = "0123456789abcdef";
    uint64_t bits = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % 16 == 0) bits = next_random();
        out[i] = hex[bits & 15];
        bits >>= 4;
    }
    out[n] = '\0';
}

char *compat_strip_billing_header(const char *text) {
    size_t len = strlen(text), hl = strlen(COMPAT_BILLING_HEADER), n = 0;
    char *out = malloc(len + 1);
    if (!out) return NULL;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t line = nl ? (size_t)(nl - p) + 1 : strlen(p);
        const char *q = p;
        while (q < p + line && (*q == ' ' || *q == '\t')) q++;
        bool billing = (size_t)(p + line - q) >= hl && strncasecmp(q, COMPAT_BILLING_HEADER, hl) == 0;
        if (!billing) {
            memcpy(out + n, p, line);
            n += line;
        }
        p += line;
    }
    out[n] = '\0';
    return out;
}

bool compat_number(const json_t *obj, const char *key, double *out, bool *bad) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return false;
    if (!json_is_number(v)) {
        *bad = true;
        return false;
    }
    *out = json_number_value(v);
    return true;
}

json_t *compat_text(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_incref(v) : json_string("");
}

size_t compat_text_len(const json_t *obj, const char *key) {
    return json_string_length(json_object_get(obj, key)); /* 0 for a non-string */
}

void compat_tool_choice(const json_t *choice, json_t *native) {
    const char *type = json_string_value(json_object_get(choice, "type"));
    const char *name = json_string_value(json_object_get(choice, "name"));
    if (!name && type && !strcmp(type, "function"))
        name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    if (name && type && (!strcmp(type, "function") || !strcmp(type, "tool")))
        json_object_set_new(native, "_tool_choice", json_pack("{s:s}", "name", name));
    else if ((json_is_string(choice) && !strcmp(json_string_value(choice), "required")) ||
             (type && !strcmp(type, "any")))
        json_object_set_new(native, "_tool_choice", json_string("required"));
}
