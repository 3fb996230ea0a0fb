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

/* Tensor t (0 k, 1 v) of layer l's name: its rows' (s 0), or a
 * quantized session's scales of them (s 1). */
static void tensor_name(char *buf, size_t cap, int t, int s, int64_t l) {
  snprintf(buf, cap, "%c%s.%lld", t ? 'v' : 'k', s ? "_scale" : "", (long long)l);
}

static int tensors_of(const attn_kv_shape *sh) { return sh->v_from_k ? 1 : 2; }
/* Tensors a layer's k or v is: its rows, and a quantized session's scales. */
static int parts_of(const attn_kv_shape *sh) { return sh->kv_quant ? 2 : 1; }

static int64_t cols_of(const attn_kv_shape *sh, int t) {
  return t ? attn_kv_shape_dv(sh) : sh->head_dim;
}

/* The dtype's name of a layer tensor's part s, its element bytes, and its
 * shape's rank: rows [heads_kv, length, cols] of the dtype or kv_dtype,
 * scales [heads_kv, length] of F32. */
static const char *part_dtype(const attn_kv_shape *sh, int s) {
  return s ? "F32" : attn_kv_shape_kv_dtype(sh);
}
static size_t part_es(const attn_kv_shape *sh, int s) {
  return s ? sizeof(float) : sh->kv_quant ? 1 : attn_dtype_size(sh->dtype);
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
  if (sh->kv_quant)
    attn_sbuf_printf(b, "\"kv_dtype\":\"%s\",", attn_kv_quant_name(sh->kv_quant));
  attn_sbuf_puts(b, "\"lengths\":\"[");
  for (int64_t l = 0; l < sh->layers; l++)
    attn_sbuf_printf(b, "%s%lld", l ? "," : "", (long long)lengths[l]);
  attn_sbuf_puts(b, "]\"}");
}

/* Bytes of layer l's k (t 0) or v (t 1) in the file: its rows, and a
 * quantized session's scales after them (one buffer of kv.h's export). */
static size_t layer_bytes(const attn_kv_shape *sh, int64_t length, int t) {
  const size_t rows = (size_t)(sh->heads_kv * length);
  return rows * (size_t)cols_of(sh, t) * part_es(sh, 0) + (sh->kv_quant ? rows * 4 : 0);
}

/* The file's header JSON into b (b->oom when out of memory); the bytes
 * of data after it. */
static size_t head_json(attn_sbuf *b, const attn_kv_shape *sh, double ttl_s,
                        const int64_t *lengths) {
  meta_put(b, sh, ttl_s, lengths);
  size_t off = 0;
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < tensors_of(sh); t++)
      for (int s = 0; s < parts_of(sh); s++) { /* a quantized k.L's scales follow it */
        char name[32], entry[256];
        int64_t shape[3] = {sh->heads_kv, lengths[l], s ? 1 : cols_of(sh, t)};
        size_t n = (size_t)(shape[0] * shape[1] * shape[2]) * part_es(sh, s);
        tensor_name(name, sizeof name, t, s, l);
        /* o 2: always the ',' first, the metadata before it */
        size_t w = attn__st_put_entry(entry, sizeof entry, 2, name, part_dtype(sh, s), shape,
                                      s ? 2 : 3, off, off + n);
        attn_sbuf_printf(b, "%.*s", (int)(w - 2), entry + 2);
        off += n;
      }
  attn_sbuf_puts(b, "}");
  return off;
}

/* The file's header, in a buffer with room for extra bytes after it. */
static int head_alloc(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths, bool whole,
                      void **pbuf, size_t *plen, size_t *pdata, attn_status *st) {
  attn_sbuf b = {0};
  const size_t off = head_json(&b, sh, ttl_s, lengths);
  int rc = b.oom ? attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory writing a session file")
                 : attn__st_head(b.p, b.len, whole ? off : 0, "session file", pbuf, plen, st);
  free(b.p);
  *pdata = off;
  return rc;
}

int attn_proto_session_file_head(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths,
                                 void **phead, size_t *plen, size_t *pdata, attn_status *st) {
  return head_alloc(sh, ttl_s, lengths, false, phead, plen, pdata, st);
}

