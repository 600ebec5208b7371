/* utf8.c - see utf8.h. */
#include "base/utf8.h"

int hl_utf8_seq_len(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

bool hl_utf8_cont_ok(uint8_t lead, int k, uint8_t c) {
    if (k == 1) {
        if (lead == 0xE0) return c >= 0xA0 && c <= 0xBF; /* overlong */
        if (lead == 0xED) return c >= 0x80 && c <= 0x9F; /* surrogates */
        if (lead == 0xF0) return c >= 0x90 && c <= 0xBF; /* overlong */
        if (lead == 0xF4) return c >= 0x80 && c <= 0x8F; /* past U+10FFFF */
    }
    return c >= 0x80 && c <= 0xBF;
}

size_t hl_utf8_valid_len(const void *s, size_t n) {
    const uint8_t *p = s;
    int k = hl_utf8_seq_len(p[0]);
    if (k == 0 || (size_t)k > n) return 0;
    for (int i = 1; i < k; i++)
        if (!hl_utf8_cont_ok(p[0], i, p[i])) return 0;
    return (size_t)k;
}

size_t hl_utf8_first_invalid(const void *s, size_t n) {
    const uint8_t *p = s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = hl_utf8_valid_len(p + i, n - i);
        if (!k) return i;
        i += k;
    }
    return n;
}

size_t hl_utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
