/*
 * move.c — a session moved between stores (kv.h, attn_kv_export and
 * attn_kv_import): its rows read out packed, one buffer per layer and
 * tensor, and a session made from such rows, checked as a create and a
 * call would check them. The rows move through the same page-at-a-time
 * paths as a save and a load (file.c), so a device's pages are read and
 * written as theirs are.
 *
 * Locks. Both hold the store's lock through their copying, as a save and
 * a load do: an export must see one state of the session, and an import
 * must not be seen half made.
 */
#include "check.h"
#include "file.h"

#include <stdlib.h>
#include <string.h>

/* Where the next span's rows go (an export's w) or come from (an
 * import's r) in a tensor's buffer; a quantized session's codes there,
 * and its scales at s, after every code (kv.h): its moved rows (codes,
 * then the scale) are split on the way out and joined on the way in. */
typedef struct mv_cursor {
  char *w, *ws;
  const char *r, *rs;
  int64_t cols; /* a quantized row's codes; 0 for a session not quantized */
} mv_cursor;

static int rows_to(void *arg, void *rows, int64_t j, int64_t n, size_t bytes, attn_status *st) {
  mv_cursor *c = arg;
  (void)j, (void)st;
  for (int64_t i = 0; c->cols && i < n; i++, c->w += c->cols, c->ws += sizeof(float)) {
    memcpy(c->w, (char *)rows + i * (c->cols + 4), (size_t)c->cols);
    memcpy(c->ws, (char *)rows + i * (c->cols + 4) + c->cols, sizeof(float));
  }
  if (!c->cols) {
    memcpy(c->w, rows, bytes);
    c->w += bytes;
  }
  return 0;
}

static int rows_from(void *arg, void *rows, int64_t j, int64_t n, size_t bytes, attn_status *st) {
  mv_cursor *c = arg;
  (void)j, (void)st;
  for (int64_t i = 0; c->cols && i < n; i++, c->r += c->cols, c->rs += sizeof(float)) {
    memcpy((char *)rows + i * (c->cols + 4), c->r, (size_t)c->cols);
    memcpy((char *)rows + i * (c->cols + 4) + c->cols, c->rs, sizeof(float));
  }
  if (!c->cols) {
    memcpy(rows, c->r, bytes);
    c->r += bytes;
  }
  return 0;
}

/* Bytes of layer l's K (t 0) or V (t 1): [heads_kv, length, cols] (and
 * a quantized session's scales, [heads_kv, length]). */
static size_t tensor_bytes(const attn_kv_shape *sh, int64_t length, int t) {
  return (size_t)sh->heads_kv * (size_t)length * attn__kv_xrow(sh, t);
}

/* A cursor at the start of an export's buffer w, or an import's r, of
 * a layer's tensor t of length rows. */
static mv_cursor cursor_at(const attn_kv_shape *sh, int t, char *w, const char *r, int64_t length) {
  const int64_t cols = sh->kv_quant ? attn__kv_cols(sh, t) : 0;
  const size_t codes = (size_t)(sh->heads_kv * length * cols);
  return (mv_cursor){w, w ? w + codes : NULL, r, r ? r + codes : NULL, cols};
}

/* Every layer's rows of ks into k[l] and v[l] (v NULL: a latent
 * session's), where place put them. */
static int export_rows(const attn_kv_store *s, const kv_session *ks, void *page, void *const *k,
                       void *const *v, attn_status *st) {
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int t = 0; t < attn__kv_tensors(&ks->shape); t++) {
      const kv_layer *L = &ks->layers[l];
      mv_cursor c = cursor_at(&ks->shape, t, t ? v[l] : k[l], NULL, L->length);
      for (int64_t hk = 0; hk < ks->shape.heads_kv; hk++) {
        int rc = attn__kvf_rows_out(s, ks, L, t, hk, L->length, page, rows_to, &c, st);
        if (rc)
          return rc;
      }
    }
  return 0;
}

/* On a device a call's rows reach their pages in its own job (kv_int.h):
 * until its readers end, a layer's length may run ahead of its pages. */
static int export_ready(const attn_kv_store *s, const kv_session *ks, attn_status *st) {
  for (int64_t l = 0; s->pages.dev && l < ks->shape.layers; l++)
    if (ks->layers[l].readers > 0)
      return attn_status_set(st, ATTN_ESESSION_CONFLICT,
                             "session '%s' has calls running on layer %lld; export it once "
                             "they have ended",
                             ks->id, (long long)l);
  return 0;
}

