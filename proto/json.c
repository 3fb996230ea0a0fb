/*
 * json.c — the JSON wire format of POST /attention (DESIGN.md, "HTTP API").
 *
 * JSON is the format people type with curl and send from scripts, so the
 * decoder is strict and says exactly what is wrong: every number of a body
 * is checked, every key is known (an unknown key is an error, never silently
 * ignored, so a typo such as "casual" cannot change a result unnoticed), and
 * each message names the tensor, key, index or byte offset. Decoding goes
 * body -> a bounded pre-scan -> cJSON tree -> typed buffers of the request's
 * dtype (pr->owned[0..2]) -> attn_proto_build(), which holds the shape rules
 * both codecs share. Options in the body go through the one option parser,
 * attn_options_set(), after their JSON type is checked, and override the
 * query string's.
 *
 * The pre-scan bounds what cJSON would otherwise allocate and recurse into:
 * nesting deeper than ATTN_PROTO_MAX_DEPTH and more than
 * ATTN_PROTO_MAX_JSON_ELEMS numbers are refused before a tree is built.
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

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tensor_names[3] = {"q", "k", "v"};

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
 * or cJSON refuses the body, both with a 4xx. cJSON's own nesting limit
 * (1000) is far above ours, and it would allocate ~64 bytes per number
 * before we could count them.
 */
static int prescan(const char *s, size_t len, attn_status *st) {
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
      if (++depth > ATTN_PROTO_MAX_DEPTH)
        return attn_status_set(st, ATTN_PROTO_EJSON,
                               "invalid JSON at byte %zu: nesting deeper than %d", i,
                               ATTN_PROTO_MAX_DEPTH);
    } else if (c == ']' || c == '}') {
      if (depth > 0)
        depth--;
    } else if ((digit || c == '-') && !in_num) {
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

static int check_rank(const char *name, int rank, attn_status *st) {
  if (rank < 2 || rank > 4)
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\" has %d dimensions; use [N, D], [H, N, D] or "
                           "[B, H, N, D]",
                           name, rank);
  return 0;
}

/*
 * Stores x as element i of dtype dt, rounded once. A value that is not
 * finite, or that rounds to infinity in the dtype, is refused: the engine
 * must never see one, and the JSON number was what the user meant, so the
 * message quotes it. F32 is rounded by hand above FLT_MAX because a double
 * outside float's range converts with undefined behaviour in C.
 */
