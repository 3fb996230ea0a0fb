/*
 * shape.c — a session's shape in the store's pages (kv_int.h): the width
 * and pitch of its rows, the tokens a page holds, the pages it reserves,
 * and the checks a create's shape passes (its limits, and whether this
 * store and its backend can hold and compute it).
 */
#include "handle.h"
#include "kv_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t attn__kv_width(const attn_kv_shape *sh) {
  const int64_t dv = attn_kv_shape_dv(sh);
  return dv > sh->head_dim ? dv : sh->head_dim;
}

int attn__kv_tensors(const attn_kv_shape *sh) { return sh->v_from_k ? 1 : 2; }

int64_t attn__kv_pitch(const attn_kv_store *s, const attn_kv_shape *sh) {
  const int64_t w = attn__kv_width(sh);
  return s->pages.dev ? (w + KV_DEVICE_ALIGN - 1) / KV_DEVICE_ALIGN * KV_DEVICE_ALIGN : w;
}

int64_t attn__kv_tokens_fit(size_t page_bytes, int64_t row_bytes) {
  const int64_t n = (int64_t)page_bytes / row_bytes;
  const int64_t step = n >= ATTN_PAGE_ALIGN_TOKENS ? ATTN_PAGE_ALIGN_TOKENS : ATTN_PAGE_MIN_TOKENS;
  return n / step * step;
}

/* Bytes of one of a shape's rows in a page: a quantized row's codes and
 * scale, else W elements of its dtype (padded on a device). */
static int64_t row_bytes(const attn_kv_store *s, const attn_kv_shape *sh) {
  const int64_t w = attn__kv_pitch(s, sh);
  return sh->kv_quant ? w + (int64_t)sizeof(float) : w * (int64_t)attn_dtype_size(sh->dtype);
}

/* A quantized page's rows take a byte an element and their scales after
 * them (engine.h, attn_kv_quant_scales_at): the tokens that fit rows of
 * W + 4 bytes, fewer while the scales' alignment would pass the page. */
static int64_t page_tokens_at(const attn_kv_store *s, const attn_kv_shape *sh, size_t page_bytes) {
  int64_t pt = attn__kv_tokens_fit(page_bytes, row_bytes(s, sh));
  while (sh->kv_quant && pt > 0 &&
         attn_kv_quant_scales_at(pt, attn__kv_pitch(s, sh)) + (size_t)pt * sizeof(float) >
             page_bytes)
    pt -= ATTN_PAGE_MIN_TOKENS;
  return pt;
}

int64_t attn__kv_page_tokens(const attn_kv_store *s, const attn_kv_shape *sh) {
  return page_tokens_at(s, sh, s->pages.page_bytes);
}

int64_t attn__kv_pages_per_head(const attn_kv_store *s, const attn_kv_shape *sh) {
  int64_t pt = attn__kv_page_tokens(s, sh);
  return pt ? (sh->max_tokens + pt - 1) / pt : 0; /* 0: too wide, refused (attn__kv_computable) */
}

int64_t attn__kv_reserve_pages(const attn_kv_store *s, const attn_kv_shape *sh) {
  return sh->grow
             ? 0
             : attn__kv_tensors(sh) * sh->layers * sh->heads_kv * attn__kv_pages_per_head(s, sh);
}

uint64_t attn_kv_reserve_bytes(const attn_kv_store *s, const attn_kv_shape *sh) {
  return attn__kvpages_bytes(&s->pages, attn__kv_reserve_pages(s, sh));
}

/* head_dim_v (v as wide as k, head_dim_v 0, has that width for Dv's
 * limit too, as in a request), and a latent session's v within its k. */
static int dv_check(const attn_kv_shape *sh, attn_status *st) {
  if (sh->head_dim_v < 0 || attn_kv_shape_dv(sh) > ATTN_MAX_HEAD_DIM_V)
    return attn_status_set(st, ATTN_EINVAL,
                           "head_dim_v (v's last dimension) must be 1 to %d, not %lld; 0 takes "
                           "head_dim",
                           ATTN_MAX_HEAD_DIM_V, (long long)attn_kv_shape_dv(sh));
  if (sh->v_from_k && (sh->head_dim_v < 1 || sh->head_dim_v > sh->head_dim))
    return attn_status_set(st, ATTN_EINVAL,
                           "a latent session (v_from_k) takes v as the first head_dim_v columns "
                           "of k: head_dim_v must be 1 to head_dim %lld, not %lld",
                           (long long)sh->head_dim, (long long)sh->head_dim_v);
  return 0;
}

