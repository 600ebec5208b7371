/*
 * pull.c - `hearth pull MODEL [--insecure]`, `hearth push MODEL [--insecure]`, and the
 * pull that `hearth run` does for a missing model: streams /api/pull or /api/push and
 * shows the progress on stderr as Ollama does (cli_progress): on a terminal every layer
 * gets a live line (bar, percent, size, speed, time left) redrawn in place; otherwise
 * each status prints once as a plain line ("pulling 6a0746a1ec1a: 100% 4.7 GB" when a
 * layer is done).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "net/http_client.h"

static void update(cli_progress *v, json_t *j) {
    const char *status = json_string_value(json_object_get(j, "status"));
    const char *digest = json_string_value(json_object_get(j, "digest"));
    if (!status) return;
    uint64_t total = (uint64_t)json_integer_value(json_object_get(j, "total"));
    uint64_t completed = (uint64_t)json_integer_value(json_object_get(j, "completed"));
    cli_progress_set(v, digest, status, digest ? total : 0, completed);
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
    cli_progress *v = cli_progress_new(stderr, isatty(STDERR_FILENO), false);
    if (!v) {
        net_http_close(h);
        return cli_fail("out of memory");
    }
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
            cli_progress_end(v);
            v = NULL;
            rc = cli_fail("%s", e);
        } else {
            update(v, j);
            const char *s = json_string_value(json_object_get(j, "status"));
            if (s && strcmp(s, "success") == 0) success = true;
        }
        json_decref(j);
        if (rc) break;
    }
    cli_progress_end(v);
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
