/*
 * pull.c - `hearth pull MODEL [--insecure]`, `hearth push MODEL [--insecure]`, and the
 * pull that `hearth run` does for a missing model: streams /api/pull or /api/push and
 * shows the progress on stderr as Ollama does. On a terminal every layer gets a live
 * line (bar, percent, size, speed, time left) redrawn in place; otherwise each status
 * prints once as a plain line ("pulling 6a0746a1ec1a: 100% 4.7 GB" when a layer is done).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "net/http_client.h"

#define MAX_ROWS 64

typedef struct row {
    char status[128];
    char digest[80]; /* "" for plain status rows */
    uint64_t total, completed;
    double t0;          /* when the row appeared */
    uint64_t c0;        /* completed then (bytes already on disk are no speed) */
    bool printed_done;  /* plain mode: the completion line is out */
} row;

typedef struct view {
    bool tty;
    row rows[MAX_ROWS];
    int n;
    int drawn;      /* lines on screen from the last redraw */
    double last_draw;
} view;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void format_row(const row *r, char *out, size_t cap) {
    if (!r->digest[0] || !r->total) {
        snprintf(out, cap, "%s", r->status);
        return;
    }
    char tot[32], done[32];
    cli_human_size(r->total, tot, sizeof tot);
    cli_human_size(r->completed, done, sizeof done);
    int pct = (int)(r->completed * 100 / r->total);
    enum { width = 25 };
    int fill = (int)(r->completed * (uint64_t)width / r->total);
    char bar[width * 3 + 1];
    size_t bl = 0;
    for (int i = 0; i < width; i++) {
        const char *c = i < fill ? "\xe2\x96\x88" : " "; /* U+2588 FULL BLOCK */
        size_t cl = strlen(c);
        memcpy(bar + bl, c, cl);
        bl += cl;
    }
    bar[bl] = '\0';
    if (r->completed >= r->total) {
        snprintf(out, cap, "%s: 100%% \xe2\x96\x95%s\xe2\x96\x8f %s", r->status, bar, tot);
        return;
    }
    double dt = now_s() - r->t0;
    double rate = dt > 0.5 ? (double)(r->completed - r->c0) / dt : 0;
    char speed[48] = "", eta[48] = "";
    if (rate > 0) {
        char s[32];
        cli_human_size((uint64_t)rate, s, sizeof s);
        snprintf(speed, sizeof speed, "%s/s", s);
        double left = (double)(r->total - r->completed) / rate;
        int m = (int)(left / 60), sec = (int)left % 60;
        if (m) snprintf(eta, sizeof eta, "%dm%ds", m, sec);
        else snprintf(eta, sizeof eta, "%ds", sec);
    }
    snprintf(out, cap, "%s: %3d%% \xe2\x96\x95%s\xe2\x96\x8f %s/%s  %s  %s", r->status, pct, bar, done,
             tot, speed, eta);
}

static void redraw(view *v, bool force) {
    double t = now_s();
    if (!force && t - v->last_draw < 0.1) return;
    v->last_draw = t;
    if (v->drawn) fprintf(stderr, "\033[%dA", v->drawn);
    for (int i = 0; i < v->n; i++) {
        char line[512];
        format_row(&v->rows[i], line, sizeof line);
        fprintf(stderr, "\r\033[K%s\n", line);
    }
    v->drawn = v->n;
    fflush(stderr);
}

static row *find_row(view *v, const char *status, const char *digest) {
    for (int i = 0; i < v->n; i++) {
        row *r = &v->rows[i];
        if (digest ? strcmp(r->digest, digest) == 0 : (!r->digest[0] && strcmp(r->status, status) == 0))
            return r;
    }
    return NULL;
}

static void update(view *v, json_t *j) {
    const char *status = json_string_value(json_object_get(j, "status"));
    const char *digest = json_string_value(json_object_get(j, "digest"));
    if (!status) return;
    uint64_t total = (uint64_t)json_integer_value(json_object_get(j, "total"));
    uint64_t completed = (uint64_t)json_integer_value(json_object_get(j, "completed"));
    row *r = find_row(v, status, digest);
    bool fresh = !r;
    if (!r) {
        if (v->n == MAX_ROWS) { /* keep the newest rows */
            memmove(v->rows, v->rows + 1, sizeof v->rows[0] * (MAX_ROWS - 1));
            v->n--;
            if (v->drawn) v->drawn--;
        }
        r = &v->rows[v->n++];
        memset(r, 0, sizeof *r);
        snprintf(r->status, sizeof r->status, "%s", status);
        if (digest) snprintf(r->digest, sizeof r->digest, "%s", digest);
        r->t0 = now_s();
        r->c0 = completed;
    }
    r->total = total;
    r->completed = completed;
    if (v->tty) {
        redraw(v, fresh || (total && completed >= total));
        return;
    }
    if (!digest || !total) {
        if (fresh) fprintf(stderr, "%s\n", status);
    } else if (completed >= total && !r->printed_done) {
        char tot[32];
        cli_human_size(total, tot, sizeof tot);
        fprintf(stderr, "%s: 100%% %s\n", status, tot);
        r->printed_done = true;
    }
    fflush(stderr);
}

int cli_transfer(const char *path, const char *model, bool insecure) {
    net_host host;
    if (!cli_host(&host)) return 1;
    json_t *body = json_pack("{s:s, s:b}", "model", model, "insecure", insecure);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) return cli_fail("out of memory");
    net_http *h;
    hl_err err;
    hl_status st = net_http_open(&host, "POST", path, "application/json", (int64_t)strlen(text), &h, &err);
    if (st != HL_OK) {
        free(text);
        return cli_connect_error(err.msg);
    }
    st = net_http_send(h, text, strlen(text), &err);
    free(text);
    if (st == HL_OK) st = net_http_finish(h, &err);
    view *v = calloc(1, sizeof *v);
    if (!v) {
        net_http_close(h);
        return cli_fail("out of memory");
    }
    v->tty = isatty(STDERR_FILENO);
    int rc = 0;
    bool success = false;
    while (st == HL_OK) {
        char *line;
        size_t len;
        st = net_http_read_line(h, &line, &len, &err);
        if (st != HL_OK || !line) break;
        if (len == 0) continue;
        json_t *j = json_loadb(line, len, 0, NULL);
        const char *e = json_string_value(json_object_get(j, "error"));
        if (e) {
            if (v->tty) redraw(v, true);
            rc = cli_fail("%s", e);
        } else {
            update(v, j);
            const char *s = json_string_value(json_object_get(j, "status"));
            if (s && strcmp(s, "success") == 0) success = true;
        }
        json_decref(j);
        if (rc) break;
    }
    if (v->tty && !rc) redraw(v, true);
    free(v);
    net_http_close(h);
    if (st != HL_OK) return cli_connect_error(err.msg);
    if (!rc && !success) rc = cli_fail("the server ended the stream without success");
    return rc;
}

static int transfer_cmd(int argc, char **argv, const char *path) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"insecure", no_argument, NULL, 'i'},
                                         {NULL, 0, NULL, 0}};
    bool insecure = false;
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') return cli_help(cli_usage_of(argv[0]));
        if (c == 'i') insecure = true;
        else return cli_flag_error(c, argv);
    }
    if (argc - optind != 1) return cli_fail("usage: hearth %s MODEL [--insecure]", argv[0]);
    return cli_transfer(path, argv[optind], insecure);
}

int cmd_pull(int argc, char **argv) { return transfer_cmd(argc, argv, "/api/pull"); }

int cmd_push(int argc, char **argv) { return transfer_cmd(argc, argv, "/api/push"); }