int attn_proto_session_file_encode(const attn_kv_shape *sh, double ttl_s, const int64_t *lengths,
                                   void *const *k, void *const *v, void **pbuf, size_t *plen,
                                   attn_status *st) {
  size_t data;
  int rc = head_alloc(sh, ttl_s, lengths, true, pbuf, plen, &data, st);
  unsigned char *d = rc < 0 ? NULL : (unsigned char *)*pbuf + *plen;
  for (int64_t l = 0; rc == 0 && l < sh->layers; l++)
    for (int t = 0; t < tensors_of(sh); t++) {
      size_t n = layer_bytes(sh, lengths[l], t);
      if (n)
        memcpy(d, t ? v[l] : k[l], n);
      d += n;
    }
  if (rc == 0)
    *plen += data;
  return rc;
}

/* The index of layer l's tensor t, part s, among a file's entries. */
static int64_t entry_index(const attn_kv_shape *sh, int t, int s, int64_t l) {
  return ((int64_t)t * parts_of(sh) + s) * sh->layers + l;
}

/* Which tensor of the session name is (t, s, l); false for none. */
static bool name_parse(const char *name, const attn_kv_shape *sh, int *t, int *s, int64_t *l) {
  char want[40], *end = NULL;
  *t = name[0] == 'v';
  *s = !strncmp(name + 1, "_scale.", 7);
  const char *num = name + (*s ? 8 : 2);
  if ((name[0] != 'k' && name[0] != 'v') || (!*s && name[1] != '.') || *num < '0' || *num > '9')
    return false;
  long long x = strtoll(num, &end, 10);
  *l = x;
  tensor_name(want, sizeof want, *t, *s, x); /* the name as written: no sign, no leading zeros */
  return !*end && x < sh->layers && *t < tensors_of(sh) && *s < parts_of(sh) && !strcmp(want, name);
}

/* Entry c of the header: which tensor of the session it is, its entry
 * parsed into e. */
static int file_entry(const cJSON *c, const attn_kv_shape *sh, uint64_t data_len, attn__st_entry *e,
                      attn_status *st) {
  char q[48];
  const char *name = c->string;
  int t, s;
  int64_t l;
  if (!name_parse(name, sh, &t, &s, &l))
    return attn_status_set(st, ATTN_PROTO_EUNKNOWNTENSOR,
                           "unknown tensor \"%s\"; a session file of %lld layers holds k.0 to "
                           "k.%lld%s%s",
                           attn_quote(q, sizeof q, name, strlen(name)), (long long)sh->layers,
                           (long long)sh->layers - 1,
                           tensors_of(sh) == 2 ? " and v.0 to v.N" : " (a latent session has no v)",
                           sh->kv_quant ? ", each with its k_scale.L (v_scale.L)" : "");
  attn__st_entry *x = &e[entry_index(sh, t, s, l)];
  if (x->seen)
    return attn_status_set(st, ATTN_PROTO_ESAFETENSORS, "the header has the tensor \"%s\" twice",
                           name);
  x->seen = true;
  x->quant_ok = true;
  return attn__st_entry_parse(c, name, data_len, x, st);
}

/* Entry x, tensor t's part s of layer l, of its dtype and shape. */
static int part_shape(const attn__st_entry *x, const attn_kv_shape *sh, int t, int s, int64_t l,
                      int64_t length, attn_status *st) {
  char name[40];
  tensor_name(name, sizeof name, t, s, l);
  const int64_t want[3] = {sh->heads_kv, length, cols_of(sh, t)};
  const int rank = s ? 2 : 3;
  const bool f32 = !x->quant && x->dtype == ATTN_F32;
  if (!x->seen)
    return attn_status_set(st, ATTN_PROTO_EMISSING, "tensor \"%s\" is missing", name);
  if (s ? !f32 : x->quant != sh->kv_quant || (!sh->kv_quant && x->dtype != sh->dtype))
    return attn_status_set(st, ATTN_PROTO_EDTYPE, "tensor \"%s\" is %s; the session's is %s", name,
                           x->quant ? attn_kv_quant_name(x->quant) : attn_dtype_name(x->dtype),
                           part_dtype(sh, s));
  if (x->rank != rank || memcmp(x->shape, want, (size_t)rank * sizeof *want))
    return s ? attn_status_set(st, ATTN_PROTO_ESHAPE,
                               "tensor \"%s\" must be [heads_kv, length] = [%lld, %lld]", name,
                               (long long)want[0], (long long)want[1])
             : attn_status_set(st, ATTN_PROTO_ESHAPE,
                               "tensor \"%s\" must be [heads_kv, length, %s] = [%lld, %lld, %lld]",
                               name, t ? "head_dim_v" : "head_dim", (long long)want[0],
                               (long long)want[1], (long long)want[2]);
  return 0;
}

