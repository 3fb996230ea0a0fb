/*
 * json.c — the JSON wire format of POST /attention (DESIGN.md, "HTTP API").
 *
 * JSON is the format people type with curl and send from scripts, so the
 * decoder is strict and says exactly what is wrong: every number of a body
 * is checked, every key is known (an unknown key is an error, never silently
 * ignored, so a typo such as "casual" cannot change a result unnoticed), and
 * each message names the tensor, key, index or byte offset. Decoding goes
 * body -> a bounded pre-scan -> a grammar check of the whole body -> typed
 * buffers of the request's dtype (pr->owned[0..2]), each number converted
 * from the body's text straight into its tensor -> attn_proto_build(),
 * which holds the shape rules both codecs share. Options in the body go
 * through the one option parser, attn_options_set(), after their JSON type
 * is checked, and override the query string's.
 *
 * Nothing but the tensors is allocated (jsonread.c reads the body in
 * place), so a decode costs at most attn_proto_json_decode_bound() bytes
 * beyond the body, whether it succeeds or fails: the server counts that
 * against its memory budget before it decodes. A tree parser would cost a
 * node per number, 16 times the tensor.
 *
 * The checks run in a fixed order, the same for every body: the pre-scan
 * (nesting deeper than ATTN_PROTO_MAX_DEPTH, more than
 * ATTN_PROTO_MAX_JSON_ELEMS numbers), then the grammar, then the keys of the
 * body in order (duplicates, options), then q, k and v in that order, each
 * counted before its buffer is allocated.
 *
 * Encoding writes the reply straight into one growing buffer (outputs can
 * hold millions of numbers; a cJSON tree would cost a node per number).
 * Each number is the shortest decimal that reads back to the same value of
 * its dtype, so a client that parses the reply and rounds to that dtype gets
 * the engine's bits. JSON has no infinity or NaN: a statistic that is -inf
 * (m and lse of a row with no visible key) is written as null, as is any
 * other non-finite value.
 */
#include "internal.h"
#include "proto.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NT ATTN_PROTO_MAX_TENSORS

/* ---- messages ------------------------------------------------------------ */

/* "[1][0]" for the index path idx[0..n), into buf. */
static const char *path_str(char *buf, size_t cap, const size_t *idx, int n) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "[%zu]", idx[i]);
  return buf;
}

/* ---- the pre-scan ------------------------------------------------------- */

/*
 * One pass over the bytes, outside strings, counting nesting and number
 * tokens. For valid JSON the counts are exact; for invalid JSON either this
 * or the grammar check refuses the body, both with a 4xx. It runs first so
 * that a deep body ("{{{{...") is named for its depth rather than for its
 * first bad token, and it bounds the grammar check's recursion.
 */
int attn__json_prescan(const char *s, size_t len, int max_depth, attn_status *st) {
  int depth = 0;
  bool in_str = false, esc = false, in_num = false;
  size_t numbers = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    bool digit = c >= '0' && c <= '9';
    if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return attn_status_set(st, ATTN_PROTO_EJSON,
                               "invalid JSON at byte %zu: nesting deeper than %d", i, max_depth);
    } else if (c == ']' || c == '}') {
      if (depth > 0)
        depth--;
    } else if (((digit || c == '-') && !in_num) || c == 'n') {
      /* a null is an element too (lse's -inf), so it counts like a number */
      if (++numbers > ATTN_PROTO_MAX_JSON_ELEMS)
        return attn_status_set(st, ATTN_PROTO_ETOOLARGE,
                               "the JSON body holds more than %zu numbers",
                               (size_t)ATTN_PROTO_MAX_JSON_ELEMS);
    }
    in_num = digit || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
  }
  return 0;
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

/* The key of a member for messages: cut, escaped. */
static const char *quote_key(char *dst, size_t cap, const char *key, size_t klen, size_t kcap) {
  return attn_quote(dst, cap, key, klen < kcap ? klen : kcap - 1);
}

static bool key_is(const char *key, size_t klen, const char *want) {
  return klen == strlen(want) && !memcmp(key, want, klen);
}

/* The tensor object's keys: where each of shape, dtype and data starts (0:
 * absent; no value starts at byte 0, which is the body's '{'). */
static int tensor_fields(attn__jr *j, const char *name, size_t at[3], attn_status *st) {
  static const char *const fields[3] = {"shape", "dtype", "data"};
  char key[64], qk[48];
  size_t klen;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    int f = 0;
    while (f < 3 && !key_is(key, klen, fields[f]))
      f++;
    quote_key(qk, sizeof qk, key, klen, sizeof key);
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
                           quote_key(qs, sizeof qs, s, n, sizeof s));
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

