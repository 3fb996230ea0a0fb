/*
 * reply_decode.c — the client's side of the reply codecs: a server's reply
 * read back into the output buffers of the request that was sent (json_encode.c
 * and safetensors_write.c write replies).
 *
 * A reply comes from a server the client chose to trust, but it is still
 * bytes from a network: every length, offset, shape and count is checked
 * against what the request must produce before a byte is copied, and a
 * refusal names the tensor, so that whoever runs a client against a wrong or
 * foreign server learns which part of the reply is off. Replies are small
 * next to requests (o is q's size; dq, dk, dv those of q, k, v), so a cJSON
 * tree is fine here. Which tensors a reply holds, with their dtypes and
 * shapes, comes from the table the reply encoders write from
 * (attn__reply_outs).
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The dtype field of tensor t must name its dtype. */
static int check_dtype(const cJSON *j, const attn__out *t, attn_status *st) {
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  attn_dtype dt;
  if (cJSON_IsString(jd) && attn_dtype_parse(jd->valuestring, &dt) == 0 && dt == t->dtype)
    return 0;
  return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"%s\" is not %s", t->name,
                         attn_dtype_name(t->dtype));
}

/* The shape field of tensor t must be the shape the request implies. */
static int check_shape(const cJSON *j, const attn__out *t, attn_status *st) {
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
  bool ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == t->rank;
  for (int d = 0; ok && d < t->rank; d++) {
    const cJSON *x = cJSON_GetArrayItem(sh, d);
    ok = cJSON_IsNumber(x) && x->valuedouble == (double)t->shape[d];
  }
  if (ok)
    return 0;
  char w[96];
  size_t o = (size_t)snprintf(w, sizeof w, "[");
  for (int d = 0; d < t->rank && o < sizeof w; d++)
    o += (size_t)snprintf(w + o, sizeof w - o, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  if (o < sizeof w)
    snprintf(w + o, sizeof w - o, "]");
  char *got = sh ? cJSON_PrintUnformatted(sh) : NULL;
  char q[96];
  int rc = attn_status_set(st, ATTN_PROTO_ESHAPE, "tensor \"%s\" has shape %s, expected %s",
                           t->name, got ? attn_quote(q, sizeof q, got, strlen(got)) : "(none)", w);
  cJSON_free(got);
  return rc;
}

/* "o", "o, m, l, lse" or "dq, dk, dv" for messages. */
static const char *names_list(const attn__out *t, int n, char *buf, size_t cap) {
  size_t o = 0;
  buf[0] = 0;
  for (int i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, i ? ", %s" : "%s", t[i].name);
  return buf;
}

/* ---- safetensors ---------------------------------------------------------- */

/* Entry e of the header (the tensor's name) into its place in pr; *found
 * counts the tensors seen. */
static int st_entry(const cJSON *e, const char *data, size_t dlen, const attn__out *t, int want,
                    int *found, attn_status *st) {
  int i = 0;
  while (i < want && strcmp(e->string, t[i].name))
    i++;
  if (i == want) {
    char q[96];
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR, "unexpected tensor \"%s\"",
                           attn_quote(q, sizeof q, e->string, strlen(e->string)));
  }
  (*found)++;
  int rc;
  if ((rc = check_dtype(e, &t[i], st)) < 0 || (rc = check_shape(e, &t[i], st)) < 0)
    return rc;
  size_t bytes = t[i].count * attn_dtype_size(t[i].dtype);
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  const cJSON *b0 = cJSON_GetArrayItem(off, 0), *b1 = cJSON_GetArrayItem(off, 1);
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !cJSON_IsNumber(b0) ||
      !cJSON_IsNumber(b1) || b0->valuedouble < 0 || b1->valuedouble > (double)dlen ||
      b1->valuedouble - b0->valuedouble != (double)bytes)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets do not hold its %zu bytes within the "
                           "%zu bytes of data",
                           t[i].name, bytes, dlen);
  /* memcpy: the reply buffer's alignment is the server's business */
  memcpy(t[i].data, data + (size_t)b0->valuedouble, bytes);
  return 0;
}

