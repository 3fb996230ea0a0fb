/*
 * pages.h — the sessions' page pool: one mapping of fixed-size pages.
 *
 * Internal to engine/kv/ (the store's files). The pool is reserved in
 * whole pages before any is taken: a session reserves the pages of its
 * max_tokens when it is made (a grow session: the pages of an append, as
 * the append is admitted), and its appends then take pages that are sure
 * to be there. The mapping is made without reserving swap
 * (MAP_NORESERVE): a page is memory only once a token is written to it.
 * Host pages free for about a second are given back to the kernel
 * (attn__kvpages_trim), so the memory of sessions deleted or expired
 * leaves the process; pages freed and taken again at once (a decode after
 * a truncate) are not, which would cost a fault and a zeroing each.
 * Not thread-safe: the store's lock guards it.
 */
#ifndef ATTN_KV_PAGES_H
#define ATTN_KV_PAGES_H

#include "backend.h" /* the backends' ops, and ATTN_KV_PAGE_BYTES */

typedef struct attn_kvpages {
  char *base;
  /* bytes of a page: ATTN_KV_PAGE_BYTES, or less for host pages
   * (attn_kv_open_paged); kept when the pool is closed or has no pages */
  size_t page_bytes;
  int64_t npages, nfree, reserved;
  int32_t *free;     /* a stack of free page numbers */
  double *freed;     /* [npages]: the clock when each entry of free was pushed */
  int64_t nclean;    /* free[0, nclean): pages holding no memory (never written, or trimmed) */
  double clock;      /* the latest trim's time, which a page given is stamped with */
  uint64_t returned; /* bytes given back to the kernel, in all */
  const attn_backend *dev; /* the backend whose device holds them; NULL: host memory */
  /* [npages]: the sessions' page tables that hold each page (forks share
   * pages: fork.c); a page is free again once the last lets it go. */
  int32_t *refs;
  int64_t nshared; /* pages held more than once */
  int64_t extra;   /* holds past each page's first: pages sharing saves */
} attn_kvpages;

/* A pool of bytes / page_bytes pages (0 pages: sessions are off), in
 * host memory, or (dev not NULL) in device memory that dev lends: then
 * EUNSUPPORTED when it lends none, or its error. A device finds a page's
 * number from its address with ATTN_KV_PAGE_BYTES: its pages are of that
 * size (the caller's to hold to). */
int attn__kvpages_open(attn_kvpages *p, uint64_t bytes, size_t page_bytes, attn_engine *dev,
                       attn_status *st);
/* Bytes of n pages of the pool. */
static inline uint64_t attn__kvpages_bytes(const attn_kvpages *p, int64_t n) {
  return (uint64_t)n * p->page_bytes;
}
/* rows rows of width bytes between host memory and the pool (either side),
 * pitches the bytes between rows: memcpy for host pages. */
int attn__kvpages_copy(const attn_kvpages *p, void *dst, size_t dpitch, const void *src,
                       size_t spitch, size_t width, size_t rows, attn_status *st);
void attn__kvpages_close(attn_kvpages *p);
/* Reserves n pages (false: they do not fit), or gives n back. */
bool attn__kvpages_reserve(attn_kvpages *p, int64_t n);
void attn__kvpages_unreserve(attn_kvpages *p, int64_t n);
/* A page out of a reservation (held once), and a hold let go of: the page
 * is back in the pool once its last holder lets it go. */
void *attn__kvpages_take(attn_kvpages *p);
void attn__kvpages_give(attn_kvpages *p, void *page);
/* One more holder of a page taken; how many hold it. */
void attn__kvpages_hold(attn_kvpages *p, void *page);
int32_t attn__kvpages_refs(const attn_kvpages *p, const void *page);
/* Gives the kernel back host pages free since ATTN_KV_TRIM_AGE_S before
 * now (madvise MADV_DONTNEED: the memory goes at once, and a page taken
 * later reads zeros), at most ATTN_KV_TRIM_BATCH of them a call, so one
 * call holds the store's lock briefly; called on the server's sweep. A
 * no-op for device pages. The age is five seconds, not one: a server that
 * deletes a session and imports the next (a replica taking a handover, a
 * client moving sessions one after another) copied a 1 GiB import into
 * fresh pages whenever its moves took over a second, 2.4 s against 0.7 s
 * with the freed pages still warm (Zen 5 VM). */
#define ATTN_KV_TRIM_AGE_S 5.0
#define ATTN_KV_TRIM_BATCH 1024
void attn__kvpages_trim(attn_kvpages *p, double now);

#endif
