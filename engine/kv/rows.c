/*
 * rows.c — a layer's pages and rows (kv_int.h): pages taken as a layer
 * grows (a grow session reserving them first), where a row lies, and rows
 * written into and read out of pages, host or device.
 */
#include "kv_int.h"

#include <stdlib.h>
#include <string.h>

int64_t attn__kv_grow_need(const kv_session *ks, const kv_layer *L, int64_t tokens) {
  const int64_t want = (tokens + ks->page_tokens - 1) / ks->page_tokens;
  if (!ks->shape.grow || want <= L->npages)
    return 0;
  return (want - L->npages) * ks->shape.heads_kv * attn__kv_tensors(&ks->shape);
}

/* A failed count of the tenant (out of memory for its entry) only leaves
 * it counting fewer pages than it holds; the pool's reservation is exact. */
bool attn__kv_grow(attn_kv_store *s, kv_session *ks, kv_layer *L, int64_t tokens) {
  const int64_t need = attn__kv_grow_need(ks, L, tokens);
  if (need > 0 && !attn__kvpages_reserve(&s->pages, need))
    return false;
  if (need > 0) {
    ks->reserved_pages += need;
    (void)attn__kv_tenant_add(s, ks->tenant, need);
  }
  /* what it writes, no longer shared: a memcpy of host pages, which cannot
   * fail; a device's slots were copied when the call was planned (admit.c) */
  attn_status st;
  (void)attn__kv_cow(s, ks, L, L->length, tokens, &st);
  int64_t want = (tokens + ks->page_tokens - 1) / ks->page_tokens;
  for (; L->npages < want; L->npages++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++) {
      int64_t i = h * ks->pages_per_head + L->npages;
      L->kp[i] = attn__kvpages_take(&s->pages);
      if (L->vp)
        L->vp[i] = attn__kvpages_take(&s->pages);
    }
  return true;
}

int attn__kv_dev_settled(const attn_kv_store *s, const kv_session *ks, const char *verb,
                         attn_status *st) {
  for (int64_t l = 0; s->pages.dev && l < ks->shape.layers; l++)
    if (ks->layers[l].readers > 0)
      return attn_status_set(st, ATTN_ESESSION_CONFLICT,
                             "session '%s' has calls running on layer %lld; %s it once they "
                             "have ended",
                             ks->id, (long long)l, verb);
  return 0;
}

char *attn__kv_row_at(const kv_session *ks, const kv_layer *L, int t, int64_t hk, int64_t j) {
  void **table = t && L->vp ? L->vp : L->kp;
  char *page = table[hk * ks->pages_per_head + j / ks->page_tokens];
  const size_t es = ks->shape.kv_quant ? 1 : attn_dtype_size(ks->shape.dtype);
  return page + (size_t)(j % ks->page_tokens) * (size_t)ks->pitch * es;
}

int64_t attn__kv_span(const kv_session *ks, int64_t j, int64_t end) {
  int64_t n = ks->page_tokens - j % ks->page_tokens;
  return n < end - j ? n : end - j;
}

/* n rows of `row` bytes, packed at src, as rows of `wide` bytes at dst:
 * the rest of each zero. */
static void rows_widen(char *dst, size_t wide, const char *src, size_t row, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    memcpy(dst + (size_t)i * wide, src + (size_t)i * row, row);
    memset(dst + (size_t)i * wide + row, 0, wide - row);
  }
}

/* A row's columns past its tensor's width are written too, as zeros: a
 * page taken again holds an earlier session's bytes there, and k's must
 * be zero where a padded q meets them (engine.h, k_pages). Host pages are
 * widened in place; a device's through a page's worth of host memory. */
int attn__kv_rows_put(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t j, int64_t n, const void *src, attn_status *st) {
  if (ks->shape.kv_quant) { /* host pages only (attn__kv_computable) */
    attn__kv_qput(ks, attn__kv_row_at(ks, L, t, hk, j - j % ks->page_tokens), j % ks->page_tokens,
                  n, t, src);
    return 0;
  }
  const size_t es = attn_dtype_size(ks->shape.dtype), pitch = (size_t)ks->pitch * es;
  const size_t row = (size_t)attn__kv_cols(&ks->shape, t) * es;
  char *dst = attn__kv_row_at(ks, L, t, hk, j);
  if (row == pitch)
    return attn__kvpages_copy(&s->pages, dst, pitch, src, row, row, (size_t)n, st);
  if (!s->pages.dev) {
    rows_widen(dst, pitch, src, row, n);
    return 0;
  }
  char *buf = malloc(ATTN_KV_PAGE_BYTES); /* n rows lie in one page */
  if (!buf)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory storing a session's rows");
  rows_widen(buf, pitch, src, row, n);
  int rc = attn__kvpages_copy(&s->pages, dst, pitch, buf, pitch, pitch, (size_t)n, st);
  free(buf);
  return rc;
}

int attn__kv_rows_get(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t j, int64_t n, void *dst, attn_status *st) {
  if (ks->shape.kv_quant) {
    attn__kv_qget(ks, attn__kv_row_at(ks, L, t, hk, j - j % ks->page_tokens), j % ks->page_tokens,
                  n, t, dst);
    return 0;
  }
  size_t es = attn_dtype_size(ks->shape.dtype), row = (size_t)attn__kv_cols(&ks->shape, t) * es;
  return attn__kvpages_copy(&s->pages, dst, row, attn__kv_row_at(ks, L, t, hk, j),
                            (size_t)ks->pitch * es, row, (size_t)n, st);
}
