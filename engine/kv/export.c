/*
 * export.c — a session's rows read out in the order of its file (kv.h,
 * attn_kv_export_open), as the bytes are wanted: a server sends them from
 * the pages, in pieces, and never holds a copy of the session.
 *
 * An export counts as a reader of every layer from its open to its close,
 * as an admitted call does (kv_int.h): the rows below the lengths it saw
 * are neither freed nor overwritten until it closes, so it reads them
 * without the store's lock while calls go on. A delete or an expiry
 * leaves the session to it; an append that would overwrite what it reads
 * (after a truncate, or a copy on write of a fork's pages) waits for its
 * close.
 */
#include "file.h"

#include <stdlib.h>
#include <string.h>

struct attn_kv_exporter {
  attn_kv_store *s;
  kv_session *ks;
  int64_t lengths[ATTN_KV_MAX_LAYERS];
  /* The next rows: layer l's tensor t (0 k, 1 v), part (0 rows or codes,
   * 1 a quantized session's scales), KV head hk, from row j. */
  int64_t l, hk, j;
  int t, part;
  char *stage;          /* a span of rows that did not fit where it was wanted */
  size_t staged, taken; /* its bytes, and those handed out */
};

/* Under the lock: x reads every layer of ks below its length now. */
static void start_reading(attn_kv_exporter *x, kv_session *ks) {
  for (int64_t l = 0; l < ks->shape.layers; l++) {
    kv_layer *L = &ks->layers[l];
    x->lengths[l] = L->length;
    L->readers++;
    L->read_hi = L->length > L->read_hi ? L->length : L->read_hi;
    ks->readers++;
  }
  x->ks = ks;
}

int attn_kv_export_open(attn_kv_store *s, const char *tenant, const char *id, double now,
                        attn_kv_info *info, int64_t *lengths, attn_kv_exporter **out,
                        attn_status *st) {
  attn_kv_exporter *x = calloc(1, sizeof *x);
  char *stage = malloc(ATTN_KV_PAGE_BYTES);
  if (!x || !stage) {
    free(x);
    free(stage);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory exporting session '%s'", id);
  }
  x->s = s;
  x->stage = stage;
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, tenant, id, now);
  int rc = ks ? attn__kv_dev_settled(s, ks, "export", st)
              : attn_status_set(st, ATTN_ESESSION_NOT_FOUND,
                                "no session '%s': it was never made, was deleted, or expired", id);
  if (rc == 0) {
    attn__kv_info_of(s, ks, info);
    start_reading(x, ks);
  }
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    attn_kv_export_close(x);
    return rc;
  }
  memcpy(lengths, x->lengths, (size_t)info->shape.layers * sizeof *lengths);
  *out = x;
  return 0;
}

/* Past the part just read: the next head, part, tensor or layer; false
 * after the last layer. */
static bool advance(attn_kv_exporter *x) {
  const attn_kv_shape *sh = &x->ks->shape;
  if (x->j < x->lengths[x->l])
    return true;
  x->j = 0;
  if (++x->hk < sh->heads_kv && x->lengths[x->l] > 0)
    return true;
  x->hk = 0;
  if (++x->part < (sh->kv_quant ? 2 : 1))
    return true;
  x->part = 0;
  if (++x->t < attn__kv_tensors(sh))
    return true;
  x->t = 0;
  return ++x->l < sh->layers;
}

/* Bytes a row of the current part takes in the file. */
static size_t part_row(const attn_kv_exporter *x) {
  const attn_kv_shape *sh = &x->ks->shape;
  if (x->part)
    return sizeof(float);
  return (size_t)attn__kv_cols(sh, x->t) * (sh->kv_quant ? 1 : attn_dtype_size(sh->dtype));
}

/* n moved rows at p (codes then a scale each) packed to the part's bytes. */
static void pick_part(const attn_kv_exporter *x, char *p, int64_t n) {
  const size_t cols = (size_t)attn__kv_cols(&x->ks->shape, x->t), xrow = cols + sizeof(float);
  for (int64_t i = 0; i < n; i++)
    memmove(p + (size_t)i * part_row(x), p + (size_t)i * xrow + (x->part ? cols : 0), part_row(x));
}

