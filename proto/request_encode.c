/*
 * request_encode.c — the client's side of the request codecs: q, k, v (and
 * for a backward request o, do and lse) and options written as the bodies
 * the server's decoders read (json.c and safetensors.c hold the other
 * direction).
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

/* One tensor of a request body. */
typedef struct in_tensor {
  const char *name;
  attn_dtype dtype; /* q's and the others'; unused when i64 */
  bool i64;         /* cu_seqlens: int64 offsets, "I64" on the wire */
  int64_t shape[4];
  int rank;
  const void *data;
  size_t bytes;
} in_tensor;

/* Bytes of an es-byte-element tensor of this shape; 0, or an error when a
 * dimension is below 1 or the size overflows. */
static int tensor_bytes(const in_tensor *t, size_t *pn, attn_status *st) {
  size_t n = t->i64 ? sizeof(int64_t) : attn_dtype_size(t->dtype);
  for (int i = 0; i < t->rank; i++) {
    if (t->shape[i] < 1)
      return attn_status_set(st, ATTN_EINVAL,
                             "encode request: %s has dimension %d of %lld (at least 1)", t->name, i,
                             (long long)t->shape[i]);
    if (__builtin_mul_overflow(n, (size_t)t->shape[i], &n))
      return attn_status_set(st, ATTN_PROTO_ETOOLARGE, "encode request: %s's size overflows",
                             t->name);
  }
  *pn = n;
  return 0;
}

/* alibi_slopes when r has them ([Hq], or [B, Hq] when each batch has its
 * own), the cu_seqlens of a variable-length batch ([B+1] int64 each) and
 * sinks ([Hq]), after the n tensors already in t. Returns the new count, or an error. */
static int optional_inputs(const attn_request *r, in_tensor *t, int n, attn_status *st) {
  int rc;
  if (r->alibi_slopes) {
    in_tensor *x = &t[n++];
    const bool per_b = r->alibi_stride_b != 0;
    *x = (in_tensor){attn_proto_tensor_name(ATTN_PROTO_T_ALIBI),
                     ATTN_F32,
                     false,
                     {per_b ? r->batch : r->heads_q, r->heads_q},
                     per_b ? 2 : 1,
                     r->alibi_slopes,
                     0};
    if ((rc = tensor_bytes(x, &x->bytes, st)) < 0)
      return rc;
  }
  if (!r->cu_seqlens_q != !r->cu_seqlens_kv)
    return attn_status_set(st, ATTN_EINVAL,
                           "encode request: a variable-length batch needs both cu_seqlens_q "
                           "and cu_seqlens_kv");
  for (int i = 0; r->cu_seqlens_q && i < 2; i++) {
    in_tensor *x = &t[n++];
    *x = (in_tensor){attn_proto_tensor_name(i ? ATTN_PROTO_T_CU_KV : ATTN_PROTO_T_CU_Q),
                     ATTN_F32,
                     true,
                     {r->batch + 1},
                     1,
                     i ? r->cu_seqlens_kv : r->cu_seqlens_q,
                     0};
    if ((rc = tensor_bytes(x, &x->bytes, st)) < 0)
      return rc;
  }
  if (r->sinks) {
    in_tensor *x = &t[n++];
    *x = (in_tensor){
        attn_proto_tensor_name(ATTN_PROTO_T_SINKS), ATTN_F32, false, {r->heads_q}, 1, r->sinks, 0};
    if ((rc = tensor_bytes(x, &x->bytes, st)) < 0)
      return rc;
  }
  return n;
}

/* The tensors of r's body in the table's order: q, k, v, and for a
 * backward request o, do and, when given, lse; then alibi_slopes, the
 * cu_seqlens and sinks when r has them. v, o and do end in Dv
 * (attn_request_dv). A variable-length batch's q, k, v (o, do)
 * are [H, total, D] and its lse [Hq, total]: no batch dimension. Returns
 * how many, or an error when one is missing or its size is wrong. */
