/*
 * infer_inputs.c — the optional inputs of a random `attn infer` request:
 * --cu-seqlens-q/kv offsets and the shapes they imply, and --alibi-slopes
 * and --sinks as a comma list or a safetensors file.
 *
 * A variable-length batch takes its B and totals from the offsets (B + 1
 * of each) and Hq, Hkv, D from --shape/--shape-kv; a --shape or --shape-kv
 * that says otherwise is refused here, so the tensors generated are the
 * ones the user asked for. The offsets themselves (starting at 0, not
 * decreasing) are the server's to judge: it answers bad ones with a 422 the
 * user can read, as for any option only the server can judge.
 */
#include "args.h"
#include "files.h"
#include "infer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ME TOOL_INFER_ME

/* Offsets of a flag as a comma list of integers from 0 to 2^40; 0, or 2
 * after a message. */
int tool_infer_parse_offsets(const char *flag, const char *s, int64_t **pv, int64_t *pn) {
  int64_t n = tool_arg_list_len(s);
  free(*pv);
  *pv = malloc((size_t)n * sizeof **pv);
  *pn = n;
  const char *p = s;
  for (int64_t i = 0; *pv && i < n; i++)
    if (n < 2 || !tool_arg_list_i64(&p, 0, 1LL << 40, i + 1 == n, &(*pv)[i])) {
      fprintf(stderr,
              ME ": %s expects B+1 offsets (B >= 1), integers from 0 to 2^40 separated by "
                 "commas, like 0,3,7 (got \"%s\")\n",
              flag, s);
      return 2;
    }
  return *pv ? 0 : 2;
}

/* One shape flag against the offsets: its B must be their sequence count
 * and its N their total, when the flag was given; then set so. */
static int varlen_dims(const char *flag, bool given, int64_t s[4], int64_t nseq, int64_t total) {
  if (given && (s[0] != nseq || s[2] != total)) {
    fprintf(stderr,
            ME ": %s %lld,%lld,%lld,%lld contradicts the offsets: with cu_seqlens its B is "
               "the number of sequences (%lld) and its N their total (the last offset, "
               "%lld)\n",
            flag, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3],
            (long long)nseq, (long long)total);
    return 2;
  }
  s[0] = nseq;
  s[2] = total;
  return 0;
}

int tool_infer_varlen_shapes(tool_infer_args *a) {
  if (!a->cu_q && !a->cu_kv)
    return 0;
  const char *why = !a->cu_q || !a->cu_kv   ? "give both --cu-seqlens-q and --cu-seqlens-kv"
                    : a->ncu_q != a->ncu_kv ? "--cu-seqlens-q and --cu-seqlens-kv must have "
                                              "the same number of offsets (B + 1 each)"
                    : a->in     ? "--cu-seqlens-q/kv make random tensors; with IN, put the "
                                  "tensors cu_seqlens_q and cu_seqlens_kv in IN"
                    : a->shards ? "--shards does not split a variable-length batch"
                                : NULL;
  if (why) {
    fprintf(stderr, ME ": %s\n", why);
    return 2;
  }
  const int64_t nseq = a->ncu_q - 1, tq = a->cu_q[nseq], tkv = a->cu_kv[nseq];
  if (tq < 1 || tkv < 1) {
    fprintf(stderr,
            ME ": the last offsets are the totals of queries (%lld) and keys (%lld); each "
               "must be at least 1\n",
            (long long)tq, (long long)tkv);
    return 2;
  }
  /* B and N of the default shape (1,1,128,64) give way to the offsets. */
  bool kv_given = a->have_shape_kv;
  if (varlen_dims("--shape", a->have_shape, a->shape, nseq, tq) != 0)
    return 2;
  if (!kv_given)
    memcpy(a->shape_kv, a->shape, sizeof a->shape);
  return varlen_dims("--shape-kv", kv_given, a->shape_kv, nseq, tkv);
}

/* Tensor `which` of the safetensors file at path for option flag, F32 of
 * rank 1 .. max_rank (shapes: how they are written), into *t and *copy
 * (malloc'd); 0, or 2 after saying what is wrong. */