/* The next span of rows into dst (up to cap bytes, at least a row's room)
 * or, when not a row fits there, into the stage; the bytes written. */
static int64_t next_span(attn_kv_exporter *x, char *dst, size_t cap, attn_status *st) {
  const kv_layer *L = &x->ks->layers[x->l];
  const size_t row = part_row(x);
  int64_t n = attn__kv_span(x->ks, x->j, x->lengths[x->l]);
  /* a quantized span is read as moved rows (codes and scale), wider than its part */
  const bool direct = !x->ks->shape.kv_quant && cap >= row;
  if (direct && (size_t)n * row > cap)
    n = (int64_t)(cap / row);
  char *to = direct ? dst : x->stage;
  if (attn__kv_rows_get(x->s, x->ks, L, x->t, x->hk, x->j, n, to, st))
    return -1;
  if (x->ks->shape.kv_quant)
    pick_part(x, to, n);
  x->j += n;
  if (!direct)
    x->staged = (size_t)n * row, x->taken = 0;
  return direct ? (int64_t)((size_t)n * row) : 0;
}

int64_t attn_kv_export_read(attn_kv_exporter *x, void *buf, size_t cap, attn_status *st) {
  char *out = buf;
  size_t got = 0;
  while (got < cap) {
    if (x->taken < x->staged) {
      size_t n = x->staged - x->taken < cap - got ? x->staged - x->taken : cap - got;
      memcpy(out + got, x->stage + x->taken, n);
      x->taken += n, got += n;
      continue;
    }
    if (x->l >= x->ks->shape.layers || !advance(x))
      break;
    if (x->lengths[x->l] == 0)
      continue;
    int64_t n = next_span(x, out + got, cap - got, st);
    if (n < 0)
      return -1;
    got += (size_t)n;
  }
  return (int64_t)got;
}

void attn_kv_export_close(attn_kv_exporter *x) {
  if (!x)
    return;
  if (x->ks)
    attn__kv_unread(x->s, x->ks);
  free(x->stage);
  free(x);
}

static void buffers_free(int64_t layers, void **k, void **v) {
  for (int64_t l = 0; l < layers; l++) {
    free(k[l]);
    k[l] = NULL;
    if (v) {
      free(v[l]);
      v[l] = NULL;
    }
  }
}

/* Each layer's k[l] and v[l] (v NULL: a latent session's), malloc'd and
 * read from x; 0, or -1 with st set (what it took freed). */
static int read_buffers(attn_kv_exporter *x, const attn_kv_info *info, const int64_t *lengths,
                        void **k, void **v, attn_status *st) {
  const attn_kv_shape *sh = &info->shape;
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < attn__kv_tensors(sh); t++) {
      const size_t n = attn__kv_tensor_bytes(sh, lengths[l], t);
      void *p = *(t ? &v[l] : &k[l]) = malloc(n + 1); /* malloc(0) may be NULL */
      if (!p)
        return attn_status_set(st, ATTN_ENOMEM, "out of memory exporting session '%s'", info->id);
      if (attn_kv_export_read(x, p, n, st) < 0)
        return -1;
    }
  return 0;
}

int attn_kv_export(attn_kv_store *s, const char *tenant, const char *id, double now,
                   attn_kv_info *info, int64_t *lengths, void **k, void **v, attn_status *st) {
  attn_kv_exporter *x;
  int rc = attn_kv_export_open(s, tenant, id, now, info, lengths, &x, st);
  if (rc)
    return rc;
  for (int64_t l = 0; l < info->shape.layers; l++) {
    k[l] = NULL;
    if (v)
      v[l] = NULL;
  }
  if (info->shape.v_from_k)
    v = NULL;
  rc = read_buffers(x, info, lengths, k, v, st);
  if (rc)
    buffers_free(info->shape.layers, k, v);
  attn_kv_export_close(x);
  return rc;
}
