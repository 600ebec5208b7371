/*
 * runner_srv.h - `hearth runner`: the process that serves one model for the server
 * (spec section 6). The server spawns it (engine_remote.c) as
 *   hearth runner --model PATH --port P [--ctx N] [--batch N] [--threads N]
 * It loads the model in-process (engine_open_local), then listens on 127.0.0.1:P with a
 * small HTTP API spoken only by engine_remote.c, every path below under "/<secret>"
 * (see RUNNER_SECRET_ENV):
 *   GET  /health      200 {"status":"ok","pid","n_ctx","n_ctx_train","n_embd","n_vocab",
 *                      "mem_bytes","pooling"} once loaded (before that nothing listens);
 *   POST /completion  {"prompt":[ids],"num_predict":N,"options":{sampler fields}
 *                      [, "format":JSON text, "think_open", "think_close", "in_think",
 *                      "trigger", "trigger_end", "trigger_now"]}
 *                      (engine_request's constraint: this process masks the logits)
 *                      -> NDJSON: {"t":id[,"l":logprob,"k":[[id,lp]..]]}
 *                      per token, {"p":1} now and then while waiting or prefilling, and one
 *                      final {"done":true,"stats":{...},"mem_bytes":N} or
 *                      {"error":msg,"code":hl_status}. Closing the connection cancels.
 *   POST /embedding   {"tokens":[ids]} -> {"embedding":[floats]} or {"error","code"}.
 * A load failure is printed as "Error: <message>" on stderr and exits with status 1.
 * It exits on SIGTERM/SIGINT, and when its parent dies (PR_SET_PDEATHSIG).
 */
#ifndef HL_SERVER_RUNNER_SRV_H
#define HL_SERVER_RUNNER_SRV_H

/* The per-start secret: the server draws RUNNER_SECRET_LEN random hex digits and puts
 * them in the runner's environment as RUNNER_SECRET_ENV; the runner answers only paths
 * under "/<secret>/" (403 for anything else) and serves none of the public API. */
#define RUNNER_SECRET_ENV "HEARTH_RUNNER_SECRET"
#define RUNNER_SECRET_LEN 32

int runner_srv_main(int argc, char **argv);

#endif