static int store(void *buf, attn_dtype dt, size_t i, double x) {
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
static int store_error(double x, attn_dtype dt, const char *name, const char *where,
                       attn_status *st) {
  if (!isfinite(x))
    return attn_status_set(st, ATTN_PROTO_ENONFINITE,
                           "tensor \"%s\": %s is not finite (JSON has no infinity; "
                           "1e999 and the like overflow)",
                           name, where);
  return attn_status_set(st, ATTN_PROTO_ENONFINITE,
                         "tensor \"%s\": %s = %.9g overflows %s (rounds to infinity)", name,
                         where, x, attn_dtype_name(dt));
}

static void *alloc_elems(size_t n, attn_dtype dt) {
  return malloc(n ? n * attn_dtype_size(dt) : 1);
}

/* Form (a): {"shape": [...], "dtype": "...", "data": [flat numbers]}. */
static int tensor_object(const cJSON *obj, attn_proto_tensor *t, void **pbuf,
                         attn_status *st) {
  const char *name = t->name;
  const cJSON *shape = NULL, *dtype = NULL, *data = NULL;
  char qk[48];
  for (const cJSON *c = obj->child; c; c = c->next) {
    const cJSON **slot = !strcmp(c->string, "shape")   ? &shape
                         : !strcmp(c->string, "dtype") ? &dtype
                         : !strcmp(c->string, "data")  ? &data
                                                       : NULL;
    attn__quote(qk, sizeof qk, c->string, strlen(c->string));
    if (!slot)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": unknown key \"%s\" (keys: shape, dtype, data)",
                             name, qk);
    if (*slot)
      return attn_status_set(st, ATTN_PROTO_EJSON, "tensor \"%s\": duplicate key \"%s\"",
                             name, qk);
    *slot = c;
  }
  if (!shape || !data)
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\": missing key \"%s\"", name,
                           !shape ? "shape" : "data");

  t->dtype = ATTN_F32;
  if (dtype) {
    if (!cJSON_IsString(dtype))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": dtype must be a string (F32, F16 or BF16), "
                             "not %s",
                             name, attn__json_type(dtype));
    if (attn_dtype_parse(dtype->valuestring, &t->dtype) < 0) {
      attn__quote(qk, sizeof qk, dtype->valuestring, strlen(dtype->valuestring));
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": unknown dtype \"%s\" (use F32, F16 or BF16)",
                             name, qk);
    }
  }

  if (!cJSON_IsArray(shape))
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": shape must be an array of integers, not %s", name,
                           attn__json_type(shape));
  int rank = cJSON_GetArraySize(shape), rc;
  if ((rc = check_rank(name, rank, st)) < 0)
    return rc;
  t->rank = rank;
  size_t n = 1;
  int i = 0;
  for (const cJSON *d = shape->child; d; d = d->next, i++) {
    double v = d->valuedouble;
    if (!cJSON_IsNumber(d))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] must be an integer, not %s", name, i,
                             attn__json_type(d));
    if (!(v >= 0) || v != floor(v))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] = %.17g must be an integer >= 0", name,
                             i, v);
    /* Beyond ATTN_MAX_DIM no count of JSON numbers could fill it; also keeps
     * the conversion to int64_t defined. */
    if (v > (double)ATTN_MAX_DIM)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": shape[%d] = %.17g is too large", name, i, v);
    t->shape[i] = (int64_t)v;
    if (__builtin_mul_overflow(n, (size_t)t->shape[i], &n))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": the shape's element count overflows", name);
  }

  if (!cJSON_IsArray(data))
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": data must be a flat array of numbers, not %s",
                           name, attn__json_type(data));
  size_t have = (size_t)cJSON_GetArraySize(data);
  if (have != n) {
    char s[128];
    size_t o = (size_t)snprintf(s, sizeof s, "[");
    for (int k = 0; k < rank && o < sizeof s; k++)
      o += (size_t)snprintf(s + o, sizeof s - o, k ? ", %lld" : "%lld",
                            (long long)t->shape[k]);
    if (o < sizeof s)
      snprintf(s + o, sizeof s - o, "]");
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": shape %s needs %zu values, data has %zu", name, s,
                           n, have);
  }
  void *buf = *pbuf = alloc_elems(n, t->dtype);
  if (!buf)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for tensor \"%s\"", name);
  size_t k = 0;
  for (const cJSON *e = data->child; e; e = e->next, k++) {
    if (!cJSON_IsNumber(e))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": data[%zu] must be a number, not %s", name, k,
                             attn__json_type(e));
    if (store(buf, t->dtype, k, e->valuedouble) < 0) {
      char where[48];
      snprintf(where, sizeof where, "data[%zu]", k);
      return store_error(e->valuedouble, t->dtype, name, where, st);
    }
  }
  t->data = buf;
  return 0;
}

/* Walks nested arrays of the inferred shape, checking each level against it
 * and, when out is not NULL, storing the leaves in order. idx is the index
 * path so far. */
static int nested_walk(const cJSON *a, const attn_proto_tensor *t, int level, size_t *idx,
                       float *out, size_t *pos, attn_status *st) {
  char p[96], p0[96];
  size_t zero[4] = {0, 0, 0, 0};
  size_t n = (size_t)cJSON_GetArraySize(a);
  if (n != (size_t)t->shape[level])
    return attn_status_set(st, ATTN_PROTO_ETENSOR,
                           "tensor \"%s\": row %s has %zu elements, row %s has %lld "
                           "(ragged arrays have no shape)",
                           t->name, path_str(p, sizeof p, idx, level), n,
                           path_str(p0, sizeof p0, zero, level), (long long)t->shape[level]);
  bool leaf = level == t->rank - 1;
  size_t i = 0;
  for (const cJSON *c = a->child; c; c = c->next, i++) {
    idx[level] = i;
    if (leaf) {
      if (!cJSON_IsNumber(c))
        return attn_status_set(st, ATTN_PROTO_ETENSOR,
                               "tensor \"%s\": element %s must be a number, not %s", t->name,
                               path_str(p, sizeof p, idx, level + 1), attn__json_type(c));
      if (out) {
        if (store(out, ATTN_F32, *pos, c->valuedouble) < 0) {
          char where[112];
          snprintf(where, sizeof where, "element %s", path_str(p, sizeof p, idx, level + 1));
          return store_error(c->valuedouble, ATTN_F32, t->name, where, st);
        }
        ++*pos;
      }
    } else {
      if (!cJSON_IsArray(c))
        return attn_status_set(st, ATTN_PROTO_ETENSOR,
                               "tensor \"%s\": element %s is %s where an array belongs "
                               "(ragged arrays have no shape)",
                               t->name, path_str(p, sizeof p, idx, level + 1), attn__json_type(c));
      int rc = nested_walk(c, t, level + 1, idx, out, pos, st);
      if (rc < 0)
        return rc;
    }
  }
  return 0;
}

/* Form (b): nested arrays of numbers, F32; the shape follows the first
 * element down each level, and every other element must agree with it. */
