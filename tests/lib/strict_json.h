/*
 * strict_json.h — what a strict client demands of an error body, checked
 * independently of proto/ (its own UTF-8 decoder, not attn__utf8_len), so
 * the unit tests and the fuzz targets can hold every body to it. Header
 * only: the fuzz targets are built from one source file each.
 */
#ifndef ATTN_TEST_STRICT_JSON_H
#define ATTN_TEST_STRICT_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Whether s[0..n) is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF, no cut sequence). */
static inline bool strict_utf8(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t k = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (!k || i + k > n)
      return false;
    uint32_t cp = k == 1 ? c : c & (0x7fu >> k);
    for (size_t j = 1; j < k; j++) {
      if ((u[i + j] & 0xc0) != 0x80)
        return false;
      cp = cp << 6 | (u[i + j] & 0x3f);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += k;
  }
  return true;
}

/* Whether body[0..len) is {"error": {"code": "...", "message": "..."}}
 * (plus a final newline) as a strict decoder reads it: UTF-8, no raw
 * control byte, exactly those keys, both values strings. On success the
 * decoded message is copied to msg (cap bytes, NUL-terminated) if msg. */
static inline bool strict_error_body(const char *body, size_t len, char *msg, size_t cap) {
  if (!body || !strict_utf8(body, len))
    return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)body[i] < 0x20 && !(i == len - 1 && body[i] == '\n'))
      return false;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  bool ok = root && cJSON_IsObject(root) && cJSON_GetArraySize(root) == 1;
  cJSON *err = ok ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
  ok = ok && cJSON_IsObject(err) && cJSON_GetArraySize(err) == 2;
  cJSON *code = ok ? cJSON_GetObjectItemCaseSensitive(err, "code") : NULL;
  cJSON *m = ok ? cJSON_GetObjectItemCaseSensitive(err, "message") : NULL;
  ok = ok && cJSON_IsString(code) && cJSON_IsString(m);
  /* what follows the value may only be the newline */
  ok = ok && end && (size_t)(end - body) >= len - 1;
  if (ok && msg && cap) {
    strncpy(msg, m->valuestring, cap - 1);
    msg[cap - 1] = 0;
  }
  cJSON_Delete(root);
  return ok;
}

#endif
