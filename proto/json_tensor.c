/*
 * json_tensor.c — one tensor of a JSON request body (json.c decodes the
 * rest): an object {"shape", "dtype", "data"}, nested arrays of numbers, or
 * the int64 offsets of a variable-length batch.
 *
 * Each tensor is counted and checked whole before its buffer is allocated,
 * then each number is converted from the body's text straight into the
 * buffer of the request's dtype, rounded once; a value that is not finite,
 * or overflows the dtype, is refused with the tensor and index named.
 */
#include "internal.h"
#include "proto.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* ---- messages ------------------------------------------------------------ */

/* "[1][0]" for the index path idx[0..n), into buf. */
static const char *path_str(char *buf, size_t cap, const size_t *idx, int n) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "[%zu]", idx[i]);
  return buf;
}

/* ---- tensors ------------------------------------------------------------ */

/* lse, a backward pass's statistic: one dimension less than q, and null
 * elements (-inf, a row with no visible key), since JSON has no infinity. */
static bool is_lse(const attn_proto_tensor *t) { return !strcmp(t->name, "lse"); }

static int check_rank(const attn_proto_tensor *t, int rank, attn_status *st) {
  if (!strcmp(t->name, "alibi_slopes"))
    return rank == 1 || rank == 2
               ? 0
               : attn_status_set(st, ATTN_PROTO_ETENSOR,
                                 "tensor \"alibi_slopes\" has %d dimensions; use [Hq] or [B, Hq]",
                                 rank);
  if (!strcmp(t->name, "sinks"))
    return rank == 1 ? 0
                     : attn_status_set(st, ATTN_PROTO_ETENSOR,
                                       "tensor \"sinks\" has %d dimensions; use [Hq], one "
                                       "logit a query head",
                                       rank);
  int lo = is_lse(t) ? 1 : 2;
  if (rank < lo || rank > lo + 2)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           lo == 2 ? "tensor \"%s\" has %d dimensions; use [N, D], [H, N, D] or "
                                     "[B, H, N, D]"
                                   : "tensor \"%s\" has %d dimensions; use [N], [H, N] or "
                                     "[B, H, N] (q's shape without D)",
                           t->name, rank);
  return 0;
}

/* Whether the element at j is a number, or for lse a null. */
static bool elem_ok(const attn__jr *j, const attn_proto_tensor *t) {
  return attn__jr_is_number(j) || (is_lse(t) && j->s[j->pos] == 'n');
}

/* The element at j, which elem_ok() accepted (a null is -inf); steps past it. */
static double elem_value(attn__jr *j) {
  if (attn__jr_is_number(j))
    return attn__jr_number(j);
  attn__jr_skip(j);
  return -INFINITY;
}

/* store() for one element of t: lse keeps the -inf a null stands for. */
static int store_elem(void *buf, const attn_proto_tensor *t, size_t i, double x) {
  if (x == -INFINITY && is_lse(t)) {
    ((float *)buf)[i] = -INFINITY;
    return 0;
  }
  return attn__json_store(buf, t->dtype, i, x);
}

/*
 * Stores x as element i of dtype dt, rounded once. A value that is not
 * finite, or that rounds to infinity in the dtype, is refused: the engine
 * must never see one, and the JSON number was what the user meant, so the
 * message quotes it. F32 is rounded by hand above FLT_MAX because a double
 * outside float's range converts with undefined behaviour in C.
 */
int attn__json_store(void *buf, attn_dtype dt, size_t i, double x) {
  if (!isfinite(x))
    return ATTN_PROTO_ENONFINITE;
  switch (dt) {
  case ATTN_F32: {
    /* FLT_MAX + half an ulp and beyond round to infinity (the tie goes up:
     * FLT_MAX's last bit is odd); below that they round to FLT_MAX. */
    if (fabs(x) >= 0x1.ffffffp127)
      return ATTN_PROTO_ENONFINITE;
    float f = fabs(x) > FLT_MAX ? (x > 0 ? FLT_MAX : -FLT_MAX) : (float)x;
    ((float *)buf)[i] = f;
    return 0;
  }
  case ATTN_F16: {
    uint16_t h = attn_f64_to_f16(x);
    if ((h & 0x7fff) == 0x7c00)
      return ATTN_PROTO_ENONFINITE;
    ((uint16_t *)buf)[i] = h;
    return 0;
  }
  default: {
    uint16_t b = attn_f64_to_bf16(x);
    if ((b & 0x7fff) == 0x7f80)
      return ATTN_PROTO_ENONFINITE;
    ((uint16_t *)buf)[i] = b;
    return 0;
  }
  }
}

