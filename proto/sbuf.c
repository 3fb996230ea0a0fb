/*
 * sbuf.c — a growing text buffer for the JSON the codecs, the error bodies
 * and the server's own replies write. A failed allocation is sticky: every
 * later write is a no-op and the writer checks `oom` once at the end.
 */
#include "proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool attn_sbuf_reserve(attn_sbuf *b, size_t n) {
  if (b->oom)
    return false;
  if (b->len + n + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + n + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->p = p;
  b->cap = cap;
  return true;
}

void attn_sbuf_put(attn_sbuf *b, const char *s, size_t n) {
  if (!attn_sbuf_reserve(b, n))
    return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void attn_sbuf_puts(attn_sbuf *b, const char *s) { attn_sbuf_put(b, s, strlen(s)); }

void attn_sbuf_printf(attn_sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !attn_sbuf_reserve(b, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void attn_sbuf_json_str(attn_sbuf *b, const char *s) {
  attn_sbuf_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char e[8];
    if (c == '"' || c == '\\') {
      e[0] = '\\';
      e[1] = (char)c;
      attn_sbuf_put(b, e, 2);
    } else if (c < 0x20) {
      attn_sbuf_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
    } else {
      attn_sbuf_put(b, s, 1);
    }
  }
  attn_sbuf_put(b, "\"", 1);
}
