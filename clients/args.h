/*
 * args.h — parsing of command-line values for the attn subcommands.
 *
 * Each function prints one line naming the flag and what it expected to
 * stderr and returns -1 on bad input, so a subcommand can exit with status 2
 * after a single clear message.
 */
#ifndef ATTN_ARGS_H
#define ATTN_ARGS_H

#include "engine.h"

int attn_arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int attn_arg_int(const char *flag, const char *s, int lo, int hi, int *out);
int attn_arg_dtype(const char *flag, const char *s, attn_dtype *out);

#endif
