#define _GNU_SOURCE
#include "cli/cli.h"
#include "server/runner_srv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/http_client.h"

bool cli_dispatch(int argc, char **argv, int *exit_code) {
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"serve", cmd_serve}, {"start", cmd_serve}, {"list", cmd_list}, {"ls", cmd_list},
                {"show", cmd_show},   {"create", cmd_create}, {"rm", cmd_rm},   {"cp", cmd_cp},
                {"ps", cmd_ps},       {"run", cmd_run},     {"stop", cmd_stop},
                {"pull", cmd_pull},   {"push", cmd_push},
                {"runner", runner_srv_main}}; /* hidden: the server's model processes */
    if (argc < 2) return false;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) {
            *exit_code = cmds[i].fn(argc - 1, argv + 1);
            return true;
        }
    return false;
}

int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("Error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

bool cli_host(net_host *out) {
    hl_err err;
    if (net_host_from_env(out, &err) != HL_OK) {
        cli_fail("%s", err.msg);
        return false;
    }
    return true;
}

int cli_connect_error(const char *detail) {
    if (strstr(detail, "could not connect"))
        return cli_fail("could not connect to hearth server, run 'hearth serve' to start it");
    return cli_fail("%s", detail);
}

int cli_call(const char *method, const char *path, json_t *body, json_t **resp) {
    if (resp) *resp = NULL;
    net_host host;
    if (!cli_host(&host)) return 1;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !text) return cli_fail("out of memory");
    int status = 0;
    char *out = NULL;
    size_t out_len = 0;
    hl_err err;
    hl_status st = net_http_request(&host, method, path, text, text ? strlen(text) : 0, &status,
                                    &out, &out_len, &err);
    free(text);
    if (st != HL_OK) return cli_connect_error(err.msg);
    json_error_t je;
    json_t *j = out_len ? json_loadb(out, out_len, 0, &je) : NULL;
    if (status >= 400) {
        const char *msg = json_string_value(json_object_get(j, "error"));
        int rc = msg ? cli_fail("%s", msg) : cli_fail("%d: %s", status, out_len ? out : "request failed");
        json_decref(j);
        free(out);
        return rc;
    }
    free(out);
    if (resp)
        *resp = j;
    else
        json_decref(j);
    return 0;
}

void cli_human_size(uint64_t b, char *buf, size_t cap) {
    static const struct {
        double scale;
        const char *unit;
    } units[] = {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}};
    for (size_t i = 0; i < 4; i++) {
        if ((double)b >= units[i].scale) {
            double v = (double)b / units[i].scale;
            if (v >= 10 || v == trunc(v))
                snprintf(buf, cap, "%d %s", (int)v, units[i].unit);
            else
                snprintf(buf, cap, "%.1f %s", v, units[i].unit);
            return;
        }
    }
    snprintf(buf, cap, "%llu B", (unsigned long long)b);
}

void cli_human_duration(double seconds, char *buf, size_t cap) {
    double s = fabs(seconds);
    long secs = (long)s, mins = (long)(s / 60), hours = (long)(s / 3600 + 0.5);
    if (s < 1) snprintf(buf, cap, "Less than a second");
    else if (secs == 1) snprintf(buf, cap, "1 second");
    else if (secs < 60) snprintf(buf, cap, "%ld seconds", secs);
    else if (mins == 1) snprintf(buf, cap, "About a minute");
    else if (mins < 60) snprintf(buf, cap, "%ld minutes", mins);
    else if (hours == 1) snprintf(buf, cap, "About an hour");
    else if (hours < 48) snprintf(buf, cap, "%ld hours", hours);
    else if (hours < 24 * 7 * 2) snprintf(buf, cap, "%ld days", hours / 24);
    else if (hours < 24 * 30 * 2) snprintf(buf, cap, "%ld weeks", hours / 24 / 7);
    else if (hours < 24 * 365 * 2) snprintf(buf, cap, "%ld months", hours / 24 / 30);
    else snprintf(buf, cap, "%ld years", hours / 24 / 365);
}

