/*
 * pages.c — the sessions' page pool (pages.h).
 */
#include "pages.h"
#include "handle.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The free list of n pages, lowest first: the memory fills from its start. */
static int free_list(attn_kvpages *p, int64_t n) {
  p->free = malloc((size_t)n * sizeof *p->free);
  p->freed = calloc((size_t)n, sizeof *p->freed);
  p->refs = calloc((size_t)n, sizeof *p->refs);
  if (!p->free || !p->freed || !p->refs) {
    free(p->free);
    free(p->freed);
    free(p->refs);
    return -1;
  }
  p->npages = p->nfree = p->nclean = n;
  for (int64_t i = 0; i < n; i++)
    p->free[i] = (int32_t)(n - 1 - i);
  return 0;
}

static int open_on_device(attn_kvpages *p, int64_t n, attn_engine *e, attn_status *st) {
  void *base = NULL;
  int rc = attn__engine_pages_open(e, attn__kvpages_bytes(p, n), &p->dev, &base, st);
  if (rc)
    return rc;
  if (free_list(p, n) < 0) {
    p->dev->ops.pages_close(p->dev->state, base);
    p->dev = NULL;
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for the session pages' free list");
  }
  p->base = base;
  return 0;
}

int attn__kvpages_open(attn_kvpages *p, uint64_t bytes, size_t page_bytes, attn_engine *dev,
                       attn_status *st) {
  *p = (attn_kvpages){.page_bytes = page_bytes};
  int64_t n = (int64_t)(bytes / page_bytes);
  if (n > INT32_MAX)
    return attn_status_set(st, ATTN_EINVAL,
                           "session memory of %llu bytes is more than this server can page "
                           "(at most %lld pages of %zu bytes)",
                           (unsigned long long)bytes, (long long)INT32_MAX, page_bytes);
  if (n == 0)
    return 0;
  if (dev)
    return open_on_device(p, n, dev, st);
  void *m = mmap(NULL, (size_t)attn__kvpages_bytes(p, n), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED || free_list(p, n) < 0) {
    if (m != MAP_FAILED)
      munmap(m, (size_t)attn__kvpages_bytes(p, n));
    *p = (attn_kvpages){.page_bytes = page_bytes};
    return attn_status_set(st, ATTN_ENOMEM, "cannot map %llu bytes of session memory",
                           (unsigned long long)bytes);
  }
  p->base = m;
  return 0;
}

void attn__kvpages_close(attn_kvpages *p) {
  if (p->base && p->dev)
    p->dev->ops.pages_close(p->dev->state, p->base);
  else if (p->base)
    munmap(p->base, (size_t)attn__kvpages_bytes(p, p->npages));
  free(p->free);
  free(p->freed);
  free(p->refs);
  const size_t page_bytes = p->page_bytes;
  *p = (attn_kvpages){.page_bytes = page_bytes};
}

int attn__kvpages_copy(const attn_kvpages *p, void *dst, size_t dpitch, const void *src,
                       size_t spitch, size_t width, size_t rows, attn_status *st) {
  if (p->dev)
    return p->dev->ops.pages_copy(p->dev->state, dst, dpitch, src, spitch, width, rows, st);
  if (dpitch == width && spitch == width) {
    memcpy(dst, src, width * rows);
    return 0;
  }
  for (size_t r = 0; r < rows; r++)
    memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return 0;
}

bool attn__kvpages_reserve(attn_kvpages *p, int64_t n) {
  if (n > p->npages - p->reserved)
    return false;
  p->reserved += n;
  return true;
}

void attn__kvpages_unreserve(attn_kvpages *p, int64_t n) { p->reserved -= n; }

void *attn__kvpages_take(attn_kvpages *p) {
  if (p->nfree == 0) /* not reached: every take is within a reservation */
    abort();
  const int32_t n = p->free[--p->nfree];
  if (p->nclean > p->nfree)
    p->nclean = p->nfree;
  p->refs[n] = 1;
  return p->base + (size_t)n * p->page_bytes;
}

static int32_t page_number(const attn_kvpages *p, const void *page) {
  return (int32_t)(((const char *)page - p->base) / (ptrdiff_t)p->page_bytes);
}

void attn__kvpages_give(attn_kvpages *p, void *page) {
  const int32_t n = page_number(p, page);
  if (--p->refs[n] > 0) {
    p->extra--;
    p->nshared -= p->refs[n] == 1;
    return;
  }
  p->freed[p->nfree] = p->clock;
  p->free[p->nfree++] = n;
}

void attn__kvpages_hold(attn_kvpages *p, void *page) {
  const int32_t n = page_number(p, page);
  p->nshared += p->refs[n] == 1;
  p->refs[n]++;
  p->extra++;
}

int32_t attn__kvpages_refs(const attn_kvpages *p, const void *page) {
  return p->refs[page_number(p, page)];
}

/* The free stack's entries were pushed in the order of their stamps, so
 * the pages free longest lie just above the clean ones: a trim walks up
 * from nclean and stops at the first page freed too recently. Pages
 * given in a row are mostly consecutive (a session's, freed in the order
 * taken), so runs of them go to the kernel in one call. */
void attn__kvpages_trim(attn_kvpages *p, double now) {
  p->clock = now;
  if (p->dev || !p->base)
    return;
  int64_t end = p->nclean;
  while (end < p->nfree && end - p->nclean < ATTN_KV_TRIM_BATCH &&
         p->freed[end] <= now - ATTN_KV_TRIM_AGE_S)
    end++;
  for (int64_t i = p->nclean, j; i < end; i = j) {
    for (j = i + 1; j < end && p->free[j] == p->free[j - 1] + 1;)
      j++;
    /* cannot fail on a private anonymous mapping of ours; were it to, the
     * pages would only stay resident */
    madvise(p->base + (size_t)p->free[i] * p->page_bytes, (size_t)attn__kvpages_bytes(p, j - i),
            MADV_DONTNEED);
    p->returned += attn__kvpages_bytes(p, j - i);
  }
  p->nclean = end;
}
