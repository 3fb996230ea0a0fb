/*
 * console.c — the web console's files and headers (console.h).
 */
#include "console.h"

#include <string.h>

/* Only this server, for everything; data: for the favicon-less page's
 * empty icon. form-action and base-uri cannot fall back to default-src. */
#define CONSOLE_CSP                                                                               \
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "               \
  "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; " \
  "frame-ancestors 'none'"

const attnd_console_header attnd_console_headers[] = {
    {"Content-Security-Policy", CONSOLE_CSP},
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Referrer-Policy", "no-referrer"},
    /* Revalidated on every load (a 304 while the binary is the same), so a
     * new attnd never runs with an old script. */
    {"Cache-Control", "no-cache"},
    {NULL, NULL},
};

const attnd_console_asset *attnd_console_find(const char *path) {
  for (int i = 0; i < attnd_console_n_assets; i++)
    if (!strcmp(path, attnd_console_assets[i].path))
      return &attnd_console_assets[i];
  return NULL;
}

/* The next entity tag of a list: p past it, *tag and *n its opaque part
 * with the quotes, NULL at the end. */
static const char *next_tag(const char *p, const char **tag, size_t *n) {
  while (*p == ' ' || *p == '\t' || *p == ',')
    p++;
  if (!*p)
    return NULL;
  if (!strncmp(p, "W/", 2))
    p += 2; /* If-None-Match compares weakly */
  const char *end = p + strcspn(p, ",");
  if (*p == '"') {
    const char *close = strchr(p + 1, '"');
    if (close)
      end = close + 1;
  }
  size_t len = (size_t)(end - p);
  while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
    len--;
  *tag = p;
  *n = len;
  return end;
}

bool attnd_console_not_modified(const char *if_none_match, const char *etag) {
  if (!if_none_match)
    return false;
  const char *p = if_none_match, *tag;
  size_t n, len = strlen(etag);
  while ((p = next_tag(p, &tag, &n)))
    if ((n == 1 && *tag == '*') || (n == len && !memcmp(tag, etag, n)))
      return true;
  return false;
}
