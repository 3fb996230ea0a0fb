/*
 * session_file.c — a session as one safetensors file, the body of GET
 * /v1/sessions/{id}/export and PUT /v1/sessions/{id}/import (proto.h):
 * written from a store's export, and read back with every field, shape,
 * dtype and byte checked as a session call's tensors are (safetensors.c's
 * checks) and its metadata as a create's fields are (session_meta.c).
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensor t (0 k, 1 v) of layer l's name. */
static void tensor_name(char *buf, size_t cap, int t, int64_t l) {
  snprintf(buf, cap, "%c.%lld", t ? 'v' : 'k', (long long)l);
}

static int tensors_of(const attn_kv_shape *sh) { return sh->v_from_k ? 1 : 2; }

static int64_t cols_of(const attn_kv_shape *sh, int t) {
  return t ? attn_kv_shape_dv(sh) : sh->head_dim;
}

static void meta_put(attn_sbuf *b, const attn_kv_shape *sh, double ttl_s, const int64_t *lengths) {
  attn_sbuf_printf(b,
                   "{\"__metadata__\":{\"heads_kv\":\"%lld\",\"head_dim\":\"%lld\","
                   "\"head_dim_v\":\"%lld\",\"dtype\":\"%s\",\"layers\":\"%lld\","
                   "\"max_tokens\":\"%lld\",\"ttl_s\":\"%.17g\",",
                   (long long)sh->heads_kv, (long long)sh->head_dim,
                   (long long)attn_kv_shape_dv(sh), attn_dtype_name(sh->dtype),
                   (long long)sh->layers, (long long)sh->max_tokens, ttl_s);
  if (sh->v_from_k)
    attn_sbuf_printf(b, "\"v_from_k\":\"%lld\",", (long long)attn_kv_shape_dv(sh));
  if (sh->grow)
    attn_sbuf_puts(b, "\"reserve\":\"grow\",");
  attn_sbuf_puts(b, "\"lengths\":\"[");
  for (int64_t l = 0; l < sh->layers; l++)
    attn_sbuf_printf(b, "%s%lld", l ? "," : "", (long long)lengths[l]);
  attn_sbuf_puts(b, "]\"}");
}

int attn_proto_session_file_encode(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths,
                                   void *const *k, void *const *v, void **pbuf, size_t *plen,
                                   attn_status *st) {
  attn_sbuf b = {0};
  meta_put(&b, sh, ttl_s, lengths);
  const int nt = tensors_of(sh);
  const size_t es = attn_dtype_size(sh->dtype);
  size_t off = 0;
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < nt; t++) {
      char name[32], entry[256];
      int64_t shape[3] = {sh->heads_kv, lengths[l], cols_of(sh, t)};
      size_t n = (size_t)(shape[0] * shape[1] * shape[2]) * es;
      tensor_name(name, sizeof name, t, l);
      /* o 2: always the ',' first, the metadata before it */
      size_t w = attn__st_put_entry(entry, sizeof entry, 2, name, attn_dtype_name(sh->dtype), shape,
                                    3, off, off + n);
      attn_sbuf_printf(&b, "%.*s", (int)(w - 2), entry + 2);
      off += n;
    }
  attn_sbuf_puts(&b, "}");
  int rc = b.oom ? attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory writing a session file")
                 : attn__st_head(b.p, b.len, off, "session file", pbuf, plen, st);
  free(b.p);
  if (rc < 0)
    return rc;
  unsigned char *d = (unsigned char *)*pbuf + *plen;
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < nt; t++) {
      size_t n = (size_t)(sh->heads_kv * lengths[l] * cols_of(sh, t)) * es;
      if (n)
        memcpy(d, t ? v[l] : k[l], n);
      d += n;
    }
  *plen += off;
  return 0;
}

/* Entry c of the header: which tensor of the session it is (t, l), its
 * entry parsed into e[t][l]. */
