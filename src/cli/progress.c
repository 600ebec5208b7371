/* progress.c - the live per-layer progress rows of pull, push and create (cli.h). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define MAX_ROWS 64
#define BAR_WIDTH 25

typedef struct row {
    char key[128];
    char status[128];
    uint64_t total, completed;
    double rate;          /* bytes/s, smoothed */
    double ts;            /* the last rate sample */
    uint64_t cs;          /* completed then */
    int quarter;          /* plain quarters: the last quarter printed (-1 none) */
    bool printed_done;    /* plain: the completion line is out */
} row;

struct cli_progress {
    FILE *out;
    bool tty, quarters;
    row rows[MAX_ROWS];
    int n;
    int drawn; /* lines on screen from the last redraw */
    double last_draw;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The cursor is hidden while rows redraw; a Ctrl-C (or kill) then would leave the
 * terminal without one, so SIGINT/SIGTERM show it again before the default action. Only
 * where nobody else handles the signal. */
static volatile sig_atomic_t g_cursor_fd = -1;
static struct sigaction g_old_int, g_old_term;
static bool g_caught_int, g_caught_term;

static void on_fatal(int sig) {
    int fd = g_cursor_fd;
    if (fd >= 0) {
        ssize_t w = write(fd, "\033[?25h\n", 7);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static bool catch_if_default(int sig, struct sigaction *old) {
    if (sigaction(sig, NULL, old) != 0 || old->sa_handler != SIG_DFL) return false;
    struct sigaction sa = {0};
    sa.sa_handler = on_fatal;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == 0;
}

cli_progress *cli_progress_new(FILE *out, bool tty, bool quarters) {
    cli_progress *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->out = out;
    v->tty = tty;
    v->quarters = quarters;
    if (tty) {
        fflush(out);
        g_cursor_fd = fileno(out);
        g_caught_int = catch_if_default(SIGINT, &g_old_int);
        g_caught_term = catch_if_default(SIGTERM, &g_old_term);
        fputs("\033[?25l", out); /* no cursor flicker while redrawing */
    }
    return v;
}

/* Terminal columns (80 when unknown). */
static int columns(FILE *out) {
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    return 80;
}

/* Cuts s to at most cols display columns (UTF-8: continuation bytes take none). */
static void fit(char *s, int cols) {
    int w = 0;
    for (char *p = s; *p; p++) {
        if (((unsigned char)*p & 0xC0) == 0x80) continue;
        if (++w > cols) {
            *p = '\0';
            return;
        }
    }
}

static void format_row(const row *r, char *out, size_t cap) {
    if (!r->total) {
        snprintf(out, cap, "%s", r->status);
        return;
    }
    char tot[32], done[32];
    cli_human_size(r->total, tot, sizeof tot);
    cli_human_size(r->completed, done, sizeof done);
    uint64_t c = r->completed > r->total ? r->total : r->completed;
    int pct = (int)(c * 100 / r->total);
    int fill = (int)(c * BAR_WIDTH / r->total);
    char bar[BAR_WIDTH * 3 + 1];
    size_t bl = 0;
    for (int i = 0; i < BAR_WIDTH; i++) {
        const char *ch = i < fill ? "\xe2\x96\x88" : " "; /* U+2588 FULL BLOCK */
        size_t cl = strlen(ch);
        memcpy(bar + bl, ch, cl);
        bl += cl;
    }
    bar[bl] = '\0';
    if (c >= r->total) {
        snprintf(out, cap, "%s: 100%% \xe2\x96\x95%s\xe2\x96\x8f %s", r->status, bar, tot);
        return;
    }
    char speed[48] = "", eta[48] = "";
    if (r->rate > 0) {
        char sz[32];
        cli_human_size((uint64_t)r->rate, sz, sizeof sz);
        snprintf(speed, sizeof speed, "%s/s", sz);
        double left = (double)(r->total - c) / r->rate;
        int h = (int)(left / 3600), m = (int)(left / 60) % 60, sec = (int)left % 60;
        if (h) snprintf(eta, sizeof eta, "%dh%dm", h, m);
        else if (m) snprintf(eta, sizeof eta, "%dm%ds", m, sec);
        else snprintf(eta, sizeof eta, "%ds", sec);
    }
    snprintf(out, cap, "%s: %3d%% \xe2\x96\x95%s\xe2\x96\x8f %s/%s  %s  %s", r->status, pct, bar, done,
             tot, speed, eta);
}

static void redraw(cli_progress *v, bool force) {
    double t = now_s();
    if (!force && t - v->last_draw < 0.1) return;
    v->last_draw = t;
    int cols = columns(v->out) - 1;
    if (v->drawn) fprintf(v->out, "\033[%dA", v->drawn);
    for (int i = 0; i < v->n; i++) {
        char line[1024];
        format_row(&v->rows[i], line, sizeof line);
        fit(line, cols > 10 ? cols : 10); /* a wrapped line would break the cursor-up */
        fprintf(v->out, "\r\033[K%s\n", line);
    }
    v->drawn = v->n;
    fflush(v->out);
}

void cli_progress_set(cli_progress *v, const char *key, const char *status, uint64_t total,
                      uint64_t completed) {
    if (!v || !status) return;
    if (!key) key = status;
    row *r = NULL;
    for (int i = 0; i < v->n && !r; i++)
        if (strcmp(v->rows[i].key, key) == 0) r = &v->rows[i];
    bool fresh = !r;
    double t = now_s();
    if (!r) {
        if (v->n == MAX_ROWS) { /* keep the newest rows */
            memmove(v->rows, v->rows + 1, sizeof v->rows[0] * (MAX_ROWS - 1));
            v->n--;
            if (v->drawn) v->drawn--;
        }
        r = &v->rows[v->n++];
        memset(r, 0, sizeof *r);
        snprintf(r->key, sizeof r->key, "%s", key);
        r->ts = t;
        r->cs = completed; /* bytes already there are no speed */
        r->quarter = -1;
    }
    snprintf(r->status, sizeof r->status, "%s", status);
    r->total = total;
    r->completed = completed;
    if (t - r->ts >= 0.5) { /* a speed sample, smoothed over the last few seconds */
        double inst = completed > r->cs ? (double)(completed - r->cs) / (t - r->ts) : 0;
        r->rate = r->rate > 0 ? 0.7 * r->rate + 0.3 * inst : inst;
        r->ts = t;
        r->cs = completed;
    }
    if (v->tty) {
        redraw(v, fresh || (total && completed >= total));
        return;
    }
    if (!total) {
        if (fresh) fprintf(v->out, "%s\n", status);
    } else if (v->quarters) {
        int q = (int)((completed > total ? total : completed) * 4 / total);
        if (q != r->quarter) {
            fprintf(v->out, "%s %d%%\n", status, (int)((completed > total ? total : completed) * 100 / total));
            r->quarter = q;
        }
    } else if (completed >= total && !r->printed_done) {
        char tot[32];
        cli_human_size(total, tot, sizeof tot);
        fprintf(v->out, "%s: 100%% %s\n", status, tot);
        r->printed_done = true;
    }
    fflush(v->out);
}

void cli_progress_end(cli_progress *v) {
    if (!v) return;
    if (v->tty) {
        redraw(v, true);
        fputs("\033[?25h", v->out);
        fflush(v->out);
        if (g_caught_int) sigaction(SIGINT, &g_old_int, NULL);
        if (g_caught_term) sigaction(SIGTERM, &g_old_term, NULL);
        g_caught_int = g_caught_term = false;
        g_cursor_fd = -1;
    }
    free(v);
}
