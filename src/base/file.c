#define _POSIX_C_SOURCE 200809L
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static hl_status read_gz(const char *path, char **out_buf, size_t *out_len, hl_err *err) {
    gzFile gz = gzopen(path, "rb");
    if (!gz) return hl_fail(err, HL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        gzclose(gz);
        return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                gzclose(gz);
                return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t want = cap - len;
        if (want > (1u << 30)) want = 1u << 30;
        int n = gzread(gz, buf + len, (unsigned)want);
        if (n < 0) {
            int zerr = 0;
            const char *msg = gzerror(gz, &zerr);
            hl_fail(err, HL_ERR_FORMAT, "%s: gzip error: %s", path, msg ? msg : "?");
            free(buf);
            gzclose(gz);
            return HL_ERR_FORMAT;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    gzclose(gz);
    buf[len] = '\0';
    *out_buf = buf;
    *out_len = len;
    return HL_OK;
}

hl_status hl_file_read(const char *path, char **out_buf, size_t *out_len, hl_err *err) {
    *out_buf = NULL;
    *out_len = 0;
    if (ends_with(path, ".gz")) return read_gz(path, out_buf, out_len, err);
    FILE *f = fopen(path, "rb");
    if (!f) return hl_fail(err, HL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return hl_fail(err, HL_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(f);
        return hl_fail(err, HL_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, size);
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        free(buf);
        return hl_fail(err, HL_ERR_IO, "%s: short read", path);
    }
    buf[size] = '\0';
    *out_buf = buf;
    *out_len = size;
    return HL_OK;
}

hl_status hl_file_write(const char *path, const void *buf, size_t len, hl_err *err) {
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return hl_fail(err, HL_ERR_NOMEM, "out of memory");
    snprintf(tmp, plen + 16, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        hl_fail(err, HL_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return HL_ERR_IO;
    }
    int ok = (len == 0 || fwrite(buf, 1, len, f) == len);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        hl_fail(err, HL_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return HL_ERR_IO;
    }
    free(tmp);
    return HL_OK;
}

hl_status hl_map_open(const char *path, hl_map *out, hl_err *err) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hl_fail(err, HL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return hl_fail(err, HL_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return HL_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return hl_fail(err, HL_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    out->data = p;
    out->size = (size_t)st.st_size;
    return HL_OK;
}

/* Private memory for a file's bytes: mmap rather than malloc, so it is page aligned,
 * returned to the system at once on close, and can be made read-only like a file mapping.
 * From 2 MiB up it starts on a 2 MiB boundary with MADV_HUGEPAGE, so that transparent
 * huge pages back it where the kernel allows them only on request (enabled=madvise, the
 * Debian default): a decode step streams all the weights, and with 4 KiB pages that is
 * a TLB miss every 4 KiB (Zen 5, 2 threads, alternated process pairs: decode +2% at
 * Q4_K_M, faster in 8 of 10, +3.5% at Q8_0, 10 of 11; bench/README). Ignored where THP
 * is off. */
static uint8_t *map_anonymous(size_t size) {
    const size_t huge = (size_t)2 << 20, page = 4096;
    const int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    if (size < huge) return mmap(NULL, size, prot, flags, -1, 0);
    uint8_t *raw = mmap(NULL, size + huge, prot, flags, -1, 0);
    if (raw == MAP_FAILED) return raw;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
    uint8_t *end = p + (size + page - 1) / page * page, *raw_end = raw + size + huge;
    if (p > raw) munmap(raw, (size_t)(p - raw)); /* the reservation beyond [p, end) */
    if (raw_end > end) munmap(end, (size_t)(raw_end - end));
    madvise(p, size, MADV_HUGEPAGE);
    return p;
}

hl_status hl_map_read(const char *path, hl_map *out, hl_err *err) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hl_fail(err, HL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return hl_fail(err, HL_ERR_IO, "%s: not a regular file", path);
    }
    const size_t size = (size_t)st.st_size;
    if (size == 0) {
        close(fd);
        return HL_OK;
    }
    uint8_t *p = map_anonymous(size);
    if (p == MAP_FAILED) {
        close(fd);
        return hl_fail(err, HL_ERR_NOMEM, "%s: cannot allocate %zu bytes: %s", path, size,
                       strerror(errno));
    }
    size_t got = 0;
    while (got < size) {
        const size_t want = size - got < ((size_t)64 << 20) ? size - got : ((size_t)64 << 20);
        const ssize_t n = pread(fd, p + got, want, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int e = n < 0 ? errno : 0;
            close(fd);
            munmap(p, size);
            return hl_fail(err, HL_ERR_IO, "%s: read failed at byte %zu of %zu: %s", path, got,
                           size, e ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)n;
    }
    close(fd);
    mprotect(p, size, PROT_READ); /* a stray write faults, as with a file mapping */
    out->data = p;
    out->size = size;
    return HL_OK;
}

hl_status hl_map_protect(hl_map *m, bool writable, hl_err *err) {
    if (!m->data) return HL_OK;
    if (mprotect((void *)m->data, m->size, PROT_READ | (writable ? PROT_WRITE : 0)) != 0)
        return hl_fail(err, HL_ERR_IO, "mprotect failed: %s", strerror(errno));
    return HL_OK;
}

void hl_map_close(hl_map *m) {
    if (m && m->data) munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

uint64_t hl_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
