/*
 * cli_fmt.h - output formats the CLI shares with Ollama's, kept free of the CLI's other
 * modules so the test binary links this file alone (Makefile: CLI_TESTED).
 *
 * cli_go_duration() is Go's time.Duration String(): "0s", "850ns", "12.5µs", "55.275ms",
 * "1.234567s", "2m3.5s", "1h0m0s" (full precision, trailing zeros dropped).
 * cli_print_metrics() prints the `--verbose` stats as Ollama's api.Metrics.Summary() does:
 * only the lines whose value is non-zero, durations in Go's format, rates "%.2f tokens/s".
 */
#ifndef HL_CLI_CLI_FMT_H
#define HL_CLI_CLI_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

void cli_go_duration(int64_t ns, char *out, size_t cap);

typedef struct cli_metrics {
    int64_t total_ns, load_ns;
    int64_t prompt_eval_count, prompt_eval_ns;
    int64_t eval_count, eval_ns;
} cli_metrics;

void cli_print_metrics(FILE *f, const cli_metrics *m);

#endif
