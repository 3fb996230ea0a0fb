/*
 * build.c — from three decoded tensors and the options to an engine request
 * with its output buffers; the shape rules both codecs share.
 */
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_str(char *buf, size_t cap, const attn_proto_tensor *t) {
  size_t o = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  if (o < cap)
    snprintf(buf + o, cap - o, "]");
}

static int check_one(const attn_proto_tensor *t, attn_status *st) {
  char s[128];
  if (t->rank < 2 || t->rank > 4)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\" has %d dimensions; use [N, D], [H, N, D] or "
                           "[B, H, N, D]",
                           t->name, t->rank);
  for (int i = 0; i < t->rank; i++)
    if (t->shape[i] < 1) {
      shape_str(s, sizeof s, t);
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape %s has a dimension below 1", t->name, s);
    }
  return 0;
}

/* [B, H, N, D] of a tensor of rank 2 to 4. */
static void bhnd(const attn_proto_tensor *t, int64_t d[4]) {
  d[0] = t->rank == 4 ? t->shape[0] : 1;
  d[1] = t->rank >= 3 ? t->shape[t->rank - 3] : 1;
  d[2] = t->shape[t->rank - 2];
  d[3] = t->shape[t->rank - 1];
}

static const char *backend_literal(const char *name) {
  static const char *const names[] = {"auto", "cpu", "cuda", "reference"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (!strcmp(name, names[i]))
      return names[i];
  return "auto";
}

int attn_proto_build(attn_proto_req *pr, const attn_proto_tensor t[3], const attn_options *opts,
                     attn_status *st) {
  int rc;
  for (int i = 0; i < 3; i++)
    if ((rc = check_one(&t[i], st)) < 0)
      return rc;
  for (int i = 1; i < 3; i++)
    if (t[i].dtype != t[0].dtype)
      return attn_status_set(st, ATTN_PROTO_EDTYPE,
                             "tensor \"%s\" is %s but \"q\" is %s; q, k and v must share "
                             "one dtype",
                             t[i].name, attn_dtype_name(t[i].dtype), attn_dtype_name(t[0].dtype));
  char a[128], b[128];
  if (t[1].rank != t[0].rank || t[2].rank != t[0].rank)
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "q, k and v must have the same number of dimensions (q %d, "
                           "k %d, v %d)",
                           t[0].rank, t[1].rank, t[2].rank);
  if (memcmp(t[1].shape, t[2].shape, sizeof t[1].shape) != 0) {
    shape_str(a, sizeof a, &t[1]);
    shape_str(b, sizeof b, &t[2]);
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "tensor \"v\" has shape %s but \"k\" has %s; they must match", b, a);
  }
  int64_t q[4], k[4];
  bhnd(&t[0], q);
  bhnd(&t[1], k);
  shape_str(a, sizeof a, &t[0]);
  shape_str(b, sizeof b, &t[1]);
  if (q[3] != k[3])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "head dims differ: q %s ends in %lld, k %s in %lld", a, (long long)q[3],
                           b, (long long)k[3]);
  if (q[0] != k[0])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "batch sizes differ: q %s has %lld, k %s has %lld", a, (long long)q[0],
                           b, (long long)k[0]);
  if (q[1] % k[1])
    return attn_status_set(st, ATTN_PROTO_ESHAPE,
                           "q %s has %lld heads, k %s has %lld: query heads must be a "
                           "multiple of key/value heads",
                           a, (long long)q[1], b, (long long)k[1]);
  pr->opts = *opts;
  pr->rank = t[0].rank;
  memcpy(pr->shape_q, t[0].shape, sizeof pr->shape_q);
  attn_request *r = &pr->req;
  attn_request_init(r);
  r->batch = q[0];
  r->heads_q = q[1];
  r->heads_kv = k[1];
  r->seq_q = q[2];
  r->seq_kv = k[2];
  r->head_dim = q[3];
  r->dtype = t[0].dtype;
  r->scale = opts->scale;
  r->causal = opts->causal;
  r->window_left = opts->window_left;
  r->window_right = opts->window_right;
  r->backend = backend_literal(opts->backend);
  r->q = t[0].data;
  r->k = t[1].data;
  r->v = t[2].data;
  static char probe;
  r->o = &probe; /* validation wants an output; the real one comes below */
  if ((rc = attn_request_validate(r, st)) < 0)
    return rc;
  size_t on = (size_t)(q[0] * q[1] * q[2] * q[3]) * attn_dtype_size(r->dtype);
  size_t rows = (size_t)(q[0] * q[1] * q[2]);
  on = (on + 3) & ~(size_t)3; /* statistics follow O, 4-byte aligned */
  size_t total = on + (opts->stats ? 3 * rows * sizeof(float) : 0);
  pr->out = malloc(total ? total : 1);
  if (!pr->out)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for the %zu-byte result", total);
  r->o = pr->out;
  if (opts->stats) {
    r->m = (float *)((char *)pr->out + on);
    r->l = r->m + rows;
    r->lse = r->l + rows;
  }
  return 0;
}

void attn_proto_req_free(attn_proto_req *pr) {
  for (int i = 0; i < 4; i++)
    free(pr->owned[i]);
  free(pr->out);
  memset(pr, 0, sizeof *pr);
}
