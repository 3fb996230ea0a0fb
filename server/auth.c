/*
 * auth.c — the API key check (auth.h).
 */
#include "auth.h"
#include "routes.h"

#include <string.h>
#include <strings.h>

bool attnd_auth_open(const char *path) {
  const attnd_route *route = attnd_route_find(path, NULL, NULL);
  return route && route->open;
}

bool attnd_auth_equal(const char *a, size_t a_len, const char *b, size_t b_len) {
  /* Every byte of b is visited whatever a holds; a shorter a is read as
   * zeros past its end, and the length difference is folded in last. */
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < b_len; i++) {
    unsigned char x = i < a_len ? (unsigned char)a[i] : 0;
    diff |= (unsigned char)(x ^ (unsigned char)b[i]);
  }
  return (diff | (a_len != b_len)) == 0;
}

bool attnd_auth_check(const char *header, const char *key) {
  static const char scheme[] = "Bearer";
  if (!header)
    return false;
  while (*header == ' ' || *header == '\t')
    header++;
  if (strncasecmp(header, scheme, sizeof scheme - 1) != 0)
    return false;
  const char *p = header + sizeof scheme - 1;
  if (*p != ' ' && *p != '\t')
    return false;
  while (*p == ' ' || *p == '\t')
    p++;
  size_t n = strlen(p);
  while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
    n--;
  return attnd_auth_equal(p, n, key, strlen(key));
}