static int inputs(const attn_request *r, in_tensor t[ATTN_PROTO_MAX_TENSORS], attn_status *st) {
  const int64_t sq[4] = {r->batch, r->heads_q, r->seq_q, r->head_dim};
  const int64_t skv[4] = {r->batch, r->heads_kv, r->seq_kv, r->head_dim};
  /* v, and a backward's o and do, have the value head dim Dv */
  const int64_t so[4] = {r->batch, r->heads_q, r->seq_q, attn_request_dv(r)};
  const int64_t sv[4] = {r->batch, r->heads_kv, r->seq_kv, attn_request_dv(r)};
  const int64_t *shapes[6] = {sq, skv, sv, so, so, sq};
  const int drop = r->cu_seqlens_q ? 1 : 0; /* varlen: no B */
  bool bwd = r->pass == ATTN_BACKWARD;
  const void *data[ATTN_PROTO_MAX_TENSORS] = {r->q, r->k, r->v, r->o, r->dout, r->lse_in};
  int n = bwd ? (r->lse_in ? 6 : 5) : 3, rc;
  if (!attn_dtype_size(r->dtype))
    return attn_status_set(st, ATTN_EINVAL, "encode request: the dtype is missing");
  for (int i = 0; i < n; i++) {
    in_tensor *x = &t[i];
    bool lse = i == ATTN_PROTO_T_LSE;
    *x = (in_tensor){attn_proto_tensor_name(i),
                     lse ? ATTN_F32 : r->dtype,
                     false,
                     {0},
                     (lse ? 3 : 4) - drop,
                     data[i],
                     0};
    memcpy(x->shape, shapes[i] + drop, (size_t)x->rank * sizeof *x->shape);
    if (!x->data)
      return attn_status_set(st, ATTN_EINVAL, "encode request: %s or the dtype is missing",
                             attn_proto_tensor_list(r->pass));
    if ((rc = tensor_bytes(x, &x->bytes, st)) < 0)
      return rc;
  }
  return optional_inputs(r, t, n, st);
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
  case ATTN_OPT_DIAG_OFFSET:
    *name = "diag_offset";
    snprintf(val, cap, "%lld", (long long)o->diag_offset);
    break;
  case ATTN_OPT_STATS:
    *name = "stats";
    snprintf(val, cap, o->stats ? "true" : "false");
    break;
  case ATTN_OPT_SOFTCAP:
    *name = "softcap";
    snprintf(val, cap, "%.17g", o->softcap);
    break;
  default:
    *name = "backend";
    snprintf(val, cap, "%s", o->backend);
    *quoted = true;
    break;
  }
  return true;
}

static const unsigned option_bits[] = {
    ATTN_OPT_CAUSAL, ATTN_OPT_SCALE,   ATTN_OPT_WINDOW_LEFT, ATTN_OPT_WINDOW_RIGHT,
    ATTN_OPT_STATS,  ATTN_OPT_BACKEND, ATTN_OPT_SOFTCAP,     ATTN_OPT_DIAG_OFFSET};
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
  in_tensor t[ATTN_PROTO_MAX_TENSORS];
  int n = inputs(r, t, st);
  if (n < 0)
    return n;
  char h[1536];
  size_t hn = (size_t)snprintf(h, sizeof h, "{"), off = 0;
  if (opts && opts->set)
    hn = put_metadata(h, sizeof h, hn, opts);
  const void *parts[ATTN_PROTO_MAX_TENSORS];
  size_t sizes[ATTN_PROTO_MAX_TENSORS];
  for (int i = 0; i < n; i++) {
    hn = attn__st_put_entry(h, sizeof h, hn, t[i].name,
                            t[i].i64 ? "I64" : attn_dtype_name(t[i].dtype), t[i].shape, t[i].rank,
                            off, off + t[i].bytes);
    parts[i] = t[i].data;
    sizes[i] = t[i].bytes;
    off += t[i].bytes;
  }
  if (hn < sizeof h)
    hn += (size_t)snprintf(h + hn, sizeof h - hn, "}");
  if (hn >= sizeof h) /* the header holds ten entries and eight short options */
    return attn_status_set(st, ATTN_EINVAL, "safetensors header over %zu bytes", sizeof h);
  return attn__st_frame(h, hn, parts, sizes, n, "request", pbuf, plen, st);
}

/* "name": {"shape": [n], "dtype": "I64", "data": [...]}: a cu_seqlens
 * tensor, whose offsets the float writer cannot hold exactly. */
static void put_i64_tensor(attn_sbuf *s, const in_tensor *t) {
  const int64_t *v = t->data;
  attn_sbuf_json_str(s, t->name);
  attn_sbuf_printf(s, ": {\"shape\": [%lld], \"dtype\": \"I64\", \"data\": [",
                   (long long)t->shape[0]);
  for (int64_t i = 0; i < t->shape[0]; i++)
    attn_sbuf_printf(s, i ? ",%lld" : "%lld", (long long)v[i]);
  attn_sbuf_puts(s, "]}");
}

int attn_proto_encode_request_json(const attn_request *r, const attn_options *opts, char **pbuf,
                                   size_t *plen, attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  in_tensor t[ATTN_PROTO_MAX_TENSORS];
  int n = inputs(r, t, st);
  if (n < 0)
    return n;
  attn_sbuf s = {0};
  /* Most numbers take 8 to 14 bytes; start near the final size. */
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += t[i].i64 ? (size_t)t[i].shape[0] * 2 : t[i].bytes / attn_dtype_size(t[i].dtype);
  attn_sbuf_reserve(&s, total * 12 + 256);
  attn_sbuf_puts(&s, "{");
  for (int i = 0; i < n; i++) {
    attn_sbuf_puts(&s, i ? ", " : "");
    if (t[i].i64)
      put_i64_tensor(&s, &t[i]);
    else
      attn__json_put_tensor(&s, t[i].name, t[i].shape, t[i].rank, t[i].dtype, t[i].data);
  }
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
