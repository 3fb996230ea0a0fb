/*
 * escape.c — client-supplied text made safe to print: in a log line it must
 * not start a new line or carry terminal escapes, and in a JSON error body it
 * must be valid UTF-8 that a strict parser accepts.
 */
#include "server.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0 when the
 * bytes there are not one (RFC 3629: no overlong forms, no surrogates, no
 * code point past U+10FFFF). */
static size_t utf8_len(const unsigned char *p, size_t n) {
  unsigned char c = p[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF; /* range of the second byte */
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    lo = c == 0xE0 ? 0xA0 : 0x80;
    hi = c == 0xED ? 0x9F : 0xBF;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    lo = c == 0xF0 ? 0x90 : 0x80;
    hi = c == 0xF4 ? 0x8F : 0xBF;
  } else
    return 0;
  if (n < len || p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < len; i++)
    if (p[i] < 0x80 || p[i] > 0xBF)
      return 0;
  return len;
}

void attnd_escape(char *dst, size_t cap, const char *src, size_t max_out) {
  const unsigned char *p = (const unsigned char *)src;
  size_t n = strlen(src), o = 0, chars = 0;
  if (cap < 8) { /* room for "\xHH..." and the NUL, or nothing */
    if (cap)
      dst[0] = 0;
    return;
  }
  while (n) {
    size_t len = *p >= 0x80 ? utf8_len(p, n) : (*p >= 0x20 && *p < 0x7F && *p != '\\');
    size_t out = len ? len : 4;
    if (chars == max_out || o + out + 4 > cap) { /* keep room for "..." */
      memcpy(dst + o, "...", 4);
      return;
    }
    if (len)
      memcpy(dst + o, p, len);
    else
      snprintf(dst + o, 5, "\\x%02X", *p);
    o += out;
    p += len ? len : 1;
    n -= len ? len : 1;
    chars++;
  }
  dst[o] = 0;
}