/* The message for a value store() refused; `where` is only formatted then,
 * off the per-element path. */
int attn__json_store_error(double x, attn_dtype dt, const char *name, const char *where,
                           attn_status *st) {
  if (!isfinite(x))
    return attn_status_set(st, ATTN_PROTO_ENONFINITE,
                           "tensor \"%s\": %s is not finite (JSON has no infinity; "
                           "1e999 and the like overflow)",
                           name, where);
  return attn_status_set(st, ATTN_PROTO_ENONFINITE,
                         "tensor \"%s\": %s = %.9g overflows %s (rounds to infinity)", name, where,
                         x, attn_dtype_name(dt));
}

static void *alloc_elems(size_t n, attn_dtype dt) {
  return malloc(n ? n * attn_dtype_size(dt) : 1);
}

/* The tensor object's keys: where each of shape, dtype and data starts (0:
 * absent; no value starts at byte 0, which is the body's '{'). */
static int tensor_fields(attn__jr *j, const char *name, size_t at[3], attn_status *st) {
  static const char *const fields[3] = {"shape", "dtype", "data"};
  char key[64], qk[48];
  size_t klen;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    int f = 0;
    while (f < 3 && !attn__key_is(key, klen, fields[f]))
      f++;
    attn__key_quote(qk, sizeof qk, key, klen, sizeof key);
    if (f == 3)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": unknown key \"%s\" (keys: shape, dtype, data)", name,
                             qk);
    if (at[f])
      return attn_status_set(st, ATTN_PROTO_EJSON, "tensor \"%s\": duplicate key \"%s\"", name, qk);
    at[f] = j->pos;
    attn__jr_skip(j);
  }
  if (!at[0] || !at[2])
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\": missing key \"%s\"", name,
                           !at[0] ? "shape" : "data");
  return 0;
}

static int tensor_dtype(attn__jr v, attn_proto_tensor *t, attn_status *st) {
  if (v.s[v.pos] != '"')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": dtype must be a string (F32, F16 or BF16), not %s",
                           t->name, attn__jr_type(&v));
  char s[64], qs[48];
  size_t n = attn__jr_string(&v, s, sizeof s);
  /* a NUL inside ("F32\u0000x") or a cut string names no dtype */
  if (n >= sizeof s || strlen(s) != n || attn_dtype_parse(s, &t->dtype) < 0)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": unknown dtype \"%s\" (use F32, F16 or BF16)", t->name,
                           attn__key_quote(qs, sizeof qs, s, n, sizeof s));
  return 0;
}

/* shape: 2 to 4 integers >= 0; *pn gets their product. */
static int tensor_shape(attn__jr v, attn_proto_tensor *t, size_t *pn, attn_status *st) {
  const char *name = t->name;
  if (v.s[v.pos] != '[')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": shape must be an array of integers, not %s", name,
                           attn__jr_type(&v));
  int rank = (int)attn__jr_count(&v), rc;
  if ((rc = check_rank(t, rank, st)) < 0)
    return rc;
  t->rank = rank;
  size_t n = 1;
  for (int i = 0; attn__jr_elem(&v); i++) {
    if (!attn__jr_is_number(&v))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] must be an integer, not %s", name, i,
                             attn__jr_type(&v));
    double d = attn__jr_number(&v);
    if (!(d >= 0) || d != floor(d))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] = %.17g must be an integer >= 0", name, i,
                             d);
    /* Beyond ATTN_MAX_DIM no count of JSON numbers could fill it; also keeps
     * the conversion to int64_t defined. */
    if (d > (double)ATTN_MAX_DIM)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] = %.17g is too large", name, i, d);
    t->shape[i] = (int64_t)d;
    if (__builtin_mul_overflow(n, (size_t)t->shape[i], &n))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": the shape's element count overflows", name);
  }
  *pn = n;
  return 0;
}

/* data: exactly n numbers, converted straight into a new buffer of the
 * tensor's dtype. Counted before anything is allocated, so a body cannot
 * make the decoder allocate for numbers it does not hold. */
