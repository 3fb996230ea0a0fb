/*
 * reply_decode.c — the client's side of the reply codecs: a server's reply
 * read back into the output buffers of the request that was sent (json.c
 * and safetensors.c write replies).
 *
 * A reply comes from a server the client chose to trust, but it is still
 * bytes from a network: every length, offset, shape and count is checked
 * against what the request must produce before a byte is copied, and a
 * refusal names the tensor, so that whoever runs a client against a wrong or
 * foreign server learns which part of the reply is off. Replies are small
 * next to requests (o is q's size), so a cJSON tree is fine here.
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The four tensors a reply may hold; m, l, lse only when stats were asked. */
static const char *const reply_names[4] = {"o", "m", "l", "lse"};

static int wanted(const attn_proto_req *pr) { return pr->opts.stats ? 4 : 1; }

/* o has q's dtype, the statistics are F32. */
static attn_dtype want_dtype(const attn_proto_req *pr, int i) {
  return i == 0 ? pr->req.dtype : ATTN_F32;
}

/* Elements of reply tensor i: q's rows, times D for o. */
static size_t tensor_count(const attn_proto_req *pr, int i) {
  const attn_request *r = &pr->req;
  size_t rows = (size_t)(r->batch * r->heads_q * r->seq_q);
  return i == 0 ? rows * (size_t)r->head_dim : rows;
}

static void *tensor_dst(const attn_proto_req *pr, int i) {
  const attn_request *r = &pr->req;
  return i == 0 ? r->o : i == 1 ? (void *)r->m : i == 2 ? (void *)r->l : (void *)r->lse;
}

/* The dtype field of tensor i must name its dtype. */
static int check_dtype(const cJSON *t, const attn_proto_req *pr, int i, attn_status *st) {
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(t, "dtype");
  attn_dtype dt, want = want_dtype(pr, i);
  if (cJSON_IsString(jd) && attn_dtype_parse(jd->valuestring, &dt) == 0 && dt == want)
    return 0;
  return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"%s\" is not %s", reply_names[i],
                         attn_dtype_name(want));
}

/* The shape field of tensor i must be q's shape (less D for a statistic). */
static int check_shape(const cJSON *t, const attn_proto_req *pr, int i, attn_status *st) {
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
  int rank = i == 0 ? pr->rank : pr->rank - 1;
  const int64_t *want = pr->shape_q;
  bool ok = cJSON_IsArray(sh) && cJSON_GetArraySize(sh) == rank;
  for (int d = 0; ok && d < rank; d++) {
    const cJSON *x = cJSON_GetArrayItem(sh, d);
    ok = cJSON_IsNumber(x) && x->valuedouble == (double)want[d];
  }
  if (ok)
    return 0;
  char w[96];
  size_t o = (size_t)snprintf(w, sizeof w, "[");
  for (int d = 0; d < rank && o < sizeof w; d++)
    o += (size_t)snprintf(w + o, sizeof w - o, d ? ", %lld" : "%lld", (long long)want[d]);
  if (o < sizeof w)
    snprintf(w + o, sizeof w - o, "]");
  char *got = sh ? cJSON_PrintUnformatted(sh) : NULL;
  char q[96];
  int rc = attn_status_set(st, ATTN_PROTO_ESHAPE, "tensor \"%s\" has shape %s, expected %s",
                           reply_names[i],
                           got ? attn_quote(q, sizeof q, got, strlen(got)) : "(none)", w);
  cJSON_free(got);
  return rc;
}

/* ---- safetensors ---------------------------------------------------------- */

/* Entry e of the header (the tensor's name) into its place in pr; *found
 * counts the tensors seen. */
