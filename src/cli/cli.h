/*
 * cli.h - the hearth subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name) and returns the process exit status; main.c only dispatches.
 *
 * The model-management commands are HTTP clients of `hearth serve` (serve.c, list.c,
 * show.c, create.c, rm.c, cp.c, ps.c, pull.c; main.c calls cli_dispatch() for them) and share
 * the helpers below. Their errors print one line "Error: ..." on stderr and return 1.
 */
#ifndef HL_CLI_CLI_H
#define HL_CLI_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "net/host.h"
#include "tok/tok.h"

int cli_generate(int argc, char **argv);
int cli_embed(int argc, char **argv);
int cli_quantize(int argc, char **argv);

/* Runs the command named argv[1] if it is a model-management command; returns false
 * otherwise. */
bool cli_dispatch(int argc, char **argv, int *exit_code);

int cmd_serve(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_create(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_ps(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_push(int argc, char **argv);

/* Streams /api/pull or /api/push (path) for model, showing progress on stderr (pull.c);
 * returns 0 on success, else 1 after printing the error. */
int cli_transfer(const char *path, const char *model, bool insecure);

/* Every command's -h/--help prints its usage (Ollama's layout: a line of what it does,
 * "Usage:", "Flags:") to stdout and returns 0: cli_help(text). Flags are parsed with
 * getopt_long (optind reset to 0 first, opterr 0, ":" leading the short options);
 * cli_flag_error(c, argv) reports what getopt_long returned ('?' or ':') the way Ollama's
 * CLI does ("unknown flag: --x", "flag needs an argument: --format") and returns 1. */
int cli_help(const char *text);
int cli_flag_error(int c, char **argv);
/* Usage for `hearth help CMD` / `hearth CMD --help`; NULL for an unknown command. */
const char *cli_usage_of(const char *cmd);
/* For a command whose only flag is -h: returns -1 to go on (its arguments are then
 * argv[optind..argc-1]), else the exit status after printing the usage or the error. */
int cli_no_flags(int argc, char **argv, const char *cmd);

/* A spinner on stderr while something loads; NULL (and nothing drawn) when stderr is not
 * a terminal. stop clears its line and frees it; accepts NULL. */
typedef struct cli_spinner cli_spinner;
cli_spinner *cli_spinner_start(const char *msg);
void cli_spinner_stop(cli_spinner *s);

/* Transfer progress as Ollama's CLI shows it (progress.c). On a terminal every row is a
 * live line redrawn in place: "pulling 6a0746a1ec1a:  42% ▕████      ▏ 2.0 GB/4.7 GB
 * 45 MB/s 1m0s" (cut to the terminal's width); a row without a total is its status
 * alone. Otherwise each row prints plain lines: its status once when it appears, and for
 * a row with a total either "status: 100% 4.7 GB" once it completes, or (quarters)
 * "status 25%", "status 50%", ... as it passes each quarter. Rows are keyed by `key`
 * (a digest; NULL: the status itself). */
typedef struct cli_progress cli_progress;
cli_progress *cli_progress_new(FILE *out, bool tty, bool quarters); /* NULL: out of memory */
void cli_progress_set(cli_progress *v, const char *key, const char *status, uint64_t total,
                      uint64_t completed);
/* Draws the last state (a terminal) and frees v; accepts NULL. */
void cli_progress_end(cli_progress *v);

/* Prints "Error: <msg>" to stderr; returns 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The server address (HEARTH_HOST / OLLAMA_HOST); prints the error and returns false. */
bool cli_host(net_host *out);
/* One JSON request. body may be NULL (no body). On HTTP >= 400 or a connection error,
 * prints the error and returns 1; else stores the parsed response (NULL when empty)
 * in *resp (may be NULL) and returns 0. */
int cli_call(const char *method, const char *path, json_t *body, json_t **resp);
/* Prints a connection error the way the CLI reports it. */
int cli_connect_error(const char *detail);

/* Ollama's human formats: "4.7 GB", "2 weeks ago". */
void cli_human_size(uint64_t bytes, char *buf, size_t cap);
void cli_human_duration(double seconds, char *buf, size_t cap);
/* Parses RFC 3339 into Unix seconds; false when malformed. */
bool cli_parse_time(const char *s, double *out);

/* Parses a token-id list "1,2,3" (decimal ids >= 0 separated by commas) into a malloc'd
 * array (*out, freed by the caller) of *n >= 1 ids. On a malformed list returns false with
 * the reason in why. */
bool cli_parse_ids(const char *s, int32_t **out, size_t *n, char *why, size_t why_cap);
/* Tokenizes a prompt with the vocabulary's special tokens (BOS, or BERT's CLS ... SEP, as
 * the vocabulary says); an empty prompt becomes BOS alone. *out is malloc'd. */
hl_status cli_tokenize(const tok_vocab *vocab, const char *text, int32_t **out, size_t *n,
                       hl_err *err);

/* Prints rows (arrays of n_cols strings) as a left-aligned table with 4-space gaps. */
void cli_print_table(const char *const *header, size_t n_cols, char ***rows, size_t n_rows);

/* Fills the cells after NAME, ID, SIZE of one model's row; each cell holds CLI_CELL bytes. */
#define CLI_CELL 128
typedef void (*cli_model_cells)(json_t *model, char **cells);
/* Prints the "models" array of /api/tags or /api/ps as a table: one row per model whose
 * name starts with prefix (NULL: all), columns NAME ID SIZE, then n_cols - 3 filled in by
 * more. Returns 0, or 1 (after cli_fail) when out of memory. */
int cli_print_models(json_t *models, const char *prefix, const char *const *header,
                     size_t n_cols, cli_model_cells more);

#endif
