/*
 * sha256.h - SHA-256 (FIPS 180-4), our own small implementation.
 *
 * Used for content-addressed blobs ("sha256:<64 hex>") and manifest digests. The
 * context lives in the caller's memory; nothing allocates.
 *
 *   sha256_ctx c; sha256_init(&c); sha256_update(&c, p, n); sha256_final_hex(&c, hex);
 */
#ifndef HL_STORE_SHA256_H
#define HL_STORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_HEX_LEN 64

typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t n_bytes;
    uint8_t block[64];
    size_t block_len;
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t out[32]);
/* Writes 64 lowercase hex digits plus a NUL (hex must hold 65 bytes). */
void sha256_final_hex(sha256_ctx *c, char hex[SHA256_HEX_LEN + 1]);
/* One-shot helper. */
void sha256_hex(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]);

#endif