static int tensor_nested(const cJSON *a, attn_proto_tensor *t, void **pbuf,
                         attn_status *st) {
  int rank = 0;
  const cJSON *c = a;
  while (cJSON_IsArray(c)) {
    if (rank == 4)
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": nested arrays deeper than 4 levels; use [N, D], "
                             "[H, N, D] or [B, H, N, D]",
                             t->name);
    t->shape[rank++] = cJSON_GetArraySize(c);
    c = c->child;
  }
  int rc = check_rank(t->name, rank, st);
  if (rc < 0)
    return rc;
  t->rank = rank;
  t->dtype = ATTN_F32;
  /* The shape comes from the first element of each level, so a ragged body
   * ([[1, ... 1e5 numbers], [], [], ...]) could claim far more elements
   * than it holds: check the structure first, allocate after. Once it is
   * checked, the product is the leaf count and cannot overflow. */
  size_t idx[4] = {0, 0, 0, 0}, pos = 0, n = 1;
  if ((rc = nested_walk(a, t, 0, idx, NULL, &pos, st)) < 0)
    return rc;
  for (int i = 0; i < rank; i++)
    n *= (size_t)t->shape[i];
  float *buf = alloc_elems(n, ATTN_F32);
  *pbuf = buf;
  if (!buf)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for tensor \"%s\"",
                           t->name);
  if ((rc = nested_walk(a, t, 0, idx, buf, &pos, st)) < 0)
    return rc;
  t->data = buf;
  return 0;
}

static int tensor(const cJSON *j, attn_proto_tensor *t, void **pbuf, attn_status *st) {
  if (cJSON_IsObject(j))
    return tensor_object(j, t, pbuf, st);
  if (cJSON_IsArray(j))
    return tensor_nested(j, t, pbuf, st);
  return attn_status_set(st, ATTN_PROTO_ETENSOR,
                         "tensor \"%s\" must be an object {\"shape\", \"dtype\", \"data\"} or "
                         "nested arrays of numbers, not %s",
                         t->name, attn__json_type(j));
}

/* ---- options ------------------------------------------------------------ */

/* Checks a body field's JSON type against its option's kind, then hands its
 * canonical text to attn_options_set(), so values, ranges and messages are
 * the same as the query string's. */
static int option(attn_options *o, const cJSON *f, attn_status *st) {
  const char *key = f->string;
  size_t klen = strlen(key);
  attn_option_kind kind = attn_option_kind_of(key, klen);
  char text[64];
  const char *want = NULL;
  switch (kind) {
  case ATTN_OPTK_NONE: /* attn_options_set() words the error */
    return attn_options_set(o, key, klen, "", 0, "JSON field", st);
  case ATTN_OPTK_BOOL:
    if (!cJSON_IsBool(f)) {
      want = "true or false";
      break;
    }
    return attn_options_set(o, key, klen, cJSON_IsTrue(f) ? "true" : "false",
                            cJSON_IsTrue(f) ? 4 : 5, "JSON field", st);
  case ATTN_OPTK_NUMBER:
  case ATTN_OPTK_INT: {
    if (!cJSON_IsNumber(f)) {
      want = kind == ATTN_OPTK_INT ? "an integer" : "a number";
      break;
    }
    double v = f->valuedouble;
    /* Integers print as such; anything else prints as a double, which the
     * option parser then refuses for an integer option with its usual
     * message (e.g. got "2.5"). */
    int len = kind == ATTN_OPTK_INT && v == floor(v) && fabs(v) < 0x1p62
                  ? snprintf(text, sizeof text, "%lld", (long long)v)
                  : snprintf(text, sizeof text, "%.17g", v);
    return attn_options_set(o, key, klen, text, (size_t)len, "JSON field", st);
  }
  case ATTN_OPTK_STRING:
    if (!cJSON_IsString(f)) {
      want = "a string";
      break;
    }
    return attn_options_set(o, key, klen, f->valuestring, strlen(f->valuestring),
                            "JSON field", st);
  }
  return attn_status_set(st, ATTN_PROTO_EOPTVALUE,
                         "option \"%s\" in the JSON field must be %s, not %s", key, want,
                         attn__json_type(f));
}

/* ---- decode ------------------------------------------------------------- */

