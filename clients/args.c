/* args.c — see args.h. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t tool_arg_list_len(const char *s) {
  int64_t n = 1;
  for (; *s; s++)
    n += *s == ',';
  return n;
}

bool tool_arg_list_i64(const char **p, int64_t lo, int64_t hi, bool last, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(*p, &end, 10);
  if (end == *p || errno || v < lo || v > hi || *end != (last ? 0 : ','))
    return false;
  *out = v;
  *p = end + !last;
  return true;
}

bool tool_arg_list_double(const char **p, bool last, double *out) {
  char *end;
  errno = 0;
  double v = strtod(*p, &end);
  if (end == *p || errno || !isfinite(v) || *end != (last ? 0 : ','))
    return false;
  *out = v;
  *p = end + !last;
  return true;
}

int tool_arg_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  const char *p = s ? s : "";
  if (!tool_arg_list_i64(&p, lo, hi, true, out)) {
    fprintf(stderr, "attn: %s expects an integer from %lld to %lld (got \"%s\")\n", flag,
            (long long)lo, (long long)hi, s ? s : "");
    return -1;
  }
  return 0;
}

int tool_arg_double(const char *flag, const char *s, double lo, double hi, double *out) {
  const char *p = s ? s : "";
  double v;
  if (!tool_arg_list_double(&p, true, &v) || v < lo || v > hi) {
    fprintf(stderr, "attn: %s expects a number from %g to %g (got \"%s\")\n", flag, lo, hi,
            s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

int tool_arg_int(const char *flag, const char *s, int lo, int hi, int *out) {
  int64_t v;
  if (tool_arg_i64(flag, s, lo, hi, &v) < 0)
    return -1;
  *out = (int)v;
  return 0;
}

int tool_arg_tune(const char *flag, const char *s) {
  if (s && *s && attn_cpu_tune_known(s))
    return 0;
  fprintf(stderr, "attn: %s expects auto, intel or amd (got \"%s\")\n", flag, s ? s : "");
  return -1;
}

int tool_arg_dtype(const char *flag, const char *s, attn_dtype *out) {
  if (attn_dtype_parse(s, out) < 0) {
    fprintf(stderr, "attn: %s expects F32, F16 or BF16 (got \"%s\")\n", flag, s ? s : "");
    return -1;
  }
  return 0;
}

int tool_arg_shape(int c, const char *arg, tool_shape_args *s) {
  const int64_t big = ATTN_MAX_DIM;
  int rc;
  switch (c) {
  case 'b': rc = tool_arg_i64("--batch", arg, 1, big, &s->batch); break;
  case 'h': rc = tool_arg_i64("--heads", arg, 1, big, &s->heads); break;
  case 'H': rc = tool_arg_i64("--heads-kv", arg, 1, big, &s->heads_kv); break;
  case 'n':
    rc = tool_arg_i64("--seq", arg, 1, big, &s->seq_q);
    s->seq_kv = s->seq_q;
    break;
  case 'q': rc = tool_arg_i64("--seq-q", arg, 1, big, &s->seq_q); break;
  case 'k': rc = tool_arg_i64("--seq-kv", arg, 1, big, &s->seq_kv); break;
  case 'd': rc = tool_arg_i64("--head-dim", arg, 1, ATTN_MAX_HEAD_DIM, &s->head_dim); break;
  case 't': rc = tool_arg_dtype("--dtype", arg, &s->dtype); break;
  default: return 0;
  }
  return rc < 0 ? -1 : 1;
}

int tool_arg_dims(const char *flag, const char *s, int64_t out[4]) {
  const char *p = s ? s : "";
  for (int i = 0; i < 4; i++)
    if (!tool_arg_list_i64(&p, 1, ATTN_MAX_DIM, i == 3, &out[i])) {
      fprintf(stderr, "attn: %s expects B,H,N,D: four positive integers (got \"%s\")\n", flag,
              s ? s : "");
      return -1;
    }
  return 0;
}

int tool_arg_api_option(int c, const char *arg, const char *me, attn_options *o, const char **name,
                        const char **value) {
  /* The option names as the query string spells them. */
  static const char *const names[128] = {
      ['c'] = "causal", ['s'] = "scale",   ['L'] = "window_left", ['R'] = "window_right",
      ['S'] = "stats",  ['B'] = "backend", ['C'] = "softcap",     ['O'] = "diag_offset"};
  if (c < 0 || c >= 128 || !names[c])
    return 0;
  const char *v = c == 'c' || c == 'S' ? "true" : arg ? arg : "";
  attn_status st;
  if (attn_options_set(o, names[c], strlen(names[c]), v, strlen(v), "flags", &st) < 0) {
    fprintf(stderr, "%s: %s\n", me, st.message);
    return -1;
  }
  *name = names[c];
  *value = v;
  return 1;
}

const char *tool_arg_api_key(const char *me, bool *bad) {
  const char *k = getenv("ATTND_API_KEY");
  *bad = false;
  if (!k || !*k)
    return NULL;
  if (strlen(k) > 500) {
    fprintf(stderr, "%s: ATTND_API_KEY is over 500 characters\n", me);
    *bad = true;
    return NULL;
  }
  for (const char *p = k; *p; p++)
    if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e) {
      fprintf(stderr,
              "%s: ATTND_API_KEY holds a space or control character; a key is printable "
              "ASCII without spaces\n",
              me);
      *bad = true;
      return NULL;
    }
  return k;
}
