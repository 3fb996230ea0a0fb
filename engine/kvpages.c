/*
 * kvpages.c — the sessions' page pool (kvpages.h).
 */
#include "kvpages.h"

#include <stdlib.h>
#include <sys/mman.h>

int attn__kvpages_open(attn_kvpages *p, uint64_t bytes, attn_status *st) {
  *p = (attn_kvpages){0};
  int64_t n = (int64_t)(bytes / ATTN_KV_PAGE_BYTES);
  if (n > INT32_MAX)
    return attn_status_set(st, ATTN_EINVAL,
                           "session memory of %llu bytes is more than this server can page "
                           "(at most %lld pages of %zu bytes)",
                           (unsigned long long)bytes, (long long)INT32_MAX, ATTN_KV_PAGE_BYTES);
  if (n == 0)
    return 0;
  void *m = mmap(NULL, (size_t)n * ATTN_KV_PAGE_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  p->free = malloc((size_t)n * sizeof *p->free);
  if (m == MAP_FAILED || !p->free) {
    if (m != MAP_FAILED)
      munmap(m, (size_t)n * ATTN_KV_PAGE_BYTES);
    free(p->free);
    p->free = NULL;
    return attn_status_set(st, ATTN_ENOMEM, "cannot map %llu bytes of session memory",
                           (unsigned long long)bytes);
  }
  p->base = m;
  p->npages = p->nfree = n;
  for (int64_t i = 0; i < n; i++) /* lowest pages first: the mapping fills from its start */
    p->free[i] = (int32_t)(n - 1 - i);
  return 0;
}

void attn__kvpages_close(attn_kvpages *p) {
  if (p->base)
    munmap(p->base, (size_t)p->npages * ATTN_KV_PAGE_BYTES);
  free(p->free);
  *p = (attn_kvpages){0};
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
  return p->base + (size_t)p->free[--p->nfree] * ATTN_KV_PAGE_BYTES;
}

void attn__kvpages_give(attn_kvpages *p, void *page) {
  p->free[p->nfree++] = (int32_t)(((char *)page - p->base) / (ptrdiff_t)ATTN_KV_PAGE_BYTES);
}
