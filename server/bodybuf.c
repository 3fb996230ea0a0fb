/*
 * bodybuf.c — large request bodies' buffers (bodybuf.h): mappings aligned
 * to 2 MiB (where the kernel may back them with huge pages on its own), a
 * few kept idle for the next body.
 */
#include "bodybuf.h"
#include "engine.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* What a buffer keeps before the body it holds: its length, how much of
 * it is faulted in (all of it once it was used, or when page-locked), and
 * whether the engine lent it. */
#define HEAD ((size_t)64)
typedef struct map_head {
  size_t len, touched;
  bool lent;
} map_head;
/* Pages are faulted in this far ahead of the bytes, in one call: a fault
 * per 4 KiB page was most of a cold 256 MiB upload. */
#define PREFAULT ((size_t)4 << 20)
#define HUGE ((size_t)2 << 20)

void attnd_bodybufs_init(attnd_bodybufs *c, attn_engine *engine) {
  pthread_mutex_init(&c->mu, NULL);
  c->engine = engine;
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++)
    c->idle[i] = (attnd_bodybuf_idle){0};
}

void attnd_bodybufs_close(attnd_bodybufs *c) {
  attnd_bodybufs_trim(c, HUGE_VAL);
  pthread_mutex_destroy(&c->mu);
}

/* A mapping of len bytes (a multiple of HUGE) that starts on a huge page
 * boundary: mapped HUGE longer, its ragged ends given back. Not advised
 * MADV_HUGEPAGE: where defrag is "madvise" the first touch then waits on
 * compaction, which made a cold 256 MiB upload take 0.9 s instead of 0.3 s;
 * reusing a warm buffer (take_idle) saves the faults instead. */
static void *map_aligned(size_t len) {
  uint8_t *p = mmap(NULL, len + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  size_t lead = (HUGE - (uintptr_t)p % HUGE) % HUGE;
  if (lead)
    munmap(p, lead);
  if (HUGE - lead)
    munmap(p + lead + len, HUGE - lead);
  return p + lead;
}

/* The smallest idle buffer that holds len bytes, taken; NULL when none. */
static void *take_idle(attnd_bodybufs *c, size_t len, size_t *got) {
  int best = -1;
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++)
    if (c->idle[i].base && c->idle[i].len >= len &&
        (best < 0 || c->idle[i].len < c->idle[best].len))
      best = i;
  void *p = best < 0 ? NULL : c->idle[best].base;
  if (p) {
    *got = c->idle[best].len;
    c->idle[best].base = NULL;
  }
  pthread_mutex_unlock(&c->mu);
  return p;
}

char *attnd_bodybuf_get(attnd_bodybufs *c, size_t n) {
  if (n > SIZE_MAX - HEAD - HUGE)
    return NULL;
  void *base = c->engine ? attn_engine_host_alloc(c->engine, n + HEAD) : NULL;
  if (base) { /* page-locked: resident already */
    *(map_head *)base = (map_head){n + HEAD, n + HEAD, true};
    return (char *)base + HEAD;
  }
  size_t len = (n + HEAD + HUGE - 1) / HUGE * HUGE;
  base = take_idle(c, len, &len);
  if (!base) {
    if (!(base = map_aligned(len)))
      return NULL;
    *(map_head *)base = (map_head){len, HEAD, false};
  }
  return (char *)base + HEAD;
}

/* A free slot, else the one idle longest. */
static int slot_for(const attnd_bodybufs *c) {
  int slot = 0;
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++) {
    if (!c->idle[i].base)
      return i;
    if (c->idle[i].since < c->idle[slot].since)
      slot = i;
  }
  return slot;
}

void attnd_bodybuf_put(attnd_bodybufs *c, char *p) {
  if (!p)
    return;
  void *base = p - HEAD;
  map_head *h = base;
  if (h->lent) {
    attn_engine_host_free(c->engine, base);
    return;
  }
  size_t len = h->len;
  h->touched = len; /* a kept buffer is faulted in: (almost) all of it was used */
  double now = attn_now();
  pthread_mutex_lock(&c->mu);
  int slot = slot_for(c);
  attnd_bodybuf_idle drop = c->idle[slot];
  c->idle[slot] = (attnd_bodybuf_idle){base, len, now};
  pthread_mutex_unlock(&c->mu);
  if (drop.base)
    munmap(drop.base, drop.len);
}

void attnd_bodybufs_trim(attnd_bodybufs *c, double now) {
  attnd_bodybuf_idle stale[ATTND_BODYBUF_KEEP] = {{0}};
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++)
    if (c->idle[i].base && now - c->idle[i].since >= ATTND_BODYBUF_IDLE) {
      stale[i] = c->idle[i];
      c->idle[i].base = NULL;
    }
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++)
    if (stale[i].base)
      munmap(stale[i].base, stale[i].len);
}

/* The pages of [0, end) of p's mapping faulted in with one call
 * (MADV_POPULATE_WRITE, Linux 5.14; without it the copy faults them),
 * ahead of end by PREFAULT at most and never by more than end itself: an
 * upload that stalls holds at most twice the bytes it sent, as a buffer
 * doubling as they came would (plus a huge page, where the kernel's
 * transparent huge pages are "always"). */
static void prefault(char *p, size_t end) {
  map_head *h = (map_head *)(void *)(p - HEAD);
  end += HEAD;
  if (h->touched < end && h->touched < h->len) {
    size_t from = h->touched & ~(size_t)4095;
    size_t to = end + (end < PREFAULT ? end : PREFAULT);
    to = to < h->len ? to : h->len;
#ifdef MADV_POPULATE_WRITE
    if (madvise((char *)h + from, to - from, MADV_POPULATE_WRITE) != 0)
      to = h->len; /* not this kernel: leave it to the faults */
#endif
    h->touched = to;
  }
}

void attnd_bodybuf_fill(char *p, size_t at, const char *src, size_t n) {
  prefault(p, at + n);
  attnd_bodybuf_copy(p + at, src, n);
}

void attnd_bodybuf_copy(char *dst, const char *src, size_t n) {
#if defined(__x86_64__) /* SSE2: every x86-64 has it */
  size_t head = (16 - (uintptr_t)dst % 16) % 16;
  if (head > n)
    head = n;
  memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 64; n -= 64, dst += 64, src += 64)
    for (int k = 0; k < 64; k += 16)
      _mm_stream_si128((__m128i *)(void *)(dst + k),
                       _mm_loadu_si128((const __m128i *)(const void *)(src + k)));
  memcpy(dst, src, n);
  _mm_sfence(); /* streaming stores are weakly ordered: fence them before the handoff */
#else
  memcpy(dst, src, n);
#endif
}