static int tensor_data(attn__jr v, attn_proto_tensor *t, size_t n, void **pbuf, attn_status *st) {
  const char *name = t->name;
  if (v.s[v.pos] != '[')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": data must be a flat array of numbers, not %s", name,
                           attn__jr_type(&v));
  size_t have = attn__jr_count(&v);
  if (have != n) {
    char s[128];
    size_t o = (size_t)snprintf(s, sizeof s, "[");
    for (int k = 0; k < t->rank && o < sizeof s; k++)
      o += (size_t)snprintf(s + o, sizeof s - o, k ? ", %lld" : "%lld", (long long)t->shape[k]);
    if (o < sizeof s)
      snprintf(s + o, sizeof s - o, "]");
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": shape %s needs %zu values, data has %zu", name, s, n,
                           have);
  }
  void *buf = *pbuf = alloc_elems(n, t->dtype);
  if (!buf)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for tensor \"%s\"", name);
  for (size_t k = 0; attn__jr_elem(&v); k++) {
    if (!elem_ok(&v, t))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": data[%zu] must be a number%s, not %s", name, k,
                             is_lse(t) ? " or null" : "", attn__jr_type(&v));
    double x = elem_value(&v);
    if (store_elem(buf, t, k, x) < 0) {
      char where[48];
      snprintf(where, sizeof where, "data[%zu]", k);
      return attn__json_store_error(x, t->dtype, name, where, st);
    }
  }
  t->data = buf;
  return 0;
}

/* Form (a): {"shape": [...], "dtype": "...", "data": [flat numbers]}. The
 * keys come in any order; they are checked in this one. */
static int tensor_object(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
  size_t at[3] = {0, 0, 0}, n = 0;
  int rc = tensor_fields(&j, t->name, at, st);
  if (rc < 0)
    return rc;
  t->dtype = ATTN_F32;
  attn__jr v = j;
  if (at[1]) {
    v.pos = at[1];
    if ((rc = tensor_dtype(v, t, st)) < 0)
      return rc;
  }
  v.pos = at[0];
  if ((rc = tensor_shape(v, t, &n, st)) < 0)
    return rc;
  v.pos = at[2];
  return tensor_data(v, t, n, pbuf, st);
}

/* Walks nested arrays of the inferred shape, checking each level against it
 * and, when out is not NULL, storing the leaves in order. idx is the index
 * path so far. The checking pass counts each row before looking inside it,
 * so a ragged row is named before anything it holds; the storing pass
 * follows a checked structure and only converts numbers. */
static int nested_walk(attn__jr *j, const attn_proto_tensor *t, int level, size_t *idx, float *out,
                       size_t *pos, attn_status *st) {
  char p[96], p0[96];
  size_t zero[4] = {0, 0, 0, 0};
  size_t n = out ? (size_t)t->shape[level] : attn__jr_count(j);
  if (n != (size_t)t->shape[level])
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": row %s has %zu elements, row %s has %lld "
                           "(ragged arrays have no shape)",
                           t->name, path_str(p, sizeof p, idx, level), n,
                           path_str(p0, sizeof p0, zero, level), (long long)t->shape[level]);
  bool leaf = level == t->rank - 1;
  for (size_t i = 0; attn__jr_elem(j); i++) {
    idx[level] = i;
    int rc = 0;
    if (leaf && !elem_ok(j, t))
      return attn_status_set(
          st, ATTN_PROTO_ETENSOR, "tensor \"%s\": element %s must be a number%s, not %s", t->name,
          path_str(p, sizeof p, idx, level + 1), is_lse(t) ? " or null" : "", attn__jr_type(j));
    if (leaf && !out) {
      attn__jr_skip(j);
    } else if (leaf) {
      double x = elem_value(j);
      if (store_elem(out, t, *pos, x) < 0) {
        char where[112];
        snprintf(where, sizeof where, "element %s", path_str(p, sizeof p, idx, level + 1));
        return attn__json_store_error(x, ATTN_F32, t->name, where, st);
      }
      ++*pos;
    } else if (j->s[j->pos] != '[') {
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": element %s is %s where an array belongs "
                             "(ragged arrays have no shape)",
                             t->name, path_str(p, sizeof p, idx, level + 1), attn__jr_type(j));
    } else if ((rc = nested_walk(j, t, level + 1, idx, out, pos, st)) < 0) {
      return rc;
    }
  }
  return 0;
}

/* The shape of nested arrays: the length of each level's first element. */
static int nested_shape(attn__jr c, attn_proto_tensor *t, attn_status *st) {
  int rank = 0;
  while (c.s[c.pos] == '[') {
    if (rank == 4)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": nested arrays deeper than 4 levels; use [N, D], "
                             "[H, N, D] or [B, H, N, D]",
                             t->name);
    t->shape[rank++] = (int64_t)attn__jr_count(&c);
    if (!attn__jr_elem(&c)) /* an empty array has no first element */
      break;
  }
  int rc = check_rank(t, rank, st);
  if (rc < 0)
    return rc;
  t->rank = rank;
  t->dtype = ATTN_F32;
  return 0;
}

/* Form (b): nested arrays of numbers, F32; the shape follows the first
 * element down each level, and every other element must agree with it. */
