/* log.c - slog-style log lines (log.h). */
#include "base/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static atomic_int g_level = HL_LOG_INFO;
static FILE *g_out;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

bool hl_log_env_truthy(const char *v) {
    if (!v || !*v) return false;
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) return true;
    char *end;
    long n = strtol(v, &end, 10);
    return end != v && !*end && n > 0;
}

void hl_log_init_from_env(void) {
    const char *v = getenv("HEARTH_DEBUG");
    if (!v || !*v) v = getenv("OLLAMA_DEBUG");
    hl_log_set_level(hl_log_env_truthy(v) ? HL_LOG_DEBUG : HL_LOG_INFO);
}

void hl_log_set_level(hl_log_level min) { atomic_store(&g_level, (int)min); }
bool hl_log_enabled(hl_log_level level) { return (int)level >= atomic_load(&g_level); }

void hl_log_set_output(FILE *f) {
    pthread_mutex_lock(&g_mu);
    g_out = f;
    pthread_mutex_unlock(&g_mu);
}

static const char *level_name(hl_log_level l) {
    return l <= HL_LOG_DEBUG ? "DEBUG" : l < HL_LOG_WARN ? "INFO" : l < HL_LOG_ERROR ? "WARN" : "ERROR";
}

const char *hl_log_quote(const char *s, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    if (!cap) return out;
    if (!s) s = "";
    bool quote = !*s;
    for (const unsigned char *p = (const unsigned char *)s; *p && !quote; p++)
        quote = *p <= ' ' || *p == '=' || *p == '"' || *p == '\\' || *p == 0x7f;
    size_t w = 0, room = cap - 1 - (quote ? 2 : 0); /* room for the text between quotes */
    if (cap < 3) quote = false, room = cap - 1;
    if (quote) out[w++] = '"';
    size_t start = w;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[5];
        size_t n;
        if (*p == '"' || *p == '\\') n = 2, e[0] = '\\', e[1] = (char)*p;
        else if (*p == '\n') n = 2, e[0] = '\\', e[1] = 'n';
        else if (*p == '\t') n = 2, e[0] = '\\', e[1] = 't';
        else if (*p == '\r') n = 2, e[0] = '\\', e[1] = 'r';
        else if (*p < 0x20 || *p == 0x7f)
            n = 4, e[0] = '\\', e[1] = 'x', e[2] = hex[*p >> 4], e[3] = hex[*p & 15];
        else n = 1, e[0] = (char)*p;
        if (w - start + n > room) break;
        memcpy(out + w, e, n);
        w += n;
    }
    if (quote) out[w++] = '"';
    out[w] = '\0';
    return out;
}

/* The line under construction: a fixed buffer (no malloc on the way to the log). */
typedef struct line_buf {
    char b[8192];
    size_t n;
} line_buf;

static void put(line_buf *lb, const char *s) {
    size_t len = strlen(s), room = sizeof lb->b - 2 - lb->n; /* keep room for '\n' */
    if (len > room) len = room;
    memcpy(lb->b + lb->n, s, len);
    lb->n += len;
}

static void put_attr(line_buf *lb, const char *key, const char *value) {
    char q[4096];
    put(lb, " ");
    put(lb, key);
    put(lb, "=");
    put(lb, hl_log_quote(value, q, sizeof q));
}

static void head(line_buf *lb, hl_log_level level, const char *file, int line) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    time_t secs = ts.tv_sec;
    gmtime_r(&secs, &tm);
    char t[64];
    size_t n = strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(t + n, sizeof t - n, ".%03ldZ", ts.tv_nsec / 1000000);
    const char *base = file ? strrchr(file, '/') : NULL;
    char src[128];
    snprintf(src, sizeof src, "%s:%d", base ? base + 1 : file ? file : "?", line);
    lb->n = 0;
    put(lb, "time=");
    put(lb, t);
    put(lb, " level=");
    put(lb, level_name(level));
    put(lb, " source=");
    put(lb, src);
}

static void emit(line_buf *lb) {
    lb->b[lb->n++] = '\n';
    pthread_mutex_lock(&g_mu);
    FILE *f = g_out ? g_out : stderr;
    fwrite(lb->b, 1, lb->n, f);
    fflush(f);
    pthread_mutex_unlock(&g_mu);
}

void hl_log_vat(hl_log_level level, const char *file, int line, const char *fmt, va_list ap) {
    if (!hl_log_enabled(level)) return;
    char msg[4096];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0'; /* libmicrohttpd ends its own */
    line_buf lb;
    head(&lb, level, file, line);
    put_attr(&lb, "msg", msg);
    emit(&lb);
}

void hl_log_at(hl_log_level level, const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hl_log_vat(level, file, line, fmt, ap);
    va_end(ap);
}

void hl_log_attrs_at(hl_log_level level, const char *file, int line, const char *msg, ...) {
    if (!hl_log_enabled(level)) return;
    line_buf lb;
    head(&lb, level, file, line);
    put_attr(&lb, "msg", msg);
    va_list ap;
    va_start(ap, msg);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;) {
        const char *v = va_arg(ap, const char *);
        put_attr(&lb, k, v ? v : "");
    }
    va_end(ap);
    emit(&lb);
}
