/*
 * engine_remote.h - the engine seam (engine.h) over a runner process: `hearth runner`
 * (runner_srv.h) spawned per loaded model and spoken to over loopback HTTP (spec 6).
 *
 * eremote_open: reads the tokenizer and chat template from the GGUF here (the handlers
 * tokenize and render in the server), picks a free loopback port, spawns
 * $HEARTH_RUNNER_BIN (else /proc/self/exe) `runner --model P --port N ...` with its
 * stdout and stderr on one pipe, and polls GET /health every 50 ms until it answers,
 * the child exits ("llama runner process has terminated: <exit status>: <last line>")
 * or $HEARTH_LOAD_TIMEOUT (Go duration or seconds, default 5m; <= 0 none) passes
 * ("timed out waiting for llama runner to start: <last line>") or cfg->abort turns true
 * ("server shutting down").
 * Output: a thread copies every byte the child writes to this process's stderr as is
 * (no re-wrapping, no line-length limit: it never stops reading, so the child cannot
 * block on a full pipe) and keeps the last non-empty line (trimmed, first 256 bytes) for
 * error messages. A reaper thread waits for the child and records its exit for any
 * number of observers.
 * Requests: each generation is one POST /completion streamed back as NDJSON; every read
 * from the runner (headers, chunk framing, a half line included) waits in 100 ms slices
 * (net_http_set_waiter) that check req->cancelled, the runner's exit and the stall
 * timeout; a cancel closes the connection (the runner stops that sequence). A stream that breaks without its final line
 * means the runner died: the request fails with "model runner has unexpectedly stopped,
 * this may be due to resource limitations or an internal error, check the server logs
 * for details: <last line>", the runner is killed and eremote_alive turns false (the
 * scheduler then reloads the model for the next request).
 * A runner that goes silent under a request (no line for $HEARTH_RUNNER_STALL_TIMEOUT:
 * integer seconds or a Go duration, default 30 s, <= 0 none; also bounds sending to it)
 * is stuck: it sends a line per token, and a heartbeat line while the request is queued,
 * in prefill or left out of the batch's steps as long as its batch loop makes progress
 * (runner_heartbeat_fn; a single forward pass must stay shorter than the timeout). It
 * is killed (SIGKILL, reaped) and the request fails with the same message ("...: the
 * runner sent nothing for N s"; the other requests on it too). POST /stop is bounded the
 * same way; an embedding, whose
 * reply has no heartbeat, waits up to EMBED_STALL_FACTOR (10) times the timeout.
 * Whenever a generation fails because its runner died or was killed under it,
 * stats->runner_lost is set: a request that got no token yet may run again on a fresh
 * runner (api_infer.c retries it once).
 * eremote_ping: GET /health within timeout_ms (connect included); a runner that does not
 * answer in time is killed (SIGKILL; the reaper thread reaps it) and eremote_alive turns
 * false. The scheduler pings an idle runner before reusing it (sched.h).
 * Memory: the runner gets cfg's KV and snapshot budgets and spill directory on its
 * command line (sched.h grants them); mem_bytes and kv_disk_bytes are what it measured
 * (at load and after each request).
 * eremote_close: SIGKILL, wait for the reaper and the output thread, free everything.
 */
#ifndef HL_SERVER_ENGINE_REMOTE_H
#define HL_SERVER_ENGINE_REMOTE_H

#include <stdbool.h>

#include "server/engine.h"

#define EREMOTE_STALL_DEFAULT_NS (30LL * 1000000000LL)

typedef struct eremote eremote;

hl_status eremote_open(const char *gguf_path, const engine_config *cfg, eremote **out,
                       hl_err *err);
void eremote_close(eremote *r);
const tok_vocab *eremote_vocab(const eremote *r);
const char *eremote_chat_template(const eremote *r);
void eremote_get_info(const eremote *r, engine_info *out);
hl_status eremote_generate(eremote *r, const engine_request *req, engine_stats *stats,
                           hl_err *err);
hl_status eremote_embed(eremote *r, const int32_t *tokens, size_t n, float *out, hl_err *err);
bool eremote_alive(const eremote *r);
bool eremote_ping(eremote *r, int timeout_ms);
int eremote_pid(const eremote *r);

#endif
