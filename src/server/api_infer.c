/*
 * api_infer.c - /api/generate, /api/chat, /api/embed, /api/embeddings.
 *
 * PLUG-IN POINT for the engine. Each handler today validates the request and resolves
 * the model (400 "model is required", 404 "model '<x>' not found") and then answers
 * 501 because no engine is linked in yet. To add generation:
 *   1. parse the request fields (spec §2.1/2.2; options merge: m.params then "options");
 *   2. build a ctx owning the store_model (store_model_load gives the GGUF path, the
 *      template/system/params/messages layers) and the parsed request;
 *   3. return srv_stream_run(r, stream, generate_run, ctx, ctx_free), where
 *      generate_run() loads/gets the model from a scheduler, renders the prompt,
 *      and per token calls srv_stream_send(s, {"model","created_at","response",
 *      "done":false}), checking srv_stream_cancelled(s) between tokens (client gone);
 *      the final chunk carries done:true, done_reason and the metrics. Errors before
 *      the first chunk: srv_stream_fail(s, status, msg) -> that HTTP status.
 *   Non-stream generate/chat must concatenate text across chunks: keep the running
 *   text in ctx and send one final object (srv_stream_run keeps only the last one).
 * /api/ps (api_models.c) should then list the scheduler's loaded models.
 */
#include <stdio.h>
#include <stdlib.h>

#include "server/internal.h"

static enum MHD_Result not_yet(srv_request *r, const char *what) {
    enum MHD_Result ret;
    json_t *req = srv_parse_body(r, &ret);
    if (!req) return ret;
    const char *model = NULL;
    if (!srv_get_string(r, req, "model", &model, &ret)) {
        json_decref(req);
        return ret;
    }
    store_name n;
    if (!model || !*model)
        ret = srv_reply_error(r, 400, "model is required");
    else if (store_name_parse(model, &n, NULL) != HL_OK || !store_find(r->srv->st, &n, NULL))
        ret = srv_reply_error(r, 404, "model '%s' not found", model);
    else
        ret = srv_reply_error(r, 501, "%s is not available yet in this hearth build", what);
    json_decref(req);
    return ret;
}

enum MHD_Result srv_handle_generate(srv_request *r) { return not_yet(r, "generation"); }
enum MHD_Result srv_handle_chat(srv_request *r) { return not_yet(r, "chat"); }
enum MHD_Result srv_handle_embed(srv_request *r) { return not_yet(r, "embedding"); }
enum MHD_Result srv_handle_embeddings(srv_request *r) { return not_yet(r, "embedding"); }
