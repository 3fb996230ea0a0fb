/*
 * sbuf.c — a growing text buffer for the JSON the codecs, the error bodies
 * and the server's own replies write, and for the Prometheus text of
 * /metrics (prom.c). A failed allocation is sticky: every later write is a
 * no-op and the writer checks `oom` once at the end.
 */
#include "internal.h"
#include "proto.h"

#include <stdarg.h>
#include <stdint.h>
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

/* One character of s (n bytes left) as strict JSON text into out, its
 * length in *pout; returns the bytes of s it took. Invalid UTF-8 is one U+FFFD per byte: whoever
 * reads the text can see that bytes were lost, and no byte a strict decoder refuses (nor a cut
 * multi-byte character, as a %.60s in a message can leave) goes out. */
static size_t json_char(const unsigned char *s, size_t n, char out[8], size_t *pout) {
  unsigned char c = s[0];
  if (c == '"' || c == '\\') {
    out[0] = '\\';
    out[1] = (char)c;
    *pout = 2;
    return 1;
  }
  if (c < 0x20 || c == 0x7f) { /* control bytes: escaped, so logs stay one line */
    *pout = (size_t)snprintf(out, 8, "\\u%04x", c);
    return 1;
  }
  if (c < 0x80) {
    out[0] = (char)c;
    *pout = 1;
    return 1;
  }
  size_t k = attn__utf8_len(s, n);
  if (!k) {
    memcpy(out, "\xef\xbf\xbd", 3); /* U+FFFD */
    *pout = 3;
    return 1;
  }
  memcpy(out, s, k);
  *pout = k;
  return k;
}

void attn_sbuf_json_strn(attn_sbuf *b, const char *s, size_t len, size_t max) {
  const unsigned char *u = (const unsigned char *)s;
  attn_sbuf_put(b, "\"", 1);
  for (size_t i = 0; i < len;) {
    char out[8];
    size_t nout, k = json_char(u + i, len - i, out, &nout);
    if (i + k > max) { /* only whole characters: the cut falls between them */
      attn_sbuf_put(b, "...", 3);
      break;
    }
    attn_sbuf_put(b, out, nout);
    i += k;
  }
  attn_sbuf_put(b, "\"", 1);
}

void attn_sbuf_json_str(attn_sbuf *b, const char *s) {
  attn_sbuf_json_strn(b, s, strlen(s), SIZE_MAX);
}
