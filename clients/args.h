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

#include <getopt.h>

int attn_arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int attn_arg_int(const char *flag, const char *s, int lo, int hi, int *out);
int attn_arg_dtype(const char *flag, const char *s, attn_dtype *out);

/* "B,H,N,D" (four positive integers) into out. */
int attn_arg_dims(const char *flag, const char *s, int64_t out[4]);

/* The shape of a problem as the subcommands take it; heads_kv 0 means
 * "same as heads". */
typedef struct attn_shape_args {
  int64_t batch, heads, heads_kv, seq_q, seq_kv, head_dim;
  attn_dtype dtype;
} attn_shape_args;

/* getopt_long entries for --batch --heads --heads-kv --seq --seq-q --seq-kv
 * --head-dim --dtype, values 'b' 'h' 'H' 'n' 'q' 'k' 'd' 't'. */
#define ATTN_SHAPE_OPTIONS                                                     \
  {"batch", required_argument, 0, 'b'}, {"heads", required_argument, 0, 'h'}, \
      {"heads-kv", required_argument, 0, 'H'},                                 \
      {"seq", required_argument, 0, 'n'}, {"seq-q", required_argument, 0, 'q'}, \
      {"seq-kv", required_argument, 0, 'k'},                                   \
      {"head-dim", required_argument, 0, 'd'},                                 \
      {"dtype", required_argument, 0, 't'}

/* Applies option c with its argument: 1 when c is a shape option, 0 when it
 * is not, -1 (after a message) when its value is bad. */
int attn_arg_shape(int c, const char *arg, attn_shape_args *s);

#endif
