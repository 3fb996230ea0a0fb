/*
 * pages.c — a session store's pages in device memory (the backend's
 * pages_open, pages_close and pages_copy ops), and a paged job's page
 * tables.
 *
 * The store (engine/kv/pages.c) keeps its free list and page tables on the
 * host as ever; only the pages' bytes live here, in one allocation on the
 * first healthy device, zeroed so that the padding columns of every row
 * (rows are dp elements: the kernels' packed layout) stay zero for good.
 * A call's job uploads its page numbers (int32, FlashAttention's
 * block_table) and its new rows beside q (attn_request.page_rows: a small
 * kernel on the job's stream puts them into their rows before the paged
 * kernel reads K and V where they lie); saves and loads, and a job's rows
 * whose job failed, and a fork's page copied before its first write into
 * it (engine/kv/share.c), move as synchronous copies (pages_copy). Jobs
 * with pages run on that device.
 */
#include "cuda_int.h"

#include <string.h>

int attn__cu_pages_open(cu_state *s, uint64_t bytes, void **base, attn_status *st) {
  cu_dev *d = NULL;
  for (int i = 0; i < s->ndev && !d; i++)
    d = s->devs[i].healthy ? &s->devs[i] : NULL;
  if (!d)
    return attn_status_set(st, ATTN_ENODEV, "cuda: no healthy device is left for session pages");
  if (s->pages_base)
    return attn_status_set(st, ATTN_EINVAL, "cuda: one session store per engine");
  if (*s->paged_why)
    return attn_status_set(st, ATTN_EDEVICE, "the paged kernels are off: %s", s->paged_why);
  cudaError_t e;
  void *p = NULL;
  if ((e = cudaSetDevice(d->ordinal)) || (e = cudaMalloc(&p, bytes)) ||
      (e = cudaMemset(p, 0, bytes))) {
    cudaGetLastError();
    if (p)
      cudaFree(p);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return attn_status_set(st, ATTN_ENOMEM,
                           "cuda device %d cannot hold %llu MiB of session pages (%zu MiB free "
                           "of %zu: %s); give --session-memory less",
                           d->ordinal, (unsigned long long)(bytes >> 20), fr >> 20, tot >> 20,
                           cudaGetErrorString(e));
  }
  s->pages_dev = d;
  s->pages_base = p;
  s->pages_bytes = bytes;
  *base = p;
  return 0;
}

void attn__cu_pages_close(cu_state *s, void *base) {
  if (!base || base != s->pages_base)
    return;
  cudaSetDevice(s->pages_dev->ordinal);
  cudaFree(base);
  s->pages_base = NULL;
  s->pages_dev = NULL;
}

static bool in_pages(const cu_state *s, const void *p) {
  const unsigned char *c = p;
  return s->pages_base && c >= s->pages_base && c < s->pages_base + s->pages_bytes;
}

/* Pages to pages. A device-to-device cudaMemcpy may return before the
 * copy is done, and the job that then reads the page runs on a stream of
 * its own: so the copy goes on the legacy stream and is waited for there.
 * The jobs' streams are non-blocking, so that wait is for this copy only,
 * not for other sessions' work. */
static cudaError_t copy_within(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t rows) {
  cudaError_t e =
      cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, 0);
  return e ? e : cudaStreamSynchronize(0);
}

int attn__cu_pages_copy(cu_state *s, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows, attn_status *st) {
  cu_dev *d = s->pages_dev;
  if (!d || !d->healthy)
    return attn_status_set(st, ATTN_EDEVICE, "cuda: the device holding the session pages %s",
                           d ? d->why : "is gone");
  const bool to = in_pages(s, dst), from = in_pages(s, src);
  cudaError_t e = cudaSetDevice(d->ordinal);
  if (!e && to && from) /* a fork's page copied on write: see copy_within */
    e = copy_within(dst, dpitch, src, spitch, width, rows);
  else if (!e)
    e = cudaMemcpy2D(dst, dpitch, src, spitch, width, rows,
                     to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (!e)
    return 0;
  cudaGetLastError();
  if (attn__cu_sticky(e))
    attn__cu_mark_unhealthy(d, "a session page copy", e);
  return attn__cu_fail(st, ATTN_EDEVICE, "copying session pages", e);
}

/* Whether every new row lies in a page of the pool, 16-byte aligned. */
static bool rows_fit(const cu_state *s, const attn_request *r) {
  const size_t rowb = (size_t)attn_cu_dp(r->head_dim) * attn_dtype_size(r->dtype);
  for (int64_t i = 0; i < r->npage_rows; i++) {
    const attn_page_rows *pr = &r->page_rows[i];
    const unsigned char *d = pr->dst;
    if (pr->n < 0 || !pr->src || !in_pages(s, d) || (size_t)(d - s->pages_base) % 16 ||
        (uint64_t)pr->n > (s->pages_base + s->pages_bytes - d) / rowb)
      return false;
  }
  return true;
}

int attn__cu_pages_check(const cu_state *s, const attn_request *r, attn_status *st) {
  if (!s->pages_base || !in_pages(s, r->k_pages[0]) || !in_pages(s, r->v_pages[0]))
    return attn_status_set(st, ATTN_EUNSUPPORTED, "cuda: these pages are not this device's");
  if (r->npage_rows && (!r->page_rows || r->cu_seqlens_q || !rows_fit(s, r)))
    return attn_status_set(st, ATTN_EINVAL,
                           "cuda: page_rows must lie in this device's pages, 16-byte aligned, "
                           "in a request without cu_seqlens");
  if (r->page_pitch != attn_cu_dp(r->head_dim))
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "cuda: pages must hold rows of %d elements (the padded head dim), not "
                           "%lld",
                           attn_cu_dp(r->head_dim), (long long)r->page_pitch);
  if (!s->pages_dev->healthy)
    return attn_status_set(st, ATTN_ENODEV, "cuda: the device holding the session pages %s",
                           s->pages_dev->why);
  return 0;
}

void attn__cu_page_tables(const cu_state *s, const attn_request *r, int32_t *kt, int32_t *vt) {
  size_t n = (size_t)(r->batch * r->heads_kv * r->pages_per_head);
  for (size_t i = 0; i < n; i++) { /* a page past a layer's last is never read: 0 */
    const unsigned char *k = r->k_pages[i], *v = r->v_pages[i];
    kt[i] = k ? (int32_t)((size_t)(k - s->pages_base) / ATTN_KV_PAGE_BYTES) : 0;
    vt[i] = v ? (int32_t)((size_t)(v - s->pages_base) / ATTN_KV_PAGE_BYTES) : 0;
  }
}
