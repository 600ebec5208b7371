/* spinner.c - the terminal spinner shown while a model loads (see cli.h). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

struct cli_spinner {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    char msg[128];
};

static void *spin(void *arg) {
    /* Ollama's frames (braille dots), one every 100 ms */
    static const char *frames[] = {"\xe2\xa0\x8b", "\xe2\xa0\x99", "\xe2\xa0\xb9", "\xe2\xa0\xb8",
                                   "\xe2\xa0\xbc", "\xe2\xa0\xb4", "\xe2\xa0\xa6", "\xe2\xa0\xa7",
                                   "\xe2\xa0\x87", "\xe2\xa0\x8f"};
    cli_spinner *s = arg;
    pthread_mutex_lock(&s->mu);
    for (unsigned i = 0; !s->stop; i++) {
        fprintf(stderr, "\r\033[K%s%s%s", s->msg, s->msg[0] ? " " : "", frames[i % 10]);
        fflush(stderr);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &until) == 0) {
        }
    }
    fputs("\r\033[K", stderr); /* leave the line clean for the answer */
    fflush(stderr);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

cli_spinner *cli_spinner_start(const char *msg) {
    if (!isatty(STDERR_FILENO)) return NULL;
    cli_spinner *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    snprintf(s->msg, sizeof s->msg, "%s", msg ? msg : "");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    /* signals (Ctrl-C stopping a reply) must reach the thread that reads, not this one */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int prc = pthread_create(&s->thread, NULL, spin, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    return s;
}

void cli_spinner_stop(cli_spinner *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
