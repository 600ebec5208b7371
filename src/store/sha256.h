/*
 * sha256.h - SHA-256 for content-addressed blobs ("sha256:<64 hex>") and manifest
 * digests, implemented on OpenSSL's EVP interface (libcrypto: several times faster than
 * a portable C loop, which matters when create and pull hash multi-GB files).
 *
 *   sha256_ctx c;
 *   if (!sha256_init(&c)) ...out of memory...;
 *   sha256_update(&c, p, n); sha256_final_hex(&c, hex);
 *
 * init allocates the EVP context; final/final_hex/discard free it, so every initialised
 * context ends in exactly one of them. sha256_copy clones a running context (to peek at
 * the digest so far).
 */
#ifndef HL_STORE_SHA256_H
#define HL_STORE_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_HEX_LEN 64

struct evp_md_ctx_st;
typedef struct sha256_ctx {
    struct evp_md_ctx_st *md;
} sha256_ctx;

/* False when out of memory (c is then left empty; discard is a no-op). */
bool sha256_init(sha256_ctx *c) __attribute__((warn_unused_result));
bool sha256_copy(sha256_ctx *dst, const sha256_ctx *src) __attribute__((warn_unused_result));
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t out[32]);
/* Writes 64 lowercase hex digits plus a NUL (hex must hold 65 bytes). */
void sha256_final_hex(sha256_ctx *c, char hex[SHA256_HEX_LEN + 1]);
void sha256_discard(sha256_ctx *c); /* frees without a digest; accepts an empty ctx */
/* One-shot helper; false (hex = "") when out of memory. */
bool sha256_hex(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]);

#endif
