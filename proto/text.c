/*
 * text.c — how the codecs put client bytes and JSON types into messages,
 * and the UTF-8 check both codecs' JSON readers share. Messages name what
 * was wrong, but what a client sent is arbitrary bytes of any length: quote
 * it escaped and cut so the message stays readable and inside attn_status.
 */
#include "internal.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

const char *attn_quote(char *dst, size_t cap, const char *s, size_t len) {
  size_t o = 0, i = 0;
  for (; i < len && o + 8 < cap; i++) { /* room for one escape and "..." */
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
      dst[o++] = (char)c;
    else
      o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
  }
  if (i < len) {
    memcpy(dst + o, "...", 3);
    o += 3;
  }
  dst[o] = 0;
  return dst;
}

/* Length of the UTF-8 sequence at s, or 0 when it is not well formed
 * (overlong forms and surrogates included, as RFC 3629 says). */
size_t attn__utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  uint32_t cp;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
    return 0;
  if (len == 4 && (cp < 0x10000 || cp > 0x10ffff))
    return 0;
  return len;
}

const char *attn__json_type(const cJSON *j) {
  if (cJSON_IsObject(j))
    return "an object";
  if (cJSON_IsArray(j))
    return "an array";
  if (cJSON_IsString(j))
    return "a string";
  if (cJSON_IsNumber(j))
    return "a number";
  if (cJSON_IsBool(j))
    return "a boolean";
  if (cJSON_IsNull(j))
    return "null";
  return "an invalid value";
}
