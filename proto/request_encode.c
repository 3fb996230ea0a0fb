/*
 * request_encode.c — the client's side of the request codecs: q, k, v and
 * options written as the bodies the server's decoders read (json.c and
 * safetensors.c hold the other direction).
 *
 * The tensor and header writers are the reply encoders' (internal.h), so a
 * request and a reply of the same tensors are written the same way. Options
 * are written from one table: as typed JSON fields, or as the string values
 * a safetensors __metadata__ must hold; either way the server's option
 * parser reads back the same value (scale as "%.17g", which round-trips a
 * double).
 */
#include "internal.h"
#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shapes of q and of k, v and their element counts; 0, or an error when
 * the request has no tensors, a dimension below 1 or sizes that overflow. */
static int shapes(const attn_request *r, int64_t sq[4], int64_t skv[4], size_t bytes[2],
                  attn_status *st) {
  size_t es = attn_dtype_size(r->dtype);
  int64_t q[4] = {r->batch, r->heads_q, r->seq_q, r->head_dim};
  int64_t kv[4] = {r->batch, r->heads_kv, r->seq_kv, r->head_dim};
  if (!r->q || !r->k || !r->v || !es)
    return attn_status_set(st, ATTN_EINVAL, "encode request: q, k, v or the dtype is missing");
  for (int t = 0; t < 2; t++) {
    const int64_t *s = t ? kv : q;
    size_t n = es;
    for (int i = 0; i < 4; i++) {
      if (s[i] < 1)
        return attn_status_set(st, ATTN_EINVAL,
                               "encode request: %s has dimension %d of %lld (at least 1)",
                               t ? "k" : "q", i, (long long)s[i]);
      if (__builtin_mul_overflow(n, (size_t)s[i], &n))
        return attn_status_set(st, ATTN_PROTO_ETOOLARGE, "encode request: %s's size overflows",
                               t ? "k" : "q");
    }
    bytes[t] = n;
  }
  memcpy(sq, q, sizeof q);
  memcpy(skv, kv, sizeof kv);
  return 0;
}

/* Option `bit` of o as text: its name, and its value as a JSON value
 * (booleans and numbers bare, backend quoted in *quoted). false when o does
 * not set it. */
static bool option_text(const attn_options *o, unsigned bit, const char **name, char *val,
                        size_t cap, bool *quoted) {
  if (!(o->set & bit))
    return false;
  *quoted = false;
  switch (bit) {
  case ATTN_OPT_CAUSAL:
    *name = "causal";
    snprintf(val, cap, o->causal ? "true" : "false");
    break;
  case ATTN_OPT_SCALE:
    *name = "scale";
    snprintf(val, cap, "%.17g", o->scale);
    break;
  case ATTN_OPT_WINDOW_LEFT:
    *name = "window_left";
    snprintf(val, cap, "%lld", (long long)o->window_left);
    break;
  case ATTN_OPT_WINDOW_RIGHT:
    *name = "window_right";
    snprintf(val, cap, "%lld", (long long)o->window_right);
    break;
  case ATTN_OPT_STATS:
    *name = "stats";
    snprintf(val, cap, o->stats ? "true" : "false");
    break;
  default:
    *name = "backend";
    snprintf(val, cap, "%s", o->backend);
    *quoted = true;
    break;
  }
  return true;
}

static const unsigned option_bits[] = {ATTN_OPT_CAUSAL,       ATTN_OPT_SCALE, ATTN_OPT_WINDOW_LEFT,
                                       ATTN_OPT_WINDOW_RIGHT, ATTN_OPT_STATS, ATTN_OPT_BACKEND};
#define NOPTS (sizeof option_bits / sizeof option_bits[0])

/* "__metadata__":{"name":"value",...} at h + o; returns the new length. */
static size_t put_metadata(char *h, size_t cap, size_t o, const attn_options *opts) {
  o += (size_t)snprintf(h + o, cap - o, "\"__metadata__\":{");
  bool first = true, quoted;
  for (size_t i = 0; i < NOPTS && o < cap; i++) {
    const char *name;
    char val[64];
    if (!option_text(opts, option_bits[i], &name, val, sizeof val, &quoted))
      continue;
    o += (size_t)snprintf(h + o, cap - o, "%s\"%s\":\"%s\"", first ? "" : ",", name, val);
    first = false;
  }
  if (o < cap)
    o += (size_t)snprintf(h + o, cap - o, "}");
  return o;
}

int attn_proto_encode_request_safetensors(const attn_request *r, const attn_options *opts,
                                          void **pbuf, size_t *plen, attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  int64_t sq[4], skv[4];
  size_t b[2];
  int rc = shapes(r, sq, skv, b, st);
  if (rc < 0)
    return rc;
  char h[1024];
  size_t n = (size_t)snprintf(h, sizeof h, "{");
  if (opts && opts->set)
    n = put_metadata(h, sizeof h, n, opts);
  n = attn__st_put_entry(h, sizeof h, n, "q", r->dtype, sq, 4, 0, b[0]);
  n = attn__st_put_entry(h, sizeof h, n, "k", r->dtype, skv, 4, b[0], b[0] + b[1]);
  n = attn__st_put_entry(h, sizeof h, n, "v", r->dtype, skv, 4, b[0] + b[1], b[0] + 2 * b[1]);
  if (n < sizeof h)
    n += (size_t)snprintf(h + n, sizeof h - n, "}");
  if (n >= sizeof h) /* the header holds three entries and six short options */
    return attn_status_set(st, ATTN_EINVAL, "safetensors header over %zu bytes", sizeof h);
  const void *parts[3] = {r->q, r->k, r->v};
  size_t sizes[3] = {b[0], b[1], b[1]};
  return attn__st_frame(h, n, parts, sizes, 3, "request", pbuf, plen, st);
}

int attn_proto_encode_request_json(const attn_request *r, const attn_options *opts, char **pbuf,
                                   size_t *plen, attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  int64_t sq[4], skv[4];
  size_t b[2];
  int rc = shapes(r, sq, skv, b, st);
  if (rc < 0)
    return rc;
  attn_sbuf s = {0};
  /* Most numbers take 8 to 14 bytes; start near the final size. */
  attn_sbuf_reserve(&s, (b[0] + 2 * b[1]) / attn_dtype_size(r->dtype) * 12 + 256);
  attn_sbuf_puts(&s, "{");
  attn__json_put_tensor(&s, "q", sq, 4, r->dtype, r->q);
  attn_sbuf_puts(&s, ", ");
  attn__json_put_tensor(&s, "k", skv, 4, r->dtype, r->k);
  attn_sbuf_puts(&s, ", ");
  attn__json_put_tensor(&s, "v", skv, 4, r->dtype, r->v);
  for (size_t i = 0; opts && i < NOPTS; i++) {
    const char *name;
    char val[64];
    bool quoted;
    if (!option_text(opts, option_bits[i], &name, val, sizeof val, &quoted))
      continue;
    attn_sbuf_printf(&s, ", \"%s\": ", name);
    if (quoted)
      attn_sbuf_json_str(&s, val);
    else
      attn_sbuf_puts(&s, val);
  }
  attn_sbuf_puts(&s, "}");
  if (s.oom) {
    free(s.p);
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for the JSON request body");
  }
  *pbuf = s.p;
  *plen = s.len;
  return 0;
}
