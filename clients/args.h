/*
 * args.h — parsing of command-line values for the attn subcommands.
 *
 * Each function prints one line naming the flag and what it expected to
 * stderr and returns -1 on bad input, so a subcommand can exit with status 2
 * after a single clear message.
 */
#ifndef TOOL_ARGS_H
#define TOOL_ARGS_H

#include "engine.h"
#include "proto.h"

#include <getopt.h>

int tool_arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int tool_arg_int(const char *flag, const char *s, int lo, int hi, int *out);
/* A finite number from lo to hi. */
int tool_arg_double(const char *flag, const char *s, double lo, double hi, double *out);
int tool_arg_dtype(const char *flag, const char *s, attn_dtype *out);
/* A CPU tuning (attn_config.cpu_tune): auto, intel or amd. */
int tool_arg_tune(const char *flag, const char *s);

/* The API key the clients send as "Authorization: Bearer KEY": the
 * ATTND_API_KEY variable the server reads too (a flag would show the key
 * to every user of ps). NULL when unset or empty; *bad when it holds a
 * character a header cannot carry (after a message naming `me`). */
const char *tool_arg_api_key(const char *me, bool *bad);

/* "B,H,N,D" (four positive integers) into out. */
int tool_arg_dims(const char *flag, const char *s, int64_t out[4]);

/* Comma lists ("0,3,7"), for flags that word their own message about the
 * whole list: how many items s holds (its commas plus one), and the item
 * at *p, an integer from lo to hi or a finite number, which must be
 * followed by a comma or, when it is the last, by the end. true with *out
 * set and *p past the comma; false, printing nothing, when it is not one. */
int64_t tool_arg_list_len(const char *s);
bool tool_arg_list_i64(const char **p, int64_t lo, int64_t hi, bool last, int64_t *out);
bool tool_arg_list_double(const char **p, bool last, double *out);

/* The shape of a problem as the subcommands take it; heads_kv 0 means
 * "same as heads". */
typedef struct tool_shape_args {
  int64_t batch, heads, heads_kv, seq_q, seq_kv, head_dim;
  attn_dtype dtype;
} tool_shape_args;

/* getopt_long entries for --batch --heads --heads-kv --seq --seq-q --seq-kv
 * --head-dim --dtype, values 'b' 'h' 'H' 'n' 'q' 'k' 'd' 't'. */
#define TOOL_SHAPE_OPTIONS                                                         \
  {"batch", required_argument, 0, 'b'}, {"heads", required_argument, 0, 'h'},      \
      {"heads-kv", required_argument, 0, 'H'}, {"seq", required_argument, 0, 'n'}, \
      {"seq-q", required_argument, 0, 'q'}, {"seq-kv", required_argument, 0, 'k'}, \
      {"head-dim", required_argument, 0, 'd'}, {                                   \
    "dtype", required_argument, 0, 't'                                             \
  }

/* Applies option c with its argument: 1 when c is a shape option, 0 when it
 * is not, -1 (after a message) when its value is bad. */
int tool_arg_shape(int c, const char *arg, tool_shape_args *s);

/* getopt_long entries for the API options of docs/design.md (--causal --scale
 * --window-left --window-right --stats --backend, values 'c' 's' 'L' 'R'
 * 'S' 'B'): the one table `attn compute` and `attn infer` share. */
#define TOOL_API_OPTIONS                                                                       \
  {"causal", no_argument, 0, 'c'}, {"scale", required_argument, 0, 's'},                       \
      {"window-left", required_argument, 0, 'L'}, {"window-right", required_argument, 0, 'R'}, \
      {"stats", no_argument, 0, 'S'}, {"backend", required_argument, 0, 'B'},                  \
      {"softcap", required_argument, 0, 'C'}, {                                                \
    "diag-offset", required_argument, 0, 'O'                                                   \
  }

/* Applies API option c with its argument through the server's own option
 * parser (so a flag takes exactly what a query string takes): 1 when c is
 * one, with the option's query-string *name and *value set; 0 when c is
 * not one; -1 after one line on stderr starting with `me` when the value
 * is bad. */
int tool_arg_api_option(int c, const char *arg, const char *me, attn_options *o, const char **name,
                        const char **value);

#endif
