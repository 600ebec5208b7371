/*
 * webui.h - the chat page served at / (web/index.html, web/app.css, web/app.js).
 *
 * The files under web/ are embedded into the binary at build time (web/embed.c turns
 * them into $(BUILD)/gen/webui_assets.c, see the Makefile): nothing is fetched at run
 * time. GET / answers the page to clients that accept text/html (browsers) and Ollama's
 * "Ollama is running" to everyone else (its clients and scripts probe / for that);
 * /webui/<file> serves the other assets. Replies carry the file's Content-Type, an ETag
 * (a 304 for a matching If-None-Match), Cache-Control: no-cache (revalidate each time:
 * the names carry no version), and a gzip body when the client accepts it (compressed
 * once, on first use). The page calls the API from its own origin (server.c's CORS
 * check allows a same-origin request on a local Host).
 */
#ifndef HL_SERVER_WEBUI_H
#define HL_SERVER_WEBUI_H

#include <stddef.h>

#include "server/internal.h"

/* One embedded file (the generated table lists them in name order). */
typedef struct webui_asset {
    const char *name; /* e.g. "app.js" */
    const unsigned char *data;
    size_t len;
} webui_asset;

extern const webui_asset webui_assets[];
extern const size_t webui_n_assets;

enum MHD_Result webui_handle_root(srv_request *r);  /* GET / */
enum MHD_Result webui_handle_asset(srv_request *r); /* GET /webui/<name> */

#endif
