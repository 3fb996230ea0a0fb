/*
 * pinned.c — the cuda backend's pool of page-locked host memory, lent to
 * callers for request bodies and replies (attn_engine_host_alloc).
 *
 * A copy between the device and pageable memory is staged by the driver
 * (or by us, packing into a pinned buffer) at a fraction of the link's
 * rate; from page-locked memory it is one DMA. Pinning is slow (the
 * kernel locks every page: a few milliseconds per 100 MiB), so blocks
 * given back stay pinned for the next caller of about their size, until
 * the pool needs their room or they sit idle for IDLE_SECONDS. The cap
 * (attn_config.cuda_pinned_bytes) bounds what is page-locked, idle blocks
 * included: past it the pool refuses, and the caller uses ordinary memory.
 */
#include "cuda_int.h"

#include <stdlib.h>
#include <string.h>

/* Smaller requests are refused: staging them costs less than pinning. */
#define MIN_BYTES ((size_t)256 << 10)
/* Blocks are whole multiples of this (small ones of 64 KiB). */
#define GRANULE ((size_t)2 << 20)
#define IDLE_SECONDS 10.0

static size_t round_len(size_t n) {
  size_t g = n <= GRANULE ? (size_t)64 << 10 : GRANULE;
  return n > SIZE_MAX - g ? 0 : (n + g - 1) / g * g;
}

void attn__cu_pinned_init(cu_pinned *pp, uint64_t cap) {
  memset(pp, 0, sizeof *pp);
  pthread_mutex_init(&pp->mu, NULL);
  pp->cap = cap;
}

void attn__cu_pinned_close(cu_pinned *pp) {
  for (int i = 0; i < pp->n; i++)
    cudaFreeHost(pp->b[i].p);
  free(pp->b);
  pthread_mutex_destroy(&pp->mu);
  memset(pp, 0, sizeof *pp);
}

/* Block i removed (its memory the caller's to free); mu held. */
static unsigned char *drop(cu_pinned *pp, int i) {
  unsigned char *p = pp->b[i].p;
  pp->pinned -= pp->b[i].len;
  pp->b[i] = pp->b[--pp->n];
  return p;
}

/* Idle blocks unpinned: those idle since before `before`, then (oldest
 * first) as many as `room` more bytes need; mu held, frees after. */
static int evict(cu_pinned *pp, double before, uint64_t room, unsigned char **out, int cap) {
  int k = 0;
  for (int i = 0; i < pp->n && k < cap;)
    if (!pp->b[i].lent && pp->b[i].idle_since < before)
      out[k++] = drop(pp, i);
    else
      i++;
  while (pp->pinned + room > pp->cap && k < cap) {
    int old = -1;
    for (int i = 0; i < pp->n; i++)
      if (!pp->b[i].lent && (old < 0 || pp->b[i].idle_since < pp->b[old].idle_since))
        old = i;
    if (old < 0)
      break;
    out[k++] = drop(pp, old);
  }
  return k;
}

/* The smallest idle block that holds len bytes without wasting half of
 * itself, lent; NULL when none; mu held. */
static unsigned char *reuse(cu_pinned *pp, size_t len) {
  int best = -1;
  for (int i = 0; i < pp->n; i++)
    if (!pp->b[i].lent && pp->b[i].len >= len && pp->b[i].len / 2 < len &&
        (best < 0 || pp->b[i].len < pp->b[best].len))
      best = i;
  if (best < 0)
    return NULL;
  pp->b[best].lent = true;
  pp->lent += pp->b[best].len;
  return pp->b[best].p;
}

static bool add_block(cu_pinned *pp, unsigned char *p, size_t len) {
  if (pp->n == pp->max) {
    int max = pp->max ? 2 * pp->max : 16;
    cu_block *b = realloc(pp->b, (size_t)max * sizeof *b);
    if (!b)
      return false;
    pp->b = b, pp->max = max;
  }
  pp->b[pp->n++] = (cu_block){p, len, true, 0};
  pp->lent += len;
  return true;
}

#define EVICT_MAX 32

/* Pins a new block of len bytes once the room for it is counted; NULL,
 * uncounted, when the driver refuses; mu not held. */
static unsigned char *pin_new(cu_pinned *pp, size_t len) {
  unsigned char *p = NULL;
  cudaError_t e = cudaHostAlloc((void **)&p, len, cudaHostAllocPortable);
  pthread_mutex_lock(&pp->mu);
  if (e != cudaSuccess || !add_block(pp, p, len)) {
    pp->pinned -= len;
    pp->refused++;
    pthread_mutex_unlock(&pp->mu);
    if (e == cudaSuccess)
      cudaFreeHost(p);
    cudaGetLastError();
    return NULL;
  }
  pthread_mutex_unlock(&pp->mu);
  return p;
}

void *attn__cu_pinned_get(cu_pinned *pp, size_t n) {
  size_t len = round_len(n);
  if (n < MIN_BYTES || len == 0 || len > pp->cap)
    return NULL;
  unsigned char *gone[EVICT_MAX];
  pthread_mutex_lock(&pp->mu);
  unsigned char *p = reuse(pp, len);
  int k = p ? evict(pp, attn_now() - IDLE_SECONDS, 0, gone, EVICT_MAX)
            : evict(pp, attn_now() - IDLE_SECONDS, len, gone, EVICT_MAX);
  bool fits = p || pp->pinned + len <= pp->cap;
  if (!p && fits)
    pp->pinned += len; /* counted now, so two callers cannot both pass the cap */
  if (!fits)
    pp->refused++;
  pthread_mutex_unlock(&pp->mu);
  for (int i = 0; i < k; i++)
    cudaFreeHost(gone[i]);
  return p ? p : fits ? pin_new(pp, len) : NULL;
}

bool attn__cu_pinned_put(cu_pinned *pp, void *p) {
  bool mine = false;
  pthread_mutex_lock(&pp->mu);
  for (int i = 0; i < pp->n && !mine; i++)
    if (pp->b[i].p == p && pp->b[i].lent) {
      pp->b[i].lent = false;
      pp->b[i].idle_since = attn_now();
      pp->lent -= pp->b[i].len;
      mine = true;
    }
  pthread_mutex_unlock(&pp->mu);
  return mine;
}

bool attn__cu_pinned_holds(cu_pinned *pp, const void *p, size_t n) {
  const unsigned char *c = p;
  bool in = false;
  pthread_mutex_lock(&pp->mu);
  for (int i = 0; i < pp->n && !in; i++)
    in = pp->b[i].lent && c >= pp->b[i].p && n <= pp->b[i].len &&
         (size_t)(c - pp->b[i].p) <= pp->b[i].len - n;
  pthread_mutex_unlock(&pp->mu);
  return in;
}

void attn__cu_pinned_stats(cu_pinned *pp, attn_host_stats *out) {
  pthread_mutex_lock(&pp->mu);
  *out = (attn_host_stats){pp->cap, pp->lent, pp->pinned, pp->refused};
  pthread_mutex_unlock(&pp->mu);
}
