/*
 * move.c — a session made from another store's rows (kv.h,
 * attn_kv_import; export.c reads them out): checked as a create and a call
 * would check them, and written through the same page-at-a-time path as a
 * load (file.c), so a device's pages are written as theirs are.
 *
 * Locks. An import copies its rows without the store's lock, its session
 * made but its layers marked as being written (file.c, attn__kvf_install):
 * calls on it wait for the copy, calls on others go on.
 */
#include "check.h"
#include "file.h"

#include <stdlib.h>
#include <string.h>

/* Where the next span's rows come from in a tensor's buffer: a quantized
 * session's codes at r, and its scales at rs, after every code (kv.h):
 * joined into moved rows (codes, then the scale) on the way in. */
typedef struct mv_cursor {
  const char *r, *rs;
  int64_t cols; /* a quantized row's codes; 0 for a session not quantized */
} mv_cursor;

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

/* A cursor at the start of an import's buffer r of a layer's tensor t of
 * length rows. */
static mv_cursor cursor_at(const attn_kv_shape *sh, int t, const char *r, int64_t length) {
  const int64_t cols = sh->kv_quant ? attn__kv_cols(sh, t) : 0;
  const size_t codes = (size_t)(sh->heads_kv * length * cols);
  return (mv_cursor){r, r ? r + codes : NULL, cols};
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
  *mx =
      attn__absmax(p, sh->dtype, attn__kv_tensor_bytes(sh, length, t) / attn_dtype_size(sh->dtype));
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

/* A session's rows (not quantized) of KV head hk written from c straight
 * into its pages, a page's span at a time. */
static int rows_direct(attn_kv_store *s, kv_session *ks, int t, int64_t hk, kv_layer *L,
                       int64_t end, mv_cursor *c, attn_status *st) {
  const size_t row = attn__kv_xrow(&ks->shape, t);
  for (int64_t j = 0, n; j < end; j += n, c->r += (size_t)n * row) {
    n = attn__kv_span(ks, j, end);
    int rc = attn__kv_rows_put(s, ks, L, t, hk, j, n, c->r, st);
    if (rc)
      return rc;
  }
  return 0;
}

static int import_rows(attn_kv_store *s, kv_session *ks, void *arg, attn_status *st) {
  const mv_rows *r = arg;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int t = 0; t < attn__kv_tensors(&ks->shape); t++) {
      kv_layer *L = &ks->layers[l];
      mv_cursor c = cursor_at(&ks->shape, t, t ? r->v[l] : r->k[l], r->lengths[l]);
      for (int64_t hk = 0; hk < ks->shape.heads_kv; hk++) {
        /* a quantized row's codes and scale lie apart in the file: joined in r->page */
        int rc = c.cols
                     ? attn__kvf_rows_in(s, ks, L, t, hk, r->lengths[l], r->page, rows_from, &c, st)
                     : rows_direct(s, ks, t, hk, L, r->lengths[l], &c, st);
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
