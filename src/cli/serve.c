/* serve.c - `hearth serve`: runs the API server until SIGINT/SIGTERM. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "server/options.h"
#include "server/server.h"

int cmd_serve(int argc, char **argv) {
    (void)argv;
    if (argc > 1) return cli_fail("usage: hearth serve (configure with HEARTH_HOST, HEARTH_MODELS)");
    server_config cfg = {0};
    if (!cli_host(&cfg.bind)) return 1;
    /* Block the signals before any server thread exists, then wait for them here. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    (void)opt_default_kv_type(true); /* an unknown $OLLAMA_KV_CACHE_TYPE: said once, here */
    hl_server *srv;
    hl_err err;
    if (server_start(&cfg, &srv, &err) != HL_OK) return cli_fail("%s", err.msg);
    const char *h = cfg.bind.host[0] ? cfg.bind.host : "0.0.0.0";
    bool v6 = strchr(h, ':') != NULL;
    fprintf(stderr, "Listening on %s%s%s:%d (version %s)\n", v6 ? "[" : "", h, v6 ? "]" : "",
            server_port(srv), HEARTH_VERSION);
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "received %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(srv);
    return 0;
}
