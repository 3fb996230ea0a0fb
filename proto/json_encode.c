/*
 * json_encode.c — the JSON reply of POST /attention, and the tensor writers
 * the request encoder (request_encode.c) shares.
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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether text parses back to the element (F32 f, or F16/BF16 bits). */
static bool reads_back(const char *text, attn_dtype dt, float f, uint16_t bits) {
  if (dt == ATTN_F32)
    return attn__parse_float(text) == f;
  char *end;
  double y = attn__parse_number(text, &end);
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
  size_t n = attn__fmt_g(out, x, hi - 1);
  if (!reads_back(out, dt, f, bits))
    return attn__fmt_g(out, x, hi);
  for (int prec = hi - 2; prec >= lo; prec--) {
    size_t m = attn__fmt_g(t, x, prec);
    if (!reads_back(t, dt, f, bits))
      break;
    memcpy(out, t, m + 1);
    n = m;
  }
  return n;
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
    if (pr->shape_q[i] < 0 || pr->shape_o[i] < 0)
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
  if (pr->reply_json && *pr->reply_json) {
    attn_sbuf_puts(&b, ", ");
    attn_sbuf_puts(&b, pr->reply_json);
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
