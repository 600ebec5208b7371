/*
 * cli.h - the hearth subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name) and returns the process exit status; main.c only dispatches.
 */
#ifndef HL_CLI_H
#define HL_CLI_H

int cli_generate(int argc, char **argv);
int cli_quantize(int argc, char **argv);

#endif
