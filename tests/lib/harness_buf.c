/* harness_buf.c — see harness_buf.h. */
#define _GNU_SOURCE
#include "harness_buf.h"

#include <stdlib.h>
#include <string.h>

void buf_add(buf *b, const void *d, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 1024;
    while (c < b->n + n + 1)
      c *= 2;
    b->p = realloc(b->p, c);
    b->cap = c;
  }
  memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
}

const char *snip(const char *s, size_t len, char *b, size_t cap) {
  size_t n = len < cap - 4 ? len : cap - 4;
  for (size_t i = 0; i < n; i++)
    b[i] = (s[i] >= 32 && s[i] < 127) ? s[i] : '.';
  b[n] = 0;
  if (n < len)
    strcat(b, "...");
  return b;
}
