/* api_metrics.c - GET /metrics (Prometheus text format, metrics.h) and GET /health. */
#include <stdlib.h>

#include "server/internal.h"
#include "server/metrics.h"
#include "server/sched.h"

enum MHD_Result srv_handle_metrics(srv_request *r) {
    metrics_gauges g;
    sched_gauges(r->srv->sched, &g);
    char *text;
    size_t len;
    hl_err err;
    if (metrics_render(r->srv->metrics, &g, &text, &len, &err) != HL_OK)
        return srv_reply_error(r, 500, "%s", err.msg);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    return srv_reply_response(r, 200, resp);
}

/* Liveness for load balancers and orchestrators: the server answers (Ollama has no such
 * route; its clients probe / and HEAD /, which hearth answers as Ollama does). */
enum MHD_Result srv_handle_health(srv_request *r) {
    return srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}
