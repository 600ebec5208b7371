/* serve.c - `hearth serve`: runs the API server until SIGINT/SIGTERM. */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "server/options.h"
#include "server/server.h"

/* hearth keeps its own store unless told otherwise; when an Ollama store is around, say
 * which one is used and how to share Ollama's (the layout is the same). */
static void log_store_choice(void) {
    const char *hm = getenv("HEARTH_MODELS");
    if (hm && *hm) return;
    const char *home = getenv("HOME");
    const char *om = getenv("OLLAMA_MODELS");
    char ollama[4096] = "";
    struct stat sb;
    if (om && *om)
        snprintf(ollama, sizeof ollama, "%s", om);
    else if (home && *home) {
        snprintf(ollama, sizeof ollama, "%s/.ollama/models", home);
        if (stat(ollama, &sb) != 0 || !S_ISDIR(sb.st_mode)) return;
    } else
        return;
    fprintf(stderr,
            "models: using hearth's store %s/.hearth/models (HEARTH_MODELS is unset); an Ollama "
            "store is at %s: set HEARTH_MODELS=%s to use it\n",
            home ? home : "~", ollama, ollama);
}

int cmd_serve(int argc, char **argv) {
    int rc = cli_no_flags(argc, argv, "serve");
    if (rc >= 0) return rc;
    if (optind < argc) return cli_fail("usage: hearth serve (configure with HEARTH_HOST, HEARTH_MODELS)");
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
    log_store_choice();
    fflush(stderr);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "received %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(srv);
    return 0;
}