/* Each tensor there, of its session's dtype and shape. */
static int file_shapes(const attn__st_entry *e, const attn_kv_shape *sh, const int64_t *lengths,
                       attn_status *st) {
  for (int t = 0; t < tensors_of(sh); t++)
    for (int s = 0; s < parts_of(sh); s++)
      for (int64_t l = 0; l < sh->layers; l++) {
        int rc = part_shape(&e[entry_index(sh, t, s, l)], sh, t, s, l, lengths[l], st);
        if (rc)
          return rc;
      }
  return 0;
}

/* A quantized session's rows as an import takes them (kv.h): per layer
 * and tensor its codes, then its scales, in one buffer f->owned. */
static int quant_join(const attn__st_entry *e, const unsigned char *data, uint64_t data_len,
                      attn_proto_session_file *f, attn_status *st) {
  const attn_kv_shape *sh = &f->shape;
  unsigned char *w = f->owned = malloc(data_len + 1);
  if (!w)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory copying a session file");
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < tensors_of(sh); t++) {
      (t ? f->v : f->k)[l] = w;
      for (int s = 0; s < 2; s++) {
        const attn__st_entry *x = &e[entry_index(sh, t, s, l)];
        memcpy(w, data + x->begin, (size_t)(x->end - x->begin));
        w += x->end - x->begin;
      }
    }
  return 0;
}

/* The header's tensors against its metadata, and the data they tile. */
static int file_tensors(const cJSON *root, const unsigned char *data, uint64_t data_len,
                        attn_proto_session_file *f, attn_status *st) {
  const attn_kv_shape *sh = &f->shape;
  const int64_t n = (int64_t)tensors_of(sh) * parts_of(sh) * sh->layers;
  attn__st_entry *e = calloc((size_t)n, sizeof *e);
  char(*nb)[40] = calloc((size_t)n, sizeof *nb);
  const char **names = calloc((size_t)n, sizeof *names);
  int rc = e && nb && names ? 0 : attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory");
  for (const cJSON *c = root->child; rc == 0 && c; c = c->next)
    if (strcmp(c->string, "__metadata__"))
      rc = file_entry(c, sh, data_len, e, st);
  rc = rc ? rc : file_shapes(e, sh, f->lengths, st);
  for (int64_t i = 0; rc == 0 && i < n; i++) {
    const int64_t ts = i / sh->layers;
    tensor_name(nb[i], sizeof nb[i], (int)(ts / parts_of(sh)), (int)(ts % parts_of(sh)),
                i % sh->layers);
    names[i] = nb[i];
  }
  rc = rc ? rc : attn__st_layout(e, names, (int)n, data_len, st);
  if (rc == 0 && sh->kv_quant)
    rc = quant_join(e, data, data_len, f, st);
  /* elements read where they are aligned, else from an aligned copy */
  bool aligned = (uintptr_t)data % attn_dtype_size(sh->dtype) == 0;
  if (rc == 0 && !sh->kv_quant && !aligned && !(f->owned = malloc(data_len + 1)))
    rc = attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory copying a session file");
  if (rc == 0 && !sh->kv_quant && !aligned)
    data = memcpy(f->owned, data, data_len);
  for (int64_t i = 0; rc == 0 && !sh->kv_quant && i < n; i++)
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
