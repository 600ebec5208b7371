/*
 * bench_http.c - aggregate decode tokens/s through the whole server: `hearth serve`
 * (its runner process doing the continuous batching) driven over loopback HTTP by 1, 2,
 * 4 and 8 concurrent clients.
 *
 *   build/bench/bench_http --model FILE.gguf [--bin build/hearth] [--gen 64] [--runs 3]
 *
 * The server is started with HEARTH_NUM_PARALLEL=8 and a temporary store; the model is
 * uploaded and created as "bench". Each client sends one streamed /api/generate with
 * its own prompt, num_predict --gen, temperature 0, and reads every line. A run's rate is
 * the sum of the final eval_count of its clients over the run's wall time (first request
 * sent to last final line read): prefill, HTTP, JSON and the server-runner hop included.
 * The levels take turns (1, 2, 4, 8, 1, ...) so that the load of a shared machine hits
 * them alike; medians of --runs. The server and its runner are stopped at the end.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "net/http_client.h"
#include "store/sha256.h"

static net_host g_host;
static int g_gen = 64;

typedef struct client {
    int id, run;
    long long eval_count;
    bool ok;
} client;

static void *client_main(void *arg) {
    client *c = arg;
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\":\"bench\",\"prompt\":\"Story %d of run %d: once upon a time\","
             "\"options\":{\"num_predict\":%d,\"temperature\":0}}",
             c->id, c->run, g_gen);
    net_http *h;
    if (net_http_open(&g_host, "POST", "/api/generate", "application/json",
                      (int64_t)strlen(body), &h, NULL) != HL_OK)
        return NULL;
    char *line;
    size_t len;
    json_t *last = NULL;
    if (net_http_send(h, body, strlen(body), NULL) == HL_OK && net_http_finish(h, NULL) == HL_OK &&
        net_http_status(h) == 200)
        while (net_http_read_line(h, &line, &len, NULL) == HL_OK && line) {
            json_decref(last);
            last = json_loadb(line, len, 0, NULL);
        }
    if (json_is_true(json_object_get(last, "done"))) {
        c->eval_count = json_integer_value(json_object_get(last, "eval_count"));
        c->ok = true;
    }
    json_decref(last);
    net_http_close(h);
    return NULL;
}

static double run_level(int conc, int run, bool *ok) {
    client cl[8];
    pthread_t th[8];
    uint64_t t0 = hl_time_ns();
    for (int i = 0; i < conc; i++) {
        cl[i] = (client){.id = i, .run = run};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    long long tokens = 0;
    for (int i = 0; i < conc; i++) {
        pthread_join(th[i], NULL);
        tokens += cl[i].eval_count;
        if (!cl[i].ok) *ok = false;
    }
    return (double)tokens / ((double)(hl_time_ns() - t0) / 1e9);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool create_model(const char *gguf) {
    char *data;
    size_t len;
    if (hl_file_read(gguf, &data, &len, NULL) != HL_OK) return false;
    char digest[80] = "sha256:", url[128], body[512];
    sha256_hex(data, len, digest + 7);
    snprintf(url, sizeof url, "/api/blobs/%s", digest);
    int status = 0;
    char *resp = NULL;
    net_http_request(&g_host, "POST", url, data, len, &status, &resp, NULL, NULL);
    free(resp);
    free(data);
    snprintf(body, sizeof body,
             "{\"model\":\"bench\",\"files\":{\"m.gguf\":\"%s\"},\"stream\":false}", digest);
    resp = NULL;
    net_http_request(&g_host, "POST", "/api/create", body, strlen(body), &status, &resp, NULL, NULL);
    free(resp);
    return status == 200;
}

int main(int argc, char **argv) {
    const char *bin = "build/hearth", *model = NULL;
    int runs = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bin")) bin = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--gen")) g_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
    }
    if (!model) {
        fprintf(stderr, "usage: bench_http --model FILE.gguf [--bin build/hearth] [--gen 64] "
                        "[--runs 3]\n");
        return 2;
    }
    if (runs < 1 || runs > 50) runs = 3;
    char dir[] = "/tmp/hearth-bench-http-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char models[256], logp[256];
    snprintf(models, sizeof models, "%s/models", dir);
    snprintf(logp, sizeof logp, "%s/serve.log", dir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        setenv("HEARTH_HOST", "127.0.0.1:0", 1);
        setenv("HEARTH_MODELS", models, 1);
        setenv("HEARTH_NUM_PARALLEL", "8", 1);
        execl(bin, bin, "serve", (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int i = 0; i < 200 && port <= 0; i++) {
        char *text;
        size_t len;
        if (hl_file_read(logp, &text, &len, NULL) == HL_OK) {
            const char *m = strstr(text, "Listening on 127.0.0.1:");
            if (m) port = atoi(m + strlen("Listening on 127.0.0.1:"));
            free(text);
        }
        usleep(50000);
    }
    int rc = 1;
    if (port > 0) {
        net_host_parse("127.0.0.1", &g_host, NULL);
        g_host.port = port;
        if (create_model(model)) {
            bool ok = true;
            run_level(1, -1, &ok); /* loads the model, warms up */
            static const int levels[4] = {1, 2, 4, 8};
            double rate[4][50];
            for (int r = 0; r < runs; r++)
                for (int l = 0; l < 4; l++) rate[l][r] = run_level(levels[l], r, &ok);
            double base = 0;
            printf("bench_http: %s, %d tokens per request, median of %d runs\n", model, g_gen, runs);
            printf("%-12s %14s %10s\n", "concurrent", "decode tok/s", "vs 1");
            for (int l = 0; l < 4; l++) {
                qsort(rate[l], (size_t)runs, sizeof(double), cmp_double);
                double med = rate[l][runs / 2];
                if (l == 0) base = med;
                printf("%-12d %14.1f %9.2fx\n", levels[l], med, base > 0 ? med / base : 0);
            }
            if (!ok) printf("(some requests failed: see %s)\n", logp);
            rc = ok ? 0 : 1;
        } else {
            fprintf(stderr, "bench_http: cannot create the model (see %s)\n", logp);
        }
    } else {
        fprintf(stderr, "bench_http: the server did not start (see %s)\n", logp);
    }
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    return rc;
}
