/* format.c - Go's time.Duration String() and Ollama's --verbose stats (see cli_fmt.h). */
#include "cli/cli_fmt.h"

#include <stdio.h>
#include <string.h>

/* Writes v / 10^prec's fraction backwards ending at buf[w], trailing zeros dropped (and
 * the dot when nothing is left), as Go's fmtFrac; returns the new w, v becomes v / 10^prec. */
static size_t frac_back(char *buf, size_t w, uint64_t *v, int prec) {
    bool print = false;
    for (int i = 0; i < prec; i++) {
        unsigned digit = (unsigned)(*v % 10);
        print = print || digit != 0;
        if (print) buf[--w] = (char)('0' + digit);
        *v /= 10;
    }
    if (print) buf[--w] = '.';
    return w;
}

static size_t int_back(char *buf, size_t w, uint64_t v) {
    if (v == 0) {
        buf[--w] = '0';
        return w;
    }
    while (v > 0) {
        buf[--w] = (char)('0' + v % 10);
        v /= 10;
    }
    return w;
}

void cli_go_duration(int64_t ns, char *out, size_t cap) {
    char buf[40];
    size_t w = sizeof buf;
    bool neg = ns < 0;
    uint64_t u = neg ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    if (u < 1000000000ull) {
        buf[--w] = 's';
        int prec;
        if (u == 0) {
            buf[--w] = '0';
            goto done;
        } else if (u < 1000ull) {
            prec = 0;
            buf[--w] = 'n';
        } else if (u < 1000000ull) {
            prec = 3;
            buf[--w] = '\xb5'; /* U+00B5 MICRO SIGN, as Go writes it */
            buf[--w] = '\xc2';
        } else {
            prec = 6;
            buf[--w] = 'm';
        }
        w = frac_back(buf, w, &u, prec);
        w = int_back(buf, w, u);
    } else {
        buf[--w] = 's';
        w = frac_back(buf, w, &u, 9);
        w = int_back(buf, w, u % 60); /* u: whole seconds */
        u /= 60;
        if (u > 0) {
            buf[--w] = 'm';
            w = int_back(buf, w, u % 60);
            u /= 60;
            if (u > 0) {
                buf[--w] = 'h';
                w = int_back(buf, w, u);
            }
        }
    }
done:
    if (neg) buf[--w] = '-';
    snprintf(out, cap, "%.*s", (int)(sizeof buf - w), buf + w);
}

void cli_print_metrics(FILE *f, const cli_metrics *m) {
    char d[48];
    if (m->total_ns > 0) {
        cli_go_duration(m->total_ns, d, sizeof d);
        fprintf(f, "total duration:       %s\n", d);
    }
    if (m->load_ns > 0) {
        cli_go_duration(m->load_ns, d, sizeof d);
        fprintf(f, "load duration:        %s\n", d);
    }
    if (m->prompt_eval_count > 0)
        fprintf(f, "prompt eval count:    %lld token(s)\n", (long long)m->prompt_eval_count);
    if (m->prompt_eval_ns > 0) {
        cli_go_duration(m->prompt_eval_ns, d, sizeof d);
        fprintf(f, "prompt eval duration: %s\n", d);
        fprintf(f, "prompt eval rate:     %.2f tokens/s\n",
                (double)m->prompt_eval_count / ((double)m->prompt_eval_ns / 1e9));
    }
    if (m->eval_count > 0) fprintf(f, "eval count:           %lld token(s)\n", (long long)m->eval_count);
    if (m->eval_ns > 0) {
        cli_go_duration(m->eval_ns, d, sizeof d);
        fprintf(f, "eval duration:        %s\n", d);
        fprintf(f, "eval rate:            %.2f tokens/s\n",
                (double)m->eval_count / ((double)m->eval_ns / 1e9));
    }
}
