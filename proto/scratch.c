/*
 * scratch.c — cJSON's nodes from a caller's buffer while it parses a small
 * document it frees before returning (internal.h, attn__scratch).
 *
 * A decode step's safetensors header is some twenty cJSON nodes and
 * strings: as many malloc/free pairs, and the heap's consolidation they
 * set off, cost the step more than the parse itself. cJSON takes one pair
 * of allocation hooks for the whole process, so they are set once, before
 * main, and fall through to malloc and free on every thread that has no
 * scratch buffer open (and once a buffer is full).
 */
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

static __thread attn__scratch *open_scratch;

static void *scratch_malloc(size_t n) {
  attn__scratch *s = open_scratch;
  size_t need = (n + 15) & ~(size_t)15;
  if (s && need >= n && need <= s->cap - s->used) {
    void *p = s->base + s->used;
    s->used += need;
    return p;
  }
  return malloc(n);
}

/* Scratch memory is given back whole, by attn__scratch_end. */
static void scratch_free(void *p) {
  for (const attn__scratch *s = open_scratch; s; s = s->outer)
    if ((char *)p >= s->base && (char *)p < s->base + s->cap)
      return;
  free(p);
}

__attribute__((constructor)) static void scratch_hooks(void) {
  cJSON_Hooks h = {scratch_malloc, scratch_free};
  cJSON_InitHooks(&h);
}

void attn__scratch_begin(attn__scratch *s, void *buf, size_t cap) {
  *s = (attn__scratch){.base = buf, .cap = cap, .outer = open_scratch};
  open_scratch = s;
}

void attn__scratch_end(attn__scratch *s) { open_scratch = s->outer; }