int attn_kv_export_into(attn_kv_store *s, const char *tenant, const char *id, double now,
                        attn_kv_place_fn place, void *arg, attn_status *st) {
  void *page = malloc(ATTN_KV_PAGE_BYTES);
  attn_kv_info info;
  int64_t lengths[ATTN_KV_MAX_LAYERS];
  void *k[ATTN_KV_MAX_LAYERS], *v[ATTN_KV_MAX_LAYERS];
  if (!page)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory exporting session '%s'", id);
  pthread_mutex_lock(&s->mu);
  const kv_session *ks = attn__kv_find(s, tenant, id, now);
  int rc = ks ? export_ready(s, ks, st)
              : attn_status_set(st, ATTN_ESESSION_NOT_FOUND,
                                "no session '%s': it was never made, was deleted, or expired", id);
  if (rc == 0) {
    attn__kv_info_of(s, ks, &info);
    for (int64_t l = 0; l < ks->shape.layers; l++)
      lengths[l] = ks->layers[l].length;
    if ((rc = place(&info, lengths, k, v, arg, st)) == 0)
      rc = export_rows(s, ks, page, k, ks->shape.v_from_k ? NULL : v, st);
  }
  pthread_mutex_unlock(&s->mu);
  free(page);
  return rc;
}

/* attn_kv_export's: its info and lengths out, and a buffer of its own for
 * each layer's k and v. */
typedef struct own_place {
  attn_kv_info *info;
  int64_t *lengths;
  void **k, **v;
} own_place;

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

static int place_own(const attn_kv_info *info, const int64_t *lengths, void **k, void **v,
                     void *arg, attn_status *st) {
  own_place *o = arg;
  const attn_kv_shape *sh = &info->shape;
  *o->info = *info;
  memcpy(o->lengths, lengths, (size_t)sh->layers * sizeof *lengths);
  for (int64_t l = 0; l < sh->layers; l++) {
    o->k[l] = NULL;
    if (o->v)
      o->v[l] = NULL;
  }
  for (int64_t l = 0; l < sh->layers; l++)
    for (int t = 0; t < attn__kv_tensors(sh); t++) {
      /* one byte at least: malloc(0) may be NULL */
      void *p = *(t ? &o->v[l] : &o->k[l]) = malloc(tensor_bytes(sh, lengths[l], t) + 1);
      if (!p) {
        buffers_free(sh->layers, o->k, o->v);
        return attn_status_set(st, ATTN_ENOMEM, "out of memory exporting session '%s'", info->id);
      }
      *(t ? &v[l] : &k[l]) = p;
    }
  return 0;
}

int attn_kv_export(attn_kv_store *s, const char *tenant, const char *id, double now,
                   attn_kv_info *info, int64_t *lengths, void **k, void **v, attn_status *st) {
  own_place o = {info, lengths, k, v};
  info->shape.layers = 0; /* nothing to free before place ran */
  int rc = attn_kv_export_into(s, tenant, id, now, place_own, &o, st);
  if (rc)
    buffers_free(info->shape.layers, k, v);
  return rc;
}

/* A quantized session's layer l's tensor t at p: each row one a quantizer
 * writes (quant.c), their bound into *mx. */
static int quant_check(const attn_kv_shape *sh, int64_t l, int t, const char *p, int64_t length,
                       float *mx, attn_status *st) {
  const int64_t rows = sh->heads_kv * length, cols = attn__kv_cols(sh, t);
  char row[KV_WIDEST + sizeof(float)];
  for (int64_t i = 0, bad; i < rows; i++) {
    memcpy(row, p + i * cols, (size_t)cols);
    memcpy(row + cols, p + rows * cols + i * (int64_t)sizeof(float), sizeof(float));
    const float m = attn__kv_xrows_absmax(sh, t, row, 1, &bad);
    if (m < 0)
      return attn_status_set(st, ATTN_EINVAL,
                             "layer %lld's %c, head %lld, row %lld is no %s row: its scale must "
                             "be finite and above 0, or 0 with codes all 0, and no code an "
                             "F8_E4M3 NaN (0x7F, 0xFF)",
                             (long long)l, t ? 'v' : 'k', (long long)(i / length),
                             (long long)(i % length), attn_kv_quant_name(sh->kv_quant));
    *mx = m > *mx ? m : *mx;
  }
  return 0;
}

/* Layer l's tensor t at p: finite (its largest |value| into *mx), as a
 * call's new rows are checked (admit.c). */
