/*
 * log.h - leveled, timestamped log lines on stderr, in the shape of Go's slog text
 * handler (what Ollama writes), so that log tooling made for Ollama reads hearth's:
 *
 *   time=2026-12-03T13:45:01.123Z level=INFO source=server.c:661 msg="Listening on ..."
 *
 * Usage: HL_INFO("loaded %s", name); HL_DEBUG(...) costs one load and a branch when
 * debug is off. HL_LOG_ATTRS(HL_LOG_INFO, "request", "status", "200", "path", p) adds
 * key=value pairs after msg. Every value (msg included) is quoted when it holds a space,
 * '=', a quote or a control byte; quotes, backslashes and control bytes are escaped
 * (\" \\ \n \t \xNN), so no client-supplied text can split or forge a line.
 *
 * The level comes from the environment once (hl_log_init_from_env: HEARTH_DEBUG, else
 * OLLAMA_DEBUG; "1", "true", any positive number: debug; "2" or more also means
 * debug, there is no trace level). Lines are written whole (one fwrite of a line
 * buffered under a lock), so lines of concurrent threads never interleave.
 * Thread-safe.
 */
#ifndef HL_BASE_LOG_H
#define HL_BASE_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

typedef enum hl_log_level {
    HL_LOG_DEBUG = -4,
    HL_LOG_INFO = 0,
    HL_LOG_WARN = 4,
    HL_LOG_ERROR = 8,
} hl_log_level;

/* Reads HEARTH_DEBUG / OLLAMA_DEBUG (see above). */
void hl_log_init_from_env(void);
void hl_log_set_level(hl_log_level min);
bool hl_log_enabled(hl_log_level level);
/* Where lines go (NULL: stderr); for tests. */
void hl_log_set_output(FILE *f);
/* Whether an environment value turns debug on ("1", "true", "yes", "on", n > 0). */
bool hl_log_env_truthy(const char *v);

void hl_log_at(hl_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void hl_log_vat(hl_log_level level, const char *file, int line, const char *fmt, va_list ap);
/* msg, then key/value string pairs ending with a NULL key. */
void hl_log_attrs_at(hl_log_level level, const char *file, int line, const char *msg, ...);

/* Escapes s for a log value as described above (quoted when needed) into out (cap
 * bytes, cut at a character boundary of the escaped form). Returns out. */
const char *hl_log_quote(const char *s, char *out, size_t cap);

#define HL_LOG(level, ...)                                                               \
    do {                                                                                 \
        if (hl_log_enabled(level)) hl_log_at(level, __FILE__, __LINE__, __VA_ARGS__);    \
    } while (0)
#define HL_DEBUG(...) HL_LOG(HL_LOG_DEBUG, __VA_ARGS__)
#define HL_INFO(...) HL_LOG(HL_LOG_INFO, __VA_ARGS__)
#define HL_WARN(...) HL_LOG(HL_LOG_WARN, __VA_ARGS__)
#define HL_ERROR(...) HL_LOG(HL_LOG_ERROR, __VA_ARGS__)
#define HL_LOG_ATTRS(level, msg, ...)                                                    \
    do {                                                                                 \
        if (hl_log_enabled(level))                                                       \
            hl_log_attrs_at(level, __FILE__, __LINE__, msg, __VA_ARGS__, (const char *)0); \
    } while (0)

#endif
