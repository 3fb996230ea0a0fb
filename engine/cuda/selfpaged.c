/*
 * selfpaged.c — the start-up self-check of the paged view (kernels.h):
 * sessions whose pages live on the device are computed by the paged
 * forward instances only, so the forward cases of selfcheck.h run again
 * with their K and V in the pages of a scratch pool, laid out as a session
 * store lays them (rows padded to dp, pages in reverse order so that no
 * table is the identity), through the same job path as a session call.
 * Until every case passes on every device, attn__cu_pages_open refuses and
 * the store keeps its pages in host memory, with why; with the self-check
 * off the paged view stays off, as the Hopper instances do.
 */
#include "cuda_int.h"

#include "check.h"
#include "selfcheck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A case's scratch pool and its page tables. */
typedef struct scratch {
  unsigned char *pool;
  const void **kp, **vp;
} scratch;

static void scratch_free(scratch *x) {
  if (x->pool)
    cudaFree(x->pool);
  free(x->kp);
  free(x->vp);
  *x = (scratch){0};
}

/* Tokens a page holds, as the store lays out a device's pages. */
static int64_t page_tokens(const attn_request *r) {
  size_t row = (size_t)attn_cu_dp(r->head_dim) * attn_dtype_size(r->dtype);
  return (int64_t)(ATTN_KV_PAGE_BYTES / row) / ATTN_CU_PAGE_ALIGN_TOKENS *
         ATTN_CU_PAGE_ALIGN_TOKENS;
}

/* Page p of head hk of K (t 0) or V (t 1): rows copied in, table set. */
static cudaError_t fill_page(const attn_request *r, scratch *x, int t, int64_t hk, int64_t p,
                             int64_t pt, int64_t n) {
  const size_t es = attn_dtype_size(r->dtype), w = (size_t)r->head_dim * es;
  const int64_t pph = (r->seq_kv + pt - 1) / pt, i = hk * pph + p;
  unsigned char *page = x->pool + (size_t)(2 * n - 1 - (t * n + i)) * ATTN_KV_PAGE_BYTES;
  int64_t rows = r->seq_kv - p * pt < pt ? r->seq_kv - p * pt : pt;
  const char *src = (const char *)(t ? r->v : r->k) + (size_t)(hk * r->seq_kv + p * pt) * w;
  (t ? x->vp : x->kp)[i] = page;
  return cudaMemcpy2D(page, (size_t)attn_cu_dp(r->head_dim) * es, src, w, w, (size_t)rows,
                      cudaMemcpyHostToDevice);
}

/* The case's K and V into a zeroed scratch pool; r made paged. */
static cudaError_t page_case(attn_request *r, scratch *x) {
  const int64_t pt = page_tokens(r), pph = (r->seq_kv + pt - 1) / pt, n = r->heads_kv * pph;
  cudaError_t e;
  x->kp = calloc((size_t)n, sizeof *x->kp);
  x->vp = calloc((size_t)n, sizeof *x->vp);
  if (!x->kp || !x->vp)
    return cudaErrorMemoryAllocation;
  if ((e = cudaMalloc((void **)&x->pool, (size_t)(2 * n) * ATTN_KV_PAGE_BYTES)) ||
      (e = cudaMemset(x->pool, 0, (size_t)(2 * n) * ATTN_KV_PAGE_BYTES)))
    return e;
  for (int t = 0; t < 2; t++)
    for (int64_t i = 0; i < n; i++)
      if ((e = fill_page(r, x, t, i / pph, i % pph, pt, n)))
        return e;
  size_t nk = (size_t)(r->heads_kv * r->seq_kv * r->head_dim);
  r->kv_absmax[0] = attn__absmax(r->k, r->dtype, nk); /* the cases are finite */
  r->kv_absmax[1] = attn__absmax(r->v, r->dtype, nk);
  r->k = r->v = NULL;
  r->k_pages = x->kp, r->v_pages = x->vp;
  r->page_tokens = pt, r->pages_per_head = pph;
  r->page_pitch = attn_cu_dp(r->head_dim);
  return cudaSuccess;
}

/* Case c run paged on d's first slot, the scratch pool standing in for a
 * store's; 0, or why it failed in why. */
static int paged_case(cu_state *s, cu_dev *d, attn_cu_check *c, char *why, size_t cap) {
  scratch x = {0};
  attn_status st = {0};
  bool sticky;
  cudaError_t e = page_case(&c->req, &x);
  int rc = e ? attn__cu_fail(&st, ATTN_EDEVICE, "laying out a paged case", e) : 0;
  if (rc == 0) {
    s->pages_dev = d, s->pages_base = x.pool;
    s->pages_bytes = (size_t)(2 * c->req.heads_kv * c->req.pages_per_head) * ATTN_KV_PAGE_BYTES;
    rc = attn__cu_run_case(&d->slots[0], &c->req, s->off, &sticky, &st);
    s->pages_dev = NULL, s->pages_base = NULL, s->pages_bytes = 0;
  }
  cudaGetLastError();
  scratch_free(&x);
  if (rc < 0)
    snprintf(why, cap, "%.150s", st.message);
  else if (!attn_cu_check_verify(c, why, cap))
    rc = ATTN_EDEVICE;
  return rc;
}

void attn__cu_self_check_paged(cu_state *s, cu_dev *d) {
  for (int i = 0; i < attn_cu_check_count() && d->healthy && !*s->paged_why; i++) {
    attn_cu_check c;
    attn_status st = {0};
    if (attn_cu_check_is_hopper(i) || attn_cu_check_make(i, &c, &st) < 0)
      continue;
    char why[160];
    if (c.req.pass == ATTN_FORWARD && paged_case(s, d, &c, why, sizeof why) != 0) {
      snprintf(s->paged_why, sizeof s->paged_why, "device %d: %.140s", d->ordinal, why);
      fprintf(stderr,
              "attn: cuda device %d (%s): the paged kernels failed their self-check (%s); "
              "sessions keep their pages in host memory\n",
              d->ordinal, d->name, why);
    }
    attn_cu_check_free(&c);
  }
}
