/*
 * file.h - whole-file reads and read-only mappings.
 *
 * hl_file_read() returns a malloc'd buffer (plus a terminating NUL byte not counted
 * in *len) that the caller frees with free(). A path ending in ".gz" is inflated
 * with zlib. hl_map_open() maps a file read-only; hl_map_read() reads it into private
 * anonymous memory instead (made read-only once filled); hl_map_close() releases either.
 *
 * Why both: weights in page-cache pages stream markedly slower than the same bytes in
 * anonymous memory on the VMs we measured (decode 12 vs 18 tok/s at Q8_0, one thread),
 * so models are read in by default, as Ollama does for CPU loads (llama.cpp --no-mmap);
 * a mapping shares the page cache and starts faster, for use_mmap. A read-in file of
 * 2 MiB or more starts on a 2 MiB boundary and asks for transparent huge pages.
 */
#ifndef HL_BASE_FILE_H
#define HL_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

hl_status hl_file_read(const char *path, char **out_buf, size_t *out_len, hl_err *err);

/* Writes len bytes to path atomically (temp file + rename). */
hl_status hl_file_write(const char *path, const void *buf, size_t len, hl_err *err);

typedef struct hl_map {
    const uint8_t *data; /* NULL for an empty file */
    size_t size;
} hl_map;

hl_status hl_map_open(const char *path, hl_map *out, hl_err *err);
hl_status hl_map_read(const char *path, hl_map *out, hl_err *err);
void hl_map_close(hl_map *m); /* accepts a zeroed struct */
/* Makes the mapping writable or read-only again (mprotect). Writes to a file mapping stay
 * private (copy on write): the file never changes. */
hl_status hl_map_protect(hl_map *m, bool writable, hl_err *err);

/* Monotonic clock in nanoseconds. */
uint64_t hl_time_ns(void);

#endif