static int tensor(attn__jr j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
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

/* ---- options ------------------------------------------------------------ */

/* Checks a body field's JSON type against its option's kind, then hands its
 * canonical text to attn_options_set(), so values, ranges and messages are
 * the same as the query string's. key is a known name or, when cut, longer
 * than any; v is at the value. */
int attn__json_option(attn_options *o, const char *key, size_t klen, attn__jr v, const char *source,
                      attn_status *st) {
  attn_option_kind kind = attn_option_kind_of(key, klen);
  char text[128];
  const char *want = NULL;
  char c = v.s[v.pos];
  switch (kind) {
  case ATTN_OPTK_NONE: /* attn_options_set() words the error */
    return attn_options_set(o, key, klen, "", 0, source, st);
  case ATTN_OPTK_BOOL:
    if (c != 't' && c != 'f') {
      want = "true or false";
      break;
    }
    return attn_options_set(o, key, klen, c == 't' ? "true" : "false", c == 't' ? 4 : 5, source,
                            st);
  case ATTN_OPTK_NUMBER:
  case ATTN_OPTK_INT: {
    if (!attn__jr_is_number(&v)) {
      want = kind == ATTN_OPTK_INT ? "an integer" : "a number";
      break;
    }
    double x = attn__jr_number(&v);
    /* Integers print as such; anything else prints as a double, which the
     * option parser then refuses for an integer option with its usual
     * message (e.g. got "2.5"). */
    int len = kind == ATTN_OPTK_INT && x == floor(x) && fabs(x) < 0x1p62
                  ? snprintf(text, sizeof text, "%lld", (long long)x)
                  : snprintf(text, sizeof text, "%.17g", x);
    return attn_options_set(o, key, klen, text, (size_t)len, source, st);
  }
  case ATTN_OPTK_STRING: {
    if (c != '"') {
      want = "a string";
      break;
    }
    /* A value cut to fit text is longer than any valid one, and the option
     * parser quotes only its start. */
    size_t n = attn__jr_string(&v, text, sizeof text);
    return attn_options_set(o, key, klen, text, n < sizeof text ? n : sizeof text - 1, source, st);
  }
  }
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "option \"%s\" in the JSON field must be %s, not %s", key, want,
                         attn__jr_type(&v));
}

/* ---- decode ------------------------------------------------------------- */

/* The body object's members: where each tensor of the pass starts (0:
 * absent), and the options, in body order. Every key accepted is a tensor
 * or an option (at most seventeen short names), and a repeat of any is
 * refused. A key that is neither names an unknown tensor when its value is
 * an object or array (what a tensor looks like), else an unknown option. */
static int body_fields(attn__jr *j, attn_pass pass, size_t tat[NT], attn_options *opts,
                       attn_status *st) {
  char key[128], qk[48];
  size_t klen;
  attn__seen seen = {0};
  int rc;
  while (attn__jr_member(j, key, sizeof key, &klen)) {
    size_t kl = klen < sizeof key ? klen : sizeof key - 1;
    if (!attn__seen_first(&seen, key, klen))
      return attn_status_set(st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in the JSON body",
                             quote_key(qk, sizeof qk, key, klen, sizeof key));
    int which = 0;
    while (which < NT && !(attn_proto_tensor_in_pass(which, pass) &&
                           key_is(key, klen, attn_proto_tensor_name(which))))
      which++;
    char c = j->s[j->pos];
    if (which < NT)
      tat[which] = j->pos;
    else if ((c == '{' || c == '[') && attn_option_kind_of(key, kl) == ATTN_OPTK_NONE)
      return attn_status_set(
          st, ATTN_PROTO_EUNKNOWNTENSOR, "unknown tensor \"%s\"; send exactly %s",
          quote_key(qk, sizeof qk, key, klen, sizeof key), attn_proto_tensor_list(pass));
    else if ((rc = attn__json_option(opts, key, kl, *j, "JSON field", st)) < 0)
      return rc;
    attn__jr_skip(j);
  }
  return 0;
}

/* Each tensor the body holds, in the table's order, into t[] (data NULL
 * for one it does not hold), a required one missing refused. */
