/* serve.c - `hearth serve`: runs the API server until SIGINT/SIGTERM. */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
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
    HL_INFO("models: using hearth's store %s/.hearth/models (HEARTH_MODELS is unset); an "
            "Ollama store is at %s: set HEARTH_MODELS=%s to use it",
            home ? home : "~", ollama, ollama);
}

/* The configuration variables set, at debug level (Ollama logs its "server config"). */
static void log_env(void) {
    static const char *const names[] = {
        "HOST", "MODELS", "KEEP_ALIVE", "NUM_PARALLEL", "MAX_QUEUE", "MAX_LOADED_MODELS",
        "CONTEXT_LENGTH", "KV_CACHE_TYPE", "ORIGINS", "LOAD_TIMEOUT", "DEBUG",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        for (int o = 0; o < 2; o++) {
            char full[64];
            snprintf(full, sizeof full, "%s_%s", o ? "OLLAMA" : "HEARTH", names[i]);
            const char *v = getenv(full);
            if (v && *v) HL_LOG_ATTRS(HL_LOG_DEBUG, "server config", full, v);
        }
    /* hearth's attention has no separate flash kernel: the variable changes nothing */
    const char *fa = getenv("OLLAMA_FLASH_ATTENTION");
    if (fa && *fa)
        HL_LOG_ATTRS(HL_LOG_DEBUG, "OLLAMA_FLASH_ATTENTION has no effect in hearth (accepted)",
                     "OLLAMA_FLASH_ATTENTION", fa);
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
    hl_log_init_from_env();
    log_env();
    (void)opt_default_kv_type(true); /* an unknown $OLLAMA_KV_CACHE_TYPE: said once, here */
    hl_server *srv;
    hl_err err;
    if (server_start(&cfg, &srv, &err) != HL_OK) return cli_fail("%s", err.msg);
    const char *h = cfg.bind.host[0] ? cfg.bind.host : "0.0.0.0";
    bool v6 = strchr(h, ':') != NULL;
    HL_INFO("Listening on %s%s%s:%d (version %s)", v6 ? "[" : "", h, v6 ? "]" : "",
            server_port(srv), HEARTH_VERSION);
    log_store_choice();
    int sig = 0;
    sigwait(&set, &sig);
    HL_INFO("received %s, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server_stop(srv);
    return 0;
}