static int f32_file(const char *me, const char *flag, const char *path, int which, int max_rank,
                    const char *shapes, attn_proto_tensor *t, void **copy) {
  void *body;
  size_t len;
  if (tool_read_file(path, &body, &len) < 0) {
    fprintf(stderr, "%s: cannot read %s: %s\n", me, path, strerror(errno));
    return 2;
  }
  attn_status st;
  int rc = attn_proto_safetensors_tensor(body, len, which, t, copy, &st);
  free(body);
  const char *name = attn_proto_tensor_name(which);
  if (rc < 0)
    fprintf(stderr, "%s: %s %s: %s\n", me, flag, path, st.message);
  else if (!t->data)
    fprintf(stderr, "%s: %s %s: it holds no tensor %s\n", me, flag, path, name);
  else if (t->dtype != ATTN_F32 || t->rank > max_rank)
    fprintf(stderr, "%s: %s %s: its %s is not %s%s\n", me, flag, path, name,
            t->dtype != ATTN_F32 ? "F32" : "", t->dtype != ATTN_F32 ? "" : shapes);
  else
    return 0;
  free(*copy);
  return 2;
}

/* The finite numbers of a comma-separated list for option flag (what: the
 * rest of the error's sentence), as a new array of *pn floats; NULL after
 * saying what is wrong. */
static float *number_list(const char *me, const char *flag, const char *s, const char *what,
                          int64_t *pn) {
  *pn = tool_arg_list_len(s);
  float *x = malloc((size_t)*pn * sizeof *x);
  const char *p = s;
  for (int64_t i = 0; x && i < *pn; i++) {
    double v;
    if (!tool_arg_list_double(&p, i + 1 == *pn, &v)) {
      fprintf(stderr,
              "%s: %s expects a file NAME.safetensors or finite numbers separated by "
              "commas%s (got \"%s\")\n",
              me, flag, what, s);
      free(x);
      return NULL;
    }
    x[i] = (float)v;
  }
  return x;
}

static bool safetensors_name(const char *s) {
  size_t n = strlen(s);
  return n > 12 && !strcmp(s + n - 12, ".safetensors");
}

/* --alibi-slopes: a file's tensor alibi_slopes, F32 [Hq] or [B, Hq], or a
 * list (checked against the shapes in tool_infer_alibi_shape()). */
int tool_infer_parse_slopes(const char *s, tool_infer_args *a) {
  free(a->alibi);
  a->alibi = NULL;
  a->alibi_rank = 0;
  if (!safetensors_name(s))
    return (a->alibi = number_list(ME, "--alibi-slopes", s, "", &a->nalibi)) ? 0 : 2;
  attn_proto_tensor t;
  void *copy = NULL;
  if (f32_file(ME, "--alibi-slopes", s, ATTN_PROTO_T_ALIBI, 2, "[Hq] or [B, Hq]", &t, &copy))
    return 2;
  a->alibi = copy;
  a->alibi_rank = t.rank;
  a->alibi_shape[0] = t.shape[0];
  a->alibi_shape[1] = t.rank == 2 ? t.shape[1] : 0;
  a->nalibi = t.shape[0] * (t.rank == 2 ? t.shape[1] : 1);
  return 0;
}

/* --sinks: a file's tensor sinks, F32 [Hq], or a list (Hq checked by the
 * command once it knows Hq). */
int tool_infer_parse_sinks(const char *me, const char *s, float **sinks, int64_t *nsinks) {
  free(*sinks);
  *sinks = NULL;
  if (!safetensors_name(s))
    return (*sinks = number_list(me, "--sinks", s, ", one a query head", nsinks)) ? 0 : 2;
  attn_proto_tensor t;
  void *copy = NULL;
  if (f32_file(me, "--sinks", s, ATTN_PROTO_T_SINKS, 1, "[Hq]", &t, &copy))
    return 2;
  *sinks = copy;
  *nsinks = t.shape[0];
  return 0;
}

int tool_infer_alibi_shape(const tool_infer_args *a, int64_t *stride_b) {
  const int64_t b = a->shape[0], hq = a->shape[1];
  bool ok = a->alibi_rank == 1   ? a->alibi_shape[0] == hq
            : a->alibi_rank == 2 ? a->alibi_shape[0] == b && a->alibi_shape[1] == hq
                                 : a->nalibi == hq || a->nalibi == b * hq;
  if (!ok && a->alibi_rank)
    fprintf(stderr,
            ME ": --alibi-slopes: the file's alibi_slopes is [%lld%s%.0lld]; give [Hq] = "
               "[%lld] or [B, Hq] = [%lld, %lld]\n",
            (long long)a->alibi_shape[0], a->alibi_rank == 2 ? ", " : "",
            (long long)a->alibi_shape[1], (long long)hq, (long long)b, (long long)hq);
  else if (!ok)
    fprintf(stderr, ME ": --alibi-slopes has %lld numbers; give Hq = %lld or B*Hq = %lld\n",
            (long long)a->nalibi, (long long)hq, (long long)(b * hq));
  *stride_b = a->alibi_rank == 2 || (!a->alibi_rank && a->nalibi != hq) ? hq : 0;
  return ok ? 0 : 2;
}