static int body_tensors(attn__jr j, attn_pass pass, const size_t tat[NT], attn_proto_req *pr,
                        attn_proto_tensor t[NT], attn_status *st) {
  int rc;
  for (int i = 0; i < NT; i++)
    if (attn_proto_tensor_in_pass(i, pass) && !tat[i] && !attn_proto_tensor_optional(i))
      return attn_status_set(st, ATTN_PROTO_EMISSING,
                             "tensor \"%s\" is missing (the body needs %s)",
                             attn_proto_tensor_name(i), attn_proto_tensor_list(pass));
  memset(t, 0, NT * sizeof *t);
  for (int i = 0; i < NT; i++) {
    t[i].name = attn_proto_tensor_name(i);
    j.pos = tat[i];
    if (tat[i] && (rc = tensor(j, &t[i], &pr->owned[i], st)) < 0)
      return rc;
  }
  return 0;
}

static int decode(const char *body, size_t len, attn_pass pass, const attn_options *query,
                  attn_proto_req *pr, attn_status *st) {
  int rc;
  if (len == 0)
    return attn_status_set(st, ATTN_PROTO_EEMPTY, "the request has no body");
  if ((rc = attn__json_prescan(body, len, ATTN_PROTO_MAX_DEPTH, st)) < 0 ||
      (rc = attn__json_check(body, len, st)) < 0)
    return rc;
  attn__jr j = {body, len, 0};
  attn__jr_ws(&j);
  if (body[j.pos] != '{')
    return attn_status_set(st, ATTN_PROTO_EJSON,
                           "the JSON body must be an object {\"q\": ..., \"k\": ..., "
                           "\"v\": ...}, not %s",
                           attn__jr_type(&j));
  size_t tat[NT] = {0};
  attn_options body_opts;
  attn_options_init(&body_opts);
  attn_proto_tensor t[NT];
  if ((rc = body_fields(&j, pass, tat, &body_opts, st)) < 0 ||
      (rc = body_tensors(j, pass, tat, pr, t, st)) < 0)
    return rc;
  attn_options opts;
  if (query)
    opts = *query;
  else
    attn_options_init(&opts);
  attn_options_merge(&opts, &body_opts);
  return attn_proto_build_pass(pr, pass, t, &opts, st);
}

int attn_proto_decode_json_pass(const char *body, size_t len, attn_pass pass,
                                const attn_options *query, attn_proto_req *pr, attn_status *st) {
  memset(pr, 0, sizeof *pr);
  int rc = decode(body, len, pass, query, pr, st);
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
}

int attn_proto_decode_json(const char *body, size_t len, const attn_options *query,
                           attn_proto_req *pr, attn_status *st) {
  return attn_proto_decode_json_pass(body, len, ATTN_FORWARD, query, pr, st);
}

size_t attn_proto_json_decode_bound(size_t len) {
  /* The reader allocates nothing; the tensors are all there is, however
   * many a pass takes. An element stored in a tensor (a number, or a null of
   * lse) is followed by ',' or ']', so the body holds at most len / 2 of
   * them, and the pre-scan refuses more than ATTN_PROTO_MAX_JSON_ELEMS,
   * nulls counted. F32 is the widest dtype. */
  size_t n = len / 2;
  if (n > ATTN_PROTO_MAX_JSON_ELEMS)
    n = ATTN_PROTO_MAX_JSON_ELEMS;
  size_t cu = n < 2 * ATTN_PROTO_MAX_JSON_CU ? n : 2 * ATTN_PROTO_MAX_JSON_CU;
  return n * sizeof(float) + cu * (sizeof(int64_t) - sizeof(float));
}

/* ---- encode ------------------------------------------------------------- */

/* Whether text parses back to the element (F32 f, or F16/BF16 bits). */
static bool reads_back(const char *text, attn_dtype dt, float f, uint16_t bits) {
  if (dt == ATTN_F32)
    return strtof(text, NULL) == f;
  double y = strtod(text, NULL);
  return (dt == ATTN_F16 ? attn_f64_to_f16(y) : attn_f64_to_bf16(y)) == bits;
}

/*
 * The shortest "%.Ng" text of element i of a buffer of dtype dt that reads
 * back to the same element: for F32 through strtof, for F16 and BF16 through
 * strtod and one rounding to the dtype (what a client does with the double a
 * JSON parser gives it). 9, 5 and 4 significant digits always suffice.
 * -0 prints as "-0", so the sign survives. Writes at most 32 bytes.
 */
