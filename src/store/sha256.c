#include "store/sha256.h"

#include <openssl/evp.h>
#include <string.h>

bool sha256_init(sha256_ctx *c) {
    c->md = EVP_MD_CTX_new();
    if (!c->md) return false;
    if (EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c->md);
        c->md = NULL;
        return false;
    }
    return true;
}

bool sha256_copy(sha256_ctx *dst, const sha256_ctx *src) {
    dst->md = EVP_MD_CTX_new();
    if (!dst->md) return false;
    if (EVP_MD_CTX_copy_ex(dst->md, src->md) != 1) {
        EVP_MD_CTX_free(dst->md);
        dst->md = NULL;
        return false;
    }
    return true;
}

void sha256_update(sha256_ctx *c, const void *data, size_t len) {
    if (len) EVP_DigestUpdate(c->md, data, len);
}

void sha256_final(sha256_ctx *c, uint8_t out[32]) {
    unsigned int n = 32;
    if (EVP_DigestFinal_ex(c->md, out, &n) != 1) memset(out, 0, 32);
    EVP_MD_CTX_free(c->md);
    c->md = NULL;
}

static void to_hex(const uint8_t d[32], char hex[SHA256_HEX_LEN + 1]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

void sha256_final_hex(sha256_ctx *c, char hex[SHA256_HEX_LEN + 1]) {
    uint8_t d[32];
    sha256_final(c, d);
    to_hex(d, hex);
}

void sha256_discard(sha256_ctx *c) {
    EVP_MD_CTX_free(c->md); /* accepts NULL */
    c->md = NULL;
}

bool sha256_hex(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]) {
    uint8_t d[32];
    unsigned int n = 32;
    if (EVP_Digest(data, len, d, &n, EVP_sha256(), NULL) != 1) {
        hex[0] = '\0';
        return false;
    }
    to_hex(d, hex);
    return true;
}
