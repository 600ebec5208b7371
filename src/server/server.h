/*
 * server.h - `hearth serve`: the Ollama-compatible HTTP API (libmicrohttpd).
 *
 * server_start() binds (port 0 picks a free port), opens the model store and starts
 * serving on internal threads (one per connection); server_stop() shuts it down,
 * waiting for in-flight handlers and producer threads. The server owns its store.
 */
#ifndef HL_SERVER_SERVER_H
#define HL_SERVER_SERVER_H

#include <stddef.h>

#include "base/status.h"
#include "net/host.h"

#ifndef HEARTH_VERSION
#define HEARTH_VERSION "0.1.0"
#endif

struct srv_route; /* server/internal.h */

typedef struct server_config {
    net_host bind;          /* where to listen */
    const char *models_dir; /* NULL: HEARTH_MODELS or ~/.hearth/models */
    size_t max_body;        /* JSON request body limit in bytes; 0 = default (64 MiB) */
    int quiet;              /* no per-request log lines */
    /* Routes tried before the built-in ones (tests use this to drive the streaming
     * machinery with their own producers). */
    const struct srv_route *extra_routes;
    size_t n_extra_routes;
    /* Non-NULL: a runner's server. Only extra_routes are served, each under
     * "/<route_secret>/..." (anything else is 403); no store is opened. */
    const char *route_secret;
} server_config;

typedef struct hl_server hl_server;

hl_status server_start(const server_config *cfg, hl_server **out, hl_err *err);
int server_port(const hl_server *s); /* the bound port */
void server_stop(hl_server *s);      /* accepts NULL */

#endif