static int file_entry(const cJSON *c, const attn_kv_shape *sh, uint64_t data_len, attn__st_entry *e,
                      attn_status *st) {
  char q[48], want[32];
  const char *name = c->string;
  char *end = NULL;
  const int t = name[0] == 'v', nt = tensors_of(sh);
  long long l =
      (name[0] == 'k' || name[0] == 'v') && name[1] == '.' && name[2] >= '0' && name[2] <= '9'
          ? strtoll(name + 2, &end, 10)
          : -1;
  if (end) /* the name as written: no sign, no leading zeros */
    tensor_name(want, sizeof want, t, l);
  if (!end || *end || l >= sh->layers || t >= nt || strcmp(want, name))
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "unknown tensor \"%s\"; a session file of %lld layers holds k.0 to "
                           "k.%lld%s",
                           attn_quote(q, sizeof q, name, strlen(name)), (long long)sh->layers,
                           (long long)sh->layers - 1,
                           nt == 2 ? " and v.0 to v.N" : " (a latent session has no v)");
  attn__st_entry *x = &e[(int64_t)t * sh->layers + l];
  if (x->seen)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "the header has the tensor \"%s\" twice",
                           name);
  x->seen = true;
  return attn__st_entry_parse(c, name, data_len, x, st);
}

/* Each tensor there, of its session's dtype and shape. */
static int file_shapes(const attn__st_entry *e, const attn_kv_shape *sh, const int64_t *lengths,
                       attn_status *st) {
  for (int t = 0; t < tensors_of(sh); t++)
    for (int64_t l = 0; l < sh->layers; l++) {
      const attn__st_entry *x = &e[(int64_t)t * sh->layers + l];
      char name[32];
      tensor_name(name, sizeof name, t, l);
      const int64_t want[3] = {sh->heads_kv, lengths[l], cols_of(sh, t)};
      if (!x->seen)
        return attn_status_set(st, ATTN_PROTO_EMISSING, "tensor \"%s\" is missing", name);
      if (x->dtype != sh->dtype)
        return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"%s\" is %s; the session is %s",
                               name, attn_dtype_name(x->dtype), attn_dtype_name(sh->dtype));
      if (x->rank != 3 || memcmp(x->shape, want, sizeof want))
        return attn_status_set(st, ATTN_PROTO_ESHAPE,
                               "tensor \"%s\" must be [heads_kv, length, %s] = [%lld, %lld, "
                               "%lld]",
                               name, t ? "head_dim_v" : "head_dim", (long long)want[0],
                               (long long)want[1], (long long)want[2]);
    }
  return 0;
}

/* The header's tensors against its metadata, and the data they tile. */
static int file_tensors(const cJSON *root, const unsigned char *data, uint64_t data_len,
                        attn_proto_session_file *f, attn_status *st) {
  const attn_kv_shape *sh = &f->shape;
  const int64_t n = (int64_t)tensors_of(sh) * sh->layers;
  attn__st_entry *e = calloc((size_t)n, sizeof *e);
  char(*nb)[32] = calloc((size_t)n, sizeof *nb);
  const char **names = calloc((size_t)n, sizeof *names);
  int rc = e && nb && names ? 0 : attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory");
  for (const cJSON *c = root->child; rc == 0 && c; c = c->next)
    if (strcmp(c->string, "__metadata__"))
      rc = file_entry(c, sh, data_len, e, st);
  rc = rc ? rc : file_shapes(e, sh, f->lengths, st);
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    tensor_name(nb[i], sizeof nb[i], i >= sh->layers, i % sh->layers);
    names[i] = nb[i];
  }
  rc = rc ? rc : attn__st_layout(e, names, (int)n, data_len, st);
  /* elements read where they are aligned, else from an aligned copy */
  bool aligned = (uintptr_t)data % attn_dtype_size(sh->dtype) == 0;
  if (rc == 0 && !aligned && !(f->owned = malloc(data_len + 1)))
    rc = attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory copying a session file");
  if (rc == 0 && !aligned)
    data = memcpy(f->owned, data, data_len);
  for (int64_t i = 0; rc == 0 && i < n; i++)
    (i < sh->layers ? f->k : f->v)[i % sh->layers] = data + e[i].begin;
  free(e);
  free(nb);
  free(names);
  return rc;
}

int attn_proto_session_file_decode(const void *body, size_t len, double ttl_max,
                                   attn_proto_session_file *f, attn_status *st) {
  cJSON *root = NULL;
  const unsigned char *data;
  uint64_t data_len;
  memset(f, 0, sizeof *f);
  int rc = attn__st_open(body, len, &root, &data, &data_len, st);
  if (rc < 0)
    return rc;
  rc = attn_proto_session_meta_decode(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"),
                                      ttl_max, &f->shape, &f->ttl_s, f->lengths, st);
  rc = rc ? rc : file_tensors(root, data, data_len, f, st);
  cJSON_Delete(root);
  if (rc)
    attn_proto_session_file_free(f);
  return rc;
}

void attn_proto_session_file_free(attn_proto_session_file *f) {
  free(f->owned);
  f->owned = NULL;
}