bool cli_parse_time(const char *s, double *out) {
    struct tm tm = {0};
    int n = 0;
    if (!s || sscanf(s, "%d-%d-%dT%d:%d:%d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &tm.tm_sec, &n) != 6)
        return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *p = s + n;
    double frac = 0;
    if (*p == '.') {
        char *end;
        frac = strtod(p, &end);
        p = end;
    }
    long off = 0;
    if (*p == '+' || *p == '-') {
        int hh = 0, mm = 0;
        if (sscanf(p + 1, "%d:%d", &hh, &mm) != 2) return false;
        off = (hh * 3600L + mm * 60L) * (*p == '-' ? -1 : 1);
    } else if (*p != 'Z') {
        return false;
    }
    *out = (double)timegm(&tm) - (double)off + frac;
    return true;
}

void cli_print_table(const char *const *header, size_t n_cols, char ***rows, size_t n_rows) {
    size_t width[16] = {0};
    if (n_cols > 16) n_cols = 16;
    for (size_t c = 0; c < n_cols; c++) width[c] = strlen(header[c]);
    for (size_t r = 0; r < n_rows; r++)
        for (size_t c = 0; c < n_cols; c++)
            if (strlen(rows[r][c]) > width[c]) width[c] = strlen(rows[r][c]);
    for (size_t r = 0; r <= n_rows; r++) {
        for (size_t c = 0; c < n_cols; c++) {
            const char *cell = r == 0 ? header[c] : rows[r - 1][c];
            if (c + 1 < n_cols)
                printf("%-*s    ", (int)width[c], cell);
            else
                printf("%s\n", cell);
        }
    }
}

int cli_print_models(json_t *models, const char *prefix, const char *const *header,
                     size_t n_cols, cli_model_cells more) {
    size_t n = json_array_size(models), kept = 0;
    char ***rows = calloc(n ? n : 1, sizeof *rows);
    char *cells = calloc(n ? n : 1, n_cols * CLI_CELL);
    char **ptrs = calloc(n ? n : 1, n_cols * sizeof *ptrs);
    if (!rows || !cells || !ptrs) {
        free(rows), free(cells), free(ptrs);
        return cli_fail("out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(models, i);
        const char *name = json_string_value(json_object_get(m, "name"));
        if (!name || (prefix && strncmp(name, prefix, strlen(prefix)) != 0)) continue;
        char **row = ptrs + n_cols * kept;
        for (size_t c = 0; c < n_cols; c++) row[c] = cells + (n_cols * kept + c) * CLI_CELL;
        snprintf(row[0], CLI_CELL, "%s", name);
        const char *digest = json_string_value(json_object_get(m, "digest"));
        snprintf(row[1], CLI_CELL, "%.12s", digest ? digest : "");
        cli_human_size((uint64_t)json_integer_value(json_object_get(m, "size")), row[2], CLI_CELL);
        more(m, row + 3);
        rows[kept++] = row;
    }
    cli_print_table(header, n_cols, rows, kept);
    free(rows), free(cells), free(ptrs);
    return 0;
}

bool cli_parse_ids(const char *s, int32_t **out, size_t *n, char *why, size_t why_cap) {
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        snprintf(why, why_cap, "out of memory");
        return false;
    }
    size_t k = 0;
    for (const char *p = s;; p++) {
        if (*p < '0' || *p > '9') {
            snprintf(why, why_cap, "expected a token id at offset %zu", (size_t)(p - s));
            free(ids);
            return false;
        }
        long long v = 0;
        for (; *p >= '0' && *p <= '9'; p++) {
            v = v * 10 + (*p - '0');
            if (v > INT32_MAX) {
                snprintf(why, why_cap, "token id too large at offset %zu", (size_t)(p - s));
                free(ids);
                return false;
            }
        }
        ids[k++] = (int32_t)v;
        if (*p == '\0') break;
        if (*p != ',') {
            snprintf(why, why_cap, "unexpected '%c' at offset %zu", *p, (size_t)(p - s));
            free(ids);
            return false;
        }
    }
    *out = ids;
    *n = k;
    return true;
}

hl_status cli_tokenize(const tok_vocab *vocab, const char *text, int32_t **out, size_t *n_out,
                       hl_err *err) {
    size_t len = strlen(text), cap = len + 8, n = 0;
    int32_t *ids = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *bigger = realloc(ids, cap * sizeof *ids);
        if (!bigger) {
            free(ids);
            return hl_fail(err, HL_ERR_NOMEM, "out of memory");
        }
        ids = bigger;
        hl_status st = tok_encode(vocab, text, len, true, true, ids, cap, &n, err);
        if (st) {
            free(ids);
            return st;
        }
        if (n <= cap) break;
        cap = n;
    }
    if (n == 0) { /* an empty prompt starts from BOS */
        int32_t bos = tok_vocab_special(vocab, TOK_SPECIAL_BOS);
        if (bos < 0) {
            free(ids);
            return hl_fail(err, HL_ERR_INVALID,
                           "the prompt is empty and the vocabulary has no BOS token");
        }
        ids[n++] = bos;
    }
    *out = ids;
    *n_out = n;
    return HL_OK;
}