int attn__kv_shape_check(const attn_kv_shape *sh, attn_status *st) {
  if (sh->heads_kv < 1 || sh->heads_kv > 4096)
    return attn_status_set(st, ATTN_EINVAL, "heads_kv must be 1 to 4096, not %lld",
                           (long long)sh->heads_kv);
  if (sh->head_dim < 1 || sh->head_dim > ATTN_MAX_HEAD_DIM)
    return attn_status_set(st, ATTN_EINVAL, "head_dim must be 1 to %d, not %lld", ATTN_MAX_HEAD_DIM,
                           (long long)sh->head_dim);
  int rc = dv_check(sh, st);
  if (rc)
    return rc;
  if (attn_dtype_size(sh->dtype) == 0)
    return attn_status_set(st, ATTN_EDTYPE, "dtype must be F32, F16 or BF16");
  if ((unsigned)sh->kv_quant >= ATTN_KVQ_COUNT)
    return attn_status_set(st, ATTN_EDTYPE, "kv_dtype must be F8_E4M3, I8 or the dtype");
  if (sh->layers < 1 || sh->layers > ATTN_KV_MAX_LAYERS)
    return attn_status_set(st, ATTN_EINVAL, "layers must be 1 to %d, not %lld", ATTN_KV_MAX_LAYERS,
                           (long long)sh->layers);
  if (sh->max_tokens < 1 || sh->max_tokens > ((int64_t)1 << 30))
    return attn_status_set(st, ATTN_EINVAL, "max_tokens must be 1 to %lld, not %lld",
                           (long long)1 << 30, (long long)sh->max_tokens);
  return 0;
}

/* A shape whose rows fit no page of this store's size: refused, naming
 * the smallest page size that holds it, if any does. */
static int too_wide(const attn_kv_store *s, const attn_kv_shape *sh, attn_status *st) {
  size_t fits = s->pages.page_bytes * 2;
  while (fits <= ATTN_KV_PAGE_BYTES && page_tokens_at(s, sh, fits) == 0)
    fits *= 2;
  if (fits > ATTN_KV_PAGE_BYTES)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "a session page of %zu bytes holds fewer than %d rows of %lld bytes "
                           "(%lld %s elements: max(head_dim, head_dim_v), as this store pads "
                           "them): too wide for a session",
                           s->pages.page_bytes, ATTN_PAGE_MIN_TOKENS, (long long)row_bytes(s, sh),
                           (long long)attn__kv_pitch(s, sh),
                           sh->kv_quant ? "quantized" : attn_dtype_name(sh->dtype));
  return attn_status_set(st, ATTN_EUNSUPPORTED,
                         "rows of %lld bytes (%lld %s elements, max(head_dim, head_dim_v)) fit "
                         "fewer than %d to a session page of %zu bytes here: start attnd with "
                         "--session-page-bytes %zuK or more",
                         (long long)row_bytes(s, sh), (long long)attn__kv_pitch(s, sh),
                         sh->kv_quant ? "quantized" : attn_dtype_name(sh->dtype),
                         ATTN_PAGE_MIN_TOKENS, s->pages.page_bytes, fits >> 10);
}

/* A probe of a call of this shape, checked as the engine checks it, then
 * put to the backend that computes the store's calls as the job dv.c
 * makes of it (head dim W, the pages passed through): that backend must
 * take it, or sessions of this shape could be made whose every call
 * fails. A device's kernels reach a smaller head dim than the cpu's. */
int attn__kv_computable(attn_kv_store *s, const attn_kv_shape *sh, attn_status *st) {
  if (attn__kv_page_tokens(s, sh) == 0)
    return too_wide(s, sh, st);
  if (sh->kv_quant && s->pages.dev)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "this server keeps sessions on %s, whose kernels read no quantized "
                           "pages: kv_dtype %s is for sessions in host memory (--session-backend "
                           "cpu); leave kv_dtype out here",
                           s->pages.dev->ops.name, attn_kv_quant_name(sh->kv_quant));
  if (!s->engine || !s->pages.base)
    return 0; /* no pages: no session of any shape */
  static const float zeros[2 * KV_WIDEST];
  const void *page = s->pages.base;
  attn_request r;
  attn_request_init(&r);
  r.batch = r.heads_q = r.heads_kv = r.seq_q = r.seq_kv = 1;
  r.head_dim = sh->head_dim;
  r.head_dim_v = attn_kv_shape_dv(sh);
  r.dtype = sh->dtype;
  r.q = zeros;
  r.o = (void *)(uintptr_t)(zeros + KV_WIDEST); /* never written: only checked */
  r.k_pages = r.v_pages = &page;
  r.page_tokens = attn__kv_page_tokens(s, sh);
  r.pages_per_head = 1;
  r.page_pitch = s->pages.dev ? attn__kv_pitch(s, sh) : 0;
  r.kv_quant = sh->kv_quant;
  r.backend = s->pages.dev ? s->pages.dev->ops.name : "cpu";
  attn_status why;
  const attn_backend *be;
  int rc = attn_request_validate(&r, &why);
  r.head_dim = attn__kv_width(sh);
  r.head_dim_v = 0;
  if (rc == 0 && attn__engine_pick(s->engine, &r, &be, &why) == 0)
    return 0;
  return attn_status_set(st, ATTN_EUNSUPPORTED,
                         "this server computes sessions on %s, which cannot take head_dim %lld "
                         "with head_dim_v %lld (a head dim of %lld): %s",
                         r.backend, (long long)sh->head_dim, (long long)attn_kv_shape_dv(sh),
                         (long long)r.head_dim, why.message);
}
