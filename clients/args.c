/* args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int attn_arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "attn: %s expects an integer from %lld to %lld (got \"%s\")\n",
            flag, (long long)lo, (long long)hi, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

int attn_arg_int(const char *flag, const char *s, int lo, int hi, int *out) {
  int64_t v;
  if (attn_arg_i64(flag, s, lo, hi, &v) < 0)
    return -1;
  *out = (int)v;
  return 0;
}

int attn_arg_dtype(const char *flag, const char *s, attn_dtype *out) {
  if (attn_dtype_parse(s, out) < 0) {
    fprintf(stderr, "attn: %s expects F32, F16 or BF16 (got \"%s\")\n", flag,
            s ? s : "");
    return -1;
  }
  return 0;
}