static int st_entry(const cJSON *e, const char *data, size_t dlen, attn_proto_req *pr, int *found,
                    attn_status *st) {
  int want = wanted(pr), i = 0;
  while (i < want && strcmp(e->string, reply_names[i]))
    i++;
  if (i == want) {
    char q[96];
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR, "unexpected tensor \"%s\"",
                           attn_quote(q, sizeof q, e->string, strlen(e->string)));
  }
  (*found)++;
  int rc;
  if ((rc = check_dtype(e, pr, i, st)) < 0 || (rc = check_shape(e, pr, i, st)) < 0)
    return rc;
  size_t bytes = tensor_count(pr, i) * attn_dtype_size(want_dtype(pr, i));
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  const cJSON *b0 = cJSON_GetArrayItem(off, 0), *b1 = cJSON_GetArrayItem(off, 1);
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !cJSON_IsNumber(b0) ||
      !cJSON_IsNumber(b1) || b0->valuedouble < 0 || b1->valuedouble > (double)dlen ||
      b1->valuedouble - b0->valuedouble != (double)bytes)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS,
                           "tensor \"%s\": data_offsets do not hold its %zu bytes within the "
                           "%zu bytes of data",
                           reply_names[i], bytes, dlen);
  /* memcpy: the reply buffer's alignment is the server's business */
  memcpy(tensor_dst(pr, i), data + (size_t)b0->valuedouble, bytes);
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
  int want = wanted(pr), found = 0, rc = 0;
  for (const cJSON *e = h->child; e && rc == 0; e = e->next)
    if (strcmp(e->string, "__metadata__"))
      rc = st_entry(e, body + 8 + n, len - 8 - (size_t)n, pr, &found, st);
  if (rc == 0 && found != want)
    rc = attn_status_set(st, ATTN_PROTO_EMISSING, "the reply holds %d of the %d tensors %s", found,
                         want, want == 4 ? "o, m, l, lse" : "o");
  cJSON_Delete(h);
  return rc;
}

/* ---- JSON ------------------------------------------------------------------- */

/* The data array of tensor i into its buffer; null is -inf. */
static int json_data(const cJSON *t, attn_proto_req *pr, int i, attn_status *st) {
  const char *name = reply_names[i];
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(t, "data");
  if (!cJSON_IsArray(data))
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\" has no data array", name);
  attn_dtype dt = want_dtype(pr, i);
  size_t count = tensor_count(pr, i), k = 0;
  void *dst = tensor_dst(pr, i);
  for (const cJSON *x = data->child; x; x = x->next, k++) {
    if (k >= count || !(cJSON_IsNumber(x) || cJSON_IsNull(x)))
      return attn_status_set(st, ATTN_PROTO_ETENSOR,
                             "tensor \"%s\": element %zu is not a number or is one too many", name,
                             k);
    double v = cJSON_IsNull(x) ? -INFINITY : x->valuedouble;
    /* the text reads back to the dtype's value when rounded once */
    if (dt == ATTN_F32) {
      ((float *)dst)[k] = (float)v;
    } else {
      uint16_t u = dt == ATTN_F16 ? attn_f64_to_f16(v) : attn_f64_to_bf16(v);
      memcpy((char *)dst + 2 * k, &u, 2);
    }
  }
  if (k != count)
    return attn_status_set(st, ATTN_PROTO_ETENSOR, "tensor \"%s\" has %zu numbers, expected %zu",
                           name, k, count);
  return 0;
}

static int json_tensor(const cJSON *j, attn_proto_req *pr, int i, attn_status *st) {
  const char *name = reply_names[i];
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, name);
  if (i >= wanted(pr))
    return t ? attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                               "unexpected tensor \"%s\" (stats were not asked for)", name)
             : 0;
  if (!cJSON_IsObject(t))
    return attn_status_set(st, ATTN_PROTO_EMISSING, "tensor \"%s\" is missing", name);
  int rc;
  if ((rc = check_dtype(t, pr, i, st)) < 0 || (rc = check_shape(t, pr, i, st)) < 0)
    return rc;
  return json_data(t, pr, i, st);
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
  int rc = 0;
  for (int i = 0; i < 4 && rc == 0; i++)
    rc = json_tensor(j, pr, i, st);
  cJSON_Delete(j);
  return rc;
}