static int tensor_nested(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
  int rc = nested_shape(j, t, st);
  if (rc < 0)
    return rc;
  /* The shape comes from the first element of each level, so a ragged body
   * ([[1, ... 1e5 numbers], [], [], ...]) could claim far more elements
   * than it holds: check the structure first, allocate after. Once it is
   * checked, the product is the leaf count and cannot overflow. */
  size_t idx[4] = {0, 0, 0, 0}, pos = 0, n = 1;
  attn__jr w = j;
  if ((rc = nested_walk(&w, t, 0, idx, NULL, &pos, st)) < 0)
    return rc;
  for (int i = 0; i < t->rank; i++)
    n *= (size_t)t->shape[i];
  float *buf = alloc_elems(n, ATTN_F32);
  *pbuf = buf;
  if (!buf)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for tensor \"%s\"", t->name);
  w = j;
  if ((rc = nested_walk(&w, t, 0, idx, buf, &pos, st)) < 0)
    return rc;
  t->data = buf;
  return 0;
}

int attn__json_cu_data(attn__jr v, attn_proto_tensor *t, size_t n, int bytes, void **pbuf,
                       attn_status *st) {
  if (v.s[v.pos] != '[' || attn__jr_count(&v) != n)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": data must be an array of %zu integers", t->name, n);
  if (n > ATTN_PROTO_MAX_JSON_CU)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\" holds %zu offsets; JSON takes at most %zu (send "
                           "safetensors for more sequences)",
                           t->name, n, ATTN_PROTO_MAX_JSON_CU);
  int64_t *out = *pbuf = malloc(n ? n * sizeof *out : 1);
  if (!out)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for tensor \"%s\"", t->name);
  const double lim = bytes == 4 ? 0x1p31 : 0x1p62;
  for (size_t k = 0; attn__jr_elem(&v); k++) {
    double x = attn__jr_is_number(&v) ? attn__jr_number(&v) : NAN;
    if (!(x >= -lim && x < lim) || x != floor(x))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": data[%zu] must be an integer%s", t->name, k,
                             bytes == 4 ? " within I32" : "");
    out[k] = (int64_t)x;
  }
  t->rank = 1;
  t->shape[0] = (int64_t)n;
  t->data = out;
  return 0;
}

/* cu_seqlens_q or cu_seqlens_kv: {"shape": [B+1], "dtype": "I32"|"I64"
 * (default I64), "data": [...]}, or a bare array of integers. */
static int cu_tensor(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
  if (j.s[j.pos] == '[')
    return attn__json_cu_data(j, t, attn__jr_count(&j), 8, pbuf, st);
  if (j.s[j.pos] != '{')
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\" must be {\"shape\", \"dtype\", \"data\"} or an array "
                           "of integers, not %s",
                           t->name, attn__jr_type(&j));
  size_t at[3] = {0, 0, 0};
  int rc = tensor_fields(&j, t->name, at, st), bytes = 8;
  if (rc < 0)
    return rc;
  attn__jr v = j;
  if (at[1]) {
    char s[16] = "";
    size_t n = 0;
    v.pos = at[1];
    if (v.s[v.pos] == '"')
      n = attn__jr_string(&v, s, sizeof s);
    /* a NUL inside ("I32\u0000") names no dtype */
    bytes = n < sizeof s && strlen(s) == n ? attn_proto_cu_dtype_bytes(s) : 0;
    if (!bytes)
      return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\": dtype must be I32 or I64",
                             t->name);
  }
  v.pos = at[0];
  double n = -1;
  if (v.s[v.pos] == '[' && attn__jr_count(&v) == 1 && attn__jr_elem(&v) && attn__jr_is_number(&v))
    n = attn__jr_number(&v);
  if (!(n >= 0 && n <= (double)ATTN_MAX_DIM) || n != floor(n))
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": shape must be [B+1], one integer", t->name);
  v.pos = at[2];
  return attn__json_cu_data(v, t, (size_t)n, bytes, pbuf, st);
}

int attn__json_tensor(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
  if (!strncmp(t->name, "cu_seqlens_", 11))
    return cu_tensor(j, t, pbuf, st);
  if (j.s[j.pos] == '{')
    return tensor_object(j, t, pbuf, st);
  if (j.s[j.pos] == '[')
    return tensor_nested(j, t, pbuf, st);
  return attn_status_set(st, ATTN_PROTO_ETENSOR,
                         "tensor \"%s\" must be an object {\"shape\", \"dtype\", \"data\"} or "
                         "nested arrays of numbers, not %s",
                         t->name, attn__jr_type(&j));
}