static int decode(const char *body, size_t len, const attn_options *query,
                  attn_proto_req *pr, cJSON **proot, attn_status *st) {
  int rc;
  if (len == 0)
    return attn_status_set(st, ATTN_PROTO_EEMPTY, "the request has no body");
  if ((rc = prescan(body, len, st)) < 0)
    return rc;
  /* Not require_null_terminated: with an exact length cJSON 1.7 would look
   * past the end for the NUL. Trailing bytes are checked here instead. */
  const char *end = NULL;
  cJSON *root = *proot = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  if (!root) {
    size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
    return attn_status_set(st, ATTN_PROTO_EJSON, "invalid JSON at byte %zu%s", at,
                           at >= len ? " (the body ends early)" : "");
  }
  while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
    end++;
  if (end < body + len)
    return attn_status_set(st, ATTN_PROTO_EJSON,
                           "invalid JSON at byte %zu: trailing characters after the value",
                           (size_t)(end - body));
  if (!cJSON_IsObject(root))
    return attn_status_set(st, ATTN_PROTO_EJSON,
                           "the JSON body must be an object {\"q\": ..., \"k\": ..., "
                           "\"v\": ...}, not %s",
                           attn__json_type(root));

  const cJSON *tj[3] = {NULL, NULL, NULL};
  attn_options body_opts;
  attn_options_init(&body_opts);
  for (const cJSON *c = root->child; c; c = c->next) {
    /* Every key before c was accepted (q, k, v or an option), so this scan
     * is over at most nine keys. */
    for (const cJSON *p = root->child; p != c; p = p->next)
      if (!strcmp(p->string, c->string)) {
        char qk[48];
        attn__quote(qk, sizeof qk, c->string, strlen(c->string));
        return attn_status_set(st, ATTN_PROTO_EJSON, "duplicate key \"%s\" in the JSON body",
                               qk);
      }
    int which = -1;
    for (int i = 0; i < 3; i++)
      if (!strcmp(c->string, tensor_names[i]))
        which = i;
    if (which >= 0)
      tj[which] = c;
    else if ((rc = option(&body_opts, c, st)) < 0)
      return rc;
  }
  for (int i = 0; i < 3; i++)
    if (!tj[i])
      return attn_status_set(st, ATTN_PROTO_EMISSING,
                             "tensor \"%s\" is missing (the body needs q, k and v)",
                             tensor_names[i]);

  attn_proto_tensor t[3];
  memset(t, 0, sizeof t);
  for (int i = 0; i < 3; i++) {
    t[i].name = tensor_names[i];
    if ((rc = tensor(tj[i], &t[i], &pr->owned[i], st)) < 0)
      return rc;
  }
  /* The numbers are in our buffers now; the tree can go before the output
   * is allocated. */
  cJSON_Delete(root);
  *proot = NULL;

  attn_options opts;
  if (query)
    opts = *query;
  else
    attn_options_init(&opts);
  attn_options_merge(&opts, &body_opts);
  return attn_proto_build(pr, t, &opts, st);
}

int attn_proto_decode_json(const char *body, size_t len, const attn_options *query,
                           attn_proto_req *pr, attn_status *st) {
  memset(pr, 0, sizeof *pr);
  cJSON *root = NULL;
  int rc = decode(body, len, query, pr, &root, st);
  cJSON_Delete(root);
  if (rc < 0)
    attn_proto_req_free(pr);
  return rc;
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

/* "name": {"shape": [...], "dtype": "...", "data": [...]} */
static void put_tensor(attn_sbuf *b, const char *name, const int64_t *shape, int rank,
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
  for (size_t i = 0; i < n; i++) {
    if (!attn_sbuf_reserve(b, 40))
      return;
    if (i)
      b->p[b->len++] = ',';
    b->len += fmt_elem(b->p + b->len, data, dt, i);
  }
  attn_sbuf_puts(b, "]}");
}

int attn_proto_encode_json(const attn_proto_req *pr, const char *backend, char **pbuf,
                           size_t *plen, attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  const attn_request *r = &pr->req;
  if (pr->rank < 1 || pr->rank > 4 || !r->o || attn_dtype_size(r->dtype) == 0)
    return attn_status_set(st, ATTN_EINVAL, "encode_json: the request has no result");
  for (int i = 0; i < pr->rank; i++)
    if (pr->shape_q[i] < 0)
      return attn_status_set(st, ATTN_EINVAL, "encode_json: negative dimension");
  attn_sbuf b = {0};
  /* Most numbers take 8 to 14 bytes; start near the final size. */
  size_t n = 1;
  for (int i = 0; i < pr->rank; i++)
    n *= (size_t)pr->shape_q[i];
  attn_sbuf_reserve(&b, n * 12 + 256);
  attn_sbuf_puts(&b, "{");
  put_tensor(&b, "o", pr->shape_q, pr->rank, r->dtype, r->o);
  if (pr->opts.stats && r->m && r->l && r->lse) {
    const float *s[3] = {r->m, r->l, r->lse};
    static const char *const names[3] = {"m", "l", "lse"};
    for (int i = 0; i < 3; i++) {
      attn_sbuf_puts(&b, ", ");
      put_tensor(&b, names[i], pr->shape_q, pr->rank - 1, ATTN_F32, s[i]);
    }
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