int attn_proto_decode_reply_safetensors(const void *bodyv, size_t len, attn_proto_req *pr,
                                        attn_status *st) {
  const char *body = bodyv;
  if (len < 8)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "%zu bytes: shorter than a safetensors header length", len);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)(unsigned char)body[i] << (8 * i);
  if (n > len - 8)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "header length %llu runs past the %zu-byte reply", (unsigned long long)n,
                           len);
  cJSON *h = cJSON_ParseWithLength(body + 8, (size_t)n);
  if (!cJSON_IsObject(h)) {
    cJSON_Delete(h);
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "the safetensors header is not a JSON object");
  }
  attn__out t[ATTN__MAX_OUTS];
  int want = attn__reply_outs(pr, false, t), found = 0, rc = 0;
  for (const cJSON *e = h->child; e && rc == 0; e = e->next)
    if (strcmp(e->string, "__metadata__"))
      rc = st_entry(e, body + 8 + n, len - 8 - (size_t)n, t, want, &found, st);
  char names[32];
  if (rc == 0 && found != want)
    rc = attn_status_set(st, ATTN_PROTO_EMISSING, "the reply holds %d of the %d tensors %s", found,
                         want, names_list(t, want, names, sizeof names));
  cJSON_Delete(h);
  return rc;
}

/* ---- JSON ------------------------------------------------------------------- */

/* The data array of tensor t into its buffer; null is -inf. */
static int json_data(const cJSON *j, const attn__out *t, attn_status *st) {
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
  if (!cJSON_IsArray(data))
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\" has no data array", t->name);
  size_t k = 0;
  for (const cJSON *x = data->child; x; x = x->next, k++) {
    if (k >= t->count || !(cJSON_IsNumber(x) || cJSON_IsNull(x)))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": element %zu is not a number or is one too many",
                             t->name, k);
    double v = cJSON_IsNull(x) ? -INFINITY : x->valuedouble;
    /* the text reads back to the dtype's value when rounded once */
    if (t->dtype == ATTN_F32) {
      ((float *)t->data)[k] = (float)v;
    } else {
      uint16_t u = t->dtype == ATTN_F16 ? attn_f64_to_f16(v) : attn_f64_to_bf16(v);
      memcpy((char *)t->data + 2 * k, &u, 2);
    }
  }
  if (k != t->count)
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\" has %zu numbers, expected %zu",
                           t->name, k, t->count);
  return 0;
}

/* Tensor i of the pass's list: required when i < want, refused when it
 * came unasked (a forward reply's statistics without stats). */
static int json_tensor(const cJSON *j, const attn__out *t, bool wanted, attn_status *st) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, t->name);
  if (!wanted)
    return x ? attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                               "unexpected tensor \"%s\" (the request did not ask for it)", t->name)
             : 0;
  if (!cJSON_IsObject(x))
    return attn_status_set(st, ATTN_PROTO_EMISSING, "tensor \"%s\" is missing", t->name);
  int rc;
  if ((rc = check_dtype(x, t, st)) < 0 || (rc = check_shape(x, t, st)) < 0)
    return rc;
  return json_data(x, t, st);
}

int attn_proto_decode_reply_json(const char *body, size_t len, attn_proto_req *pr, char *backend,
                                 size_t cap, attn_status *st) {
  cJSON *j = cJSON_ParseWithLength(body, len);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return attn_status_set(st, ATTN_PROTO_EJSON, "the reply is not a JSON object");
  }
  const cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backend");
  if (backend && cap && cJSON_IsString(be))
    snprintf(backend, cap, "%s", be->valuestring);
  attn__out t[ATTN__MAX_OUTS], w[ATTN__MAX_OUTS];
  int all = attn__reply_outs(pr, true, t), want = attn__reply_outs(pr, false, w), rc = 0;
  for (int i = 0; i < all && rc == 0; i++)
    rc = json_tensor(j, &t[i], i < want, st);
  cJSON_Delete(j);
  return rc;
}