static size_t fmt_elem(char *out, const void *p, attn_dtype dt, size_t i) {
  int lo, hi;
  double x;
  uint16_t bits = 0;
  float f = 0;
  switch (dt) {
  case ATTN_F32:
    f = ((const float *)p)[i];
    x = f;
    lo = 6, hi = 9;
    break;
  case ATTN_F16:
    bits = ((const uint16_t *)p)[i];
    x = attn_f16_to_f32(bits);
    lo = 3, hi = 5;
    break;
  default:
    bits = ((const uint16_t *)p)[i];
    x = attn_bf16_to_f32(bits);
    lo = 2, hi = 4;
    break;
  }
  if (!isfinite(x)) {
    memcpy(out, "null", 4);
    return 4;
  }
  /* hi digits always read back (the unit tests check every F16 and BF16
   * value; 9 is the float's bound). Most computed values need hi or hi - 1
   * digits, so start at hi - 1 and walk down while the text still reads
   * back, or up to hi at once: two conversions for most values. (Next to a
   * power of two, where the interval that reads back is lopsided, a shorter
   * text can lie past one that fails; the walk stops there, one digit long.) */
  char t[32];
  int n = snprintf(out, 32, "%.*g", hi - 1, x);
  if (!reads_back(out, dt, f, bits))
    return (size_t)snprintf(out, 32, "%.*g", hi, x);
  for (int prec = hi - 2; prec >= lo; prec--) {
    int m = snprintf(t, sizeof t, "%.*g", prec, x);
    if (!reads_back(t, dt, f, bits))
      break;
    memcpy(out, t, (size_t)m + 1);
    n = m;
  }
  return (size_t)n;
}

static void put_shape(attn_sbuf *b, const int64_t *shape, int rank) {
  char t[32];
  attn_sbuf_put(b, "[", 1);
  for (int i = 0; i < rank; i++)
    attn_sbuf_put(b, t, (size_t)snprintf(t, sizeof t, i ? ", %lld" : "%lld", (long long)shape[i]));
  attn_sbuf_put(b, "]", 1);
}

void attn__json_put_tensor(attn_sbuf *b, const char *name, const int64_t *shape, int rank,
                           attn_dtype dt, const void *data) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)shape[i];
  attn_sbuf_json_str(b, name);
  attn_sbuf_puts(b, ": {\"shape\": ");
  put_shape(b, shape, rank);
  attn_sbuf_puts(b, ", \"dtype\": ");
  attn_sbuf_json_str(b, attn_dtype_name(dt));
  attn_sbuf_puts(b, ", \"data\": [");
  attn__json_put_elems(b, dt, data, n);
  attn_sbuf_puts(b, "]}");
}

void attn__json_put_elems(attn_sbuf *b, attn_dtype dt, const void *data, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (!attn_sbuf_reserve(b, 40))
      return;
    if (i)
      b->p[b->len++] = ',';
    b->len += fmt_elem(b->p + b->len, data, dt, i);
  }
}

int attn_proto_encode_json(const attn_proto_req *pr, const char *backend, char **pbuf, size_t *plen,
                           attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  attn__out t[ATTN__MAX_OUTS];
  int n = pr->rank < 1 || pr->rank > 4 || !attn_dtype_size(pr->req.dtype)
              ? 0
              : attn__reply_outs(pr, false, t);
  for (int i = 0; i < pr->rank; i++)
    if (pr->shape_q[i] < 0)
      return attn_status_set(st, ATTN_EINVAL, "encode_json: negative dimension");
  if (!n || !t[0].data)
    return attn_status_set(st, ATTN_EINVAL, "encode_json: the request has no result");
  attn_sbuf b = {0};
  /* Most numbers take 8 to 14 bytes; start near the final size. */
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += t[i].data ? t[i].count : 0;
  attn_sbuf_reserve(&b, total * 12 + 256);
  attn_sbuf_puts(&b, "{");
  for (int i = 0, first = 1; i < n; i++) {
    if (!t[i].data) /* statistics asked for but not computed */
      continue;
    attn_sbuf_puts(&b, first ? "" : ", ");
    attn__json_put_tensor(&b, t[i].name, t[i].shape, t[i].rank, t[i].dtype, t[i].data);
    first = 0;
  }
  if (backend) {
    attn_sbuf_puts(&b, ", \"backend\": ");
    attn_sbuf_json_str(&b, backend);
  }
  attn_sbuf_puts(&b, "}");
  if (b.oom) {
    free(b.p);
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory encoding the JSON reply");
  }
  *pbuf = b.p;
  *plen = b.len;
  return 0;
}
