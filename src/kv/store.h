/*
 * store.h - the prefix cache beyond one process: content-addressed KV blocks kept in a
 * directory that survives restarts (the disk tier) and, optionally, on a Redis server
 * shared by several hearth servers running the same model (the shared tier).
 *
 * Keys. A full block (B positions) is named by a 128-bit hash chain, as vLLM's prefix
 * caching does: key[0] = XXH3-128(identity), key[k+1] = XXH3-128(key[k] || tokens of
 * block k). The identity (runner.c) covers the model digest, the KV element types, the
 * keys' layout (kv/layout.h), the cache slot kind and the block geometry, so a key names
 * exactly one block's bytes: any process can look a prefix up without the trie that made it.
 *
 * Record format (the same bytes in a file and in a Redis value): a 64-byte header
 * (magic "HKVB", version, the key, the raw length, the payload length, XXH64 of the
 * payload) and the payload, the block's bytes byte-plane shuffled (pairs: f16 KV) and
 * compressed with zstd level 1. A record is used only when its header matches the key
 * and the pool's block size and its payload checksum and decompressed length are right;
 * anything else (a torn write, bit rot, another version) is a miss: the file is deleted
 * and the block recomputed.
 *
 * Disk tier: <dir>/<32 hex digits>.kvb, written to a temp file and renamed into place.
 * The store indexes the directory when it opens (deleting leftover temp files) and keeps
 * the total under disk_max by deleting the least recently used files (a hit refreshes a
 * file's mtime, so the order survives restarts). Several processes may share the
 * directory: a file another one deleted is simply a miss.
 *
 * Shared tier: Redis keys "hearth:kv:<namespace>:<32 hex>" (SET with EX ttl). Every call
 * is bounded by a short connect/command timeout; after a failure the store stays away
 * from Redis for a back-off interval, so a down or slow Redis costs at most one timeout
 * per interval and requests recompute instead.
 *
 * Recurrent snapshots (runner.c): a second store whose records are a state plus the KV
 * block holding its offset t, keyed by kv_hash_next(kv_hash_next(key[t / B], slot kind),
 * the tokens from block t / B's start to t): the chain at t, plus the slot kind. Such a
 * store lives in the model directory's state/ subdirectory and namespace "<ns>:state".
 * A sliding-window model's window layers keep their full blocks in a third one (window/,
 * "<ns>:window") under the same keys as the full layers' blocks.
 *
 * Writes are behind: kv_store_put copies the block into a bounded queue (blocks beyond
 * the bound are dropped and counted) and a writer thread compresses it and writes it to
 * the tiers that do not hold it yet. kv_store_get runs on the caller's thread.
 *
 * Ownership: kv_store_open returns a store the caller frees with kv_store_close (which
 * drains the queue). Thread-safe.
 */
#ifndef HL_KV_STORE_H
#define HL_KV_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define KV_STORE_DISK_MAX_DEFAULT ((size_t)8 << 30)
#define KV_STORE_QUEUE_MAX_DEFAULT ((size_t)128 << 20)
#define KV_STORE_REDIS_TTL_DEFAULT 3600
#define KV_STORE_REDIS_TIMEOUT_MS 100
#define KV_STORE_REDIS_BACKOFF_MS 2000

typedef struct kv_hash {
    uint64_t lo, hi;
} kv_hash;

/* key[0] for a model identity (any bytes that name the model, KV types and layout). */
kv_hash kv_hash_seed(const void *identity, size_t n);
/* The key of the block after `parent` holding tokens[0..n). */
kv_hash kv_hash_next(kv_hash parent, const int32_t *tokens, int32_t n);
/* 32 lowercase hex digits and a NUL. */
void kv_hash_hex(kv_hash h, char out[33]);

typedef enum kv_source {
    KV_SRC_NONE = 0,
    KV_SRC_DISK,
    KV_SRC_REMOTE,
} kv_source;

typedef struct kv_store_config {
    const char *dir;         /* this model's block directory (created); NULL: no disk tier */
    size_t disk_max;         /* bytes of block files; 0: KV_STORE_DISK_MAX_DEFAULT */
    const char *redis_url;   /* "redis://host:port" or "host:port"; NULL/"": no shared tier */
    const char *ns;          /* Redis key namespace (the model identity as text) */
    int redis_ttl_s;         /* <= 0: KV_STORE_REDIS_TTL_DEFAULT */
    int redis_timeout_ms;    /* <= 0: KV_STORE_REDIS_TIMEOUT_MS */
    size_t redis_max_value;  /* larger records are not published; 0: 64 MiB */
    size_t queue_max;        /* bytes waiting to be written; 0: KV_STORE_QUEUE_MAX_DEFAULT */
    size_t block_bytes;      /* every block's size (> 0) */
} kv_store_config;

/* Counters for logs and /metrics (monotonic unless noted). */
typedef struct kv_store_stats {
    uint64_t disk_hits, disk_misses, remote_hits, remote_misses; /* blocks */
    uint64_t disk_writes, remote_writes;
    uint64_t dropped;        /* puts refused because the queue was full */
    uint64_t corrupt;        /* records rejected by the checks (files deleted) */
    uint64_t disk_evictions; /* files deleted for the cap */
    uint64_t remote_errors;  /* failed or timed-out Redis calls */
    size_t disk_bytes;       /* now: bytes of indexed block files */
    size_t disk_files;       /* now */
    size_t queued_bytes;     /* now */
    bool remote_up;          /* now: connected and not backing off */
} kv_store_stats;

typedef struct kv_store kv_store;

hl_status kv_store_open(const kv_store_config *cfg, kv_store **out, hl_err *err);
/* Writes what is queued, stops the writer, frees everything. Accepts NULL. */
void kv_store_close(kv_store *s);

bool kv_store_has_disk(const kv_store *s);
bool kv_store_has_remote(const kv_store *s);

/* Reads block `key` into data (block_bytes), from disk first, then Redis (a remote hit
 * is also written to disk, behind). Returns the source, or KV_SRC_NONE on a miss (and on
 * any error: corrupt records are deleted and counted). */
kv_source kv_store_get(kv_store *s, kv_hash key, void *data);

/* Reads the longest run of consecutive blocks keys[0..k) into data[0..k) (block_bytes
 * each): from disk while it has them, then the rest from Redis in one pipelined round
 * trip; src[i] says where block i came from. Returns k (0..n). */
int32_t kv_store_get_run(kv_store *s, const kv_hash *keys, int32_t n, void *const *data,
                         kv_source *src);

/* Whether every configured tier holds (or has queued) key: no need to put it. */
bool kv_store_known(kv_store *s, kv_hash key);

/* Whether the disk index lists key (a file found when the store opened, or written or
 * read since): a look-up without IO, for probing many candidate keys. */
bool kv_store_on_disk(kv_store *s, kv_hash key);

/* Queues a copy of a block for the tiers that lack it; false when dropped (queue full)
 * or known already. */
bool kv_store_put(kv_store *s, kv_hash key, const void *data);

/* Waits until the queue is empty (tests, shutdown). */
void kv_store_flush(kv_store *s);

kv_store_stats kv_store_get_stats(kv_store *s);

/* Parses a size: digits with an optional K/M/G/T suffix (powers of 1024, "B" and "iB"
 * accepted). False on anything else. */
bool kv_store_parse_size(const char *text, size_t *out);

#endif
