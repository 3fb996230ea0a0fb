/*
 * text.c — how the codecs put client bytes and JSON types into messages.
 * Messages name what was wrong, but what a client sent is arbitrary bytes
 * of any length: quote it escaped and cut so the message stays readable
 * and inside attn_status.
 */
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

const char *attn__quote(char *dst, size_t cap, const char *s, size_t len) {
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