static int tensor_check(const attn_kv_shape *sh, int64_t l, int t, const void *p, int64_t length,
                        float *mx, attn_status *st) {
  *mx = 0;
  if (length == 0)
    return 0;
  if (!p)
    return attn_status_set(st, ATTN_EINVAL, "layer %lld's %c is missing", (long long)l,
                           t ? 'v' : 'k');
  if (sh->kv_quant)
    return quant_check(sh, l, t, p, length, mx, st);
  *mx = attn__absmax(p, sh->dtype, tensor_bytes(sh, length, t) / attn_dtype_size(sh->dtype));
  if (*mx < 0)
    return attn_status_set(st, ATTN_ENONFINITE,
                           "layer %lld's %c holds a non-finite value (NaN or Inf)", (long long)l,
                           t ? 'v' : 'k');
  return 0;
}

/* The header of the session to import: its fields checked as a create
 * checks them, its lengths and rows as a call's. */
static int import_header(attn_kv_store *s, kvf_header *h, const int64_t *lengths,
                         const void *const *k, const void *const *v, attn_status *st) {
  const attn_kv_shape *sh = &h->shape;
  int rc = attn__kv_shape_check(sh, st);
  rc = rc ? rc : attn__kv_computable(s, sh, st);
  if (rc == 0 && !(h->ttl_s > 0 && h->ttl_s <= 1e9))
    rc = attn_status_set(st, ATTN_EINVAL, "ttl_s must be a number of seconds above 0");
  if (rc == 0 && sh->v_from_k && v)
    rc = attn_status_set(st, ATTN_EINVAL,
                         "a latent session (v_from_k) stores no v: its values "
                         "are the first head_dim_v columns of k");
  for (int64_t l = 0; rc == 0 && l < sh->layers; l++) {
    h->length[l] = lengths[l];
    if (lengths[l] < 0 || lengths[l] > sh->max_tokens)
      return attn_status_set(st, ATTN_EINVAL,
                             "layer %lld's length (%lld) is not 0 to max_tokens "
                             "(%lld)",
                             (long long)l, (long long)lengths[l], (long long)sh->max_tokens);
    rc = tensor_check(sh, l, 0, k[l], lengths[l], &h->absmax[l][0], st);
    if (rc == 0 && sh->v_from_k)
      h->absmax[l][1] = h->absmax[l][0];
    else if (rc == 0)
      rc = tensor_check(sh, l, 1, v ? v[l] : NULL, lengths[l], &h->absmax[l][1], st);
  }
  return rc;
}

/* What an import fills its session from. */
typedef struct mv_rows {
  const int64_t *lengths;
  const void *const *k, *const *v;
  void *page;
} mv_rows;

static int import_rows(attn_kv_store *s, kv_session *ks, void *arg, attn_status *st) {
  const mv_rows *r = arg;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int t = 0; t < attn__kv_tensors(&ks->shape); t++) {
      mv_cursor c = cursor_at(&ks->shape, t, NULL, t ? r->v[l] : r->k[l], r->lengths[l]);
      for (int64_t hk = 0; hk < ks->shape.heads_kv; hk++) {
        int rc = attn__kvf_rows_in(s, ks, &ks->layers[l], t, hk, r->lengths[l], r->page, rows_from,
                                   &c, st);
        if (rc)
          return rc;
      }
    }
  return 0;
}

int attn_kv_import(attn_kv_store *s, const char *tenant, const char *id, const attn_kv_shape *sh,
                   double ttl_s, double now, const int64_t *lengths, const void *const *k,
                   const void *const *v, attn_status *st) {
  int rc = attn_kv_id_check(id, strlen(id), st);
  if (rc)
    return rc;
  if (!(sh->layers >= 1 && sh->layers <= ATTN_KV_MAX_LAYERS))
    return attn__kv_shape_check(sh, st); /* says what layers may be */
  kvf_header *h = calloc(1, sizeof *h);
  void *page = malloc(ATTN_KV_PAGE_BYTES);
  if (!h || !page) {
    free(h);
    free(page);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory importing session '%s'", id);
  }
  snprintf(h->tenant, sizeof h->tenant, "%s", tenant);
  snprintf(h->id, sizeof h->id, "%s", id);
  h->shape = *sh;
  h->ttl_s = h->left_s = ttl_s;
  rc = import_header(s, h, lengths, k, v, st);
  mv_rows r = {lengths, k, v, page};
  if (rc == 0)
    rc = attn__kvf_install(s, h, ttl_s, now, true, import_rows, &r, st);
  free(page);
  free(h);
  return rc;
}
