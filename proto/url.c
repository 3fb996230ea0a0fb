/* url.c — see url.h. */
#include "url.h"

#include "engine.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The scheme, when s has one: the length of "http://" or "https://" it
 * starts with, 0 for none, -1 for another. */
static int scheme(const char *s, attn_url *u) {
  const char *sep = strstr(s, "://");
  if (!sep || sep != s + strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+-.")) {
    u->port = 80;
    return 0;
  }
  size_t n = (size_t)(sep - s);
  if ((n != 4 && n != 5) || strncasecmp(s, "https", n) != 0)
    return -1;
  memcpy(u->scheme, n == 4 ? "http" : "https", n + 1);
  u->port = n == 4 ? 80 : 443;
  return (int)n + 3;
}

/* The host at h, up to the port, path or query; the bytes read, or ATTN_EINVAL. */
static int host(const char *h, const char *s, attn_url *u, attn_status *st) {
  size_t n;
  const char *name = h;
  if (*h == '[') {
    name = h + 1;
    n = strspn(name, "0123456789abcdefABCDEF:.");
    if (name[n] != ']' || !memchr(name, ':', n))
      return attn_status_set(st, ATTN_EINVAL, "bad IPv6 address in \"%.160s\" (write it as [::1])",
                             s);
    u->ipv6 = true;
  } else {
    n = strcspn(h, ":/?");
  }
  if (n == 0)
    return attn_status_set(st, ATTN_EINVAL, "no host in \"%.160s\"", s);
  if (n >= sizeof u->host)
    return attn_status_set(st, ATTN_EINVAL, "host too long in \"%.160s\"", s);
  memcpy(u->host, name, n);
  return (int)(n + (u->ipv6 ? 2 : 0));
}

/* ":PORT" at p, if there; the bytes read, or ATTN_EINVAL. */
static int port(const char *p, const char *s, attn_url *u, attn_status *st) {
  if (*p != ':')
    return 0;
  size_t n = strspn(p + 1, "0123456789");
  long v = 0;
  for (size_t i = 0; i < n && v <= 65535; i++)
    v = v * 10 + (p[1 + i] - '0');
  if (n == 0 || v < 1 || v > 65535 || (p[1 + n] && p[1 + n] != '/' && p[1 + n] != '?'))
    return attn_status_set(st, ATTN_EINVAL, "bad port in \"%.160s\"", s);
  u->port = (int)v;
  return (int)n + 1;
}

/* The path and query at p. */
static int path_query(const char *p, const char *s, attn_url *u, attn_status *st) {
  size_t pl = strcspn(p, "?");
  if (pl >= sizeof u->path)
    return attn_status_set(st, ATTN_EINVAL, "path too long in \"%.160s\"", s);
  if (pl > 1)
    memcpy(u->path, p, pl);
  if (p[pl] != '?')
    return 0;
  u->has_query = true;
  if (strlen(p + pl + 1) >= sizeof u->query)
    return attn_status_set(st, ATTN_EINVAL, "query too long in \"%.160s\"", s);
  strcpy(u->query, p + pl + 1);
  return 0;
}

/* What no part of a usable URL holds; 0, or ATTN_EINVAL. */
static int bad_bytes(const char *s, attn_status *st) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p <= 0x20 || *p == 0x7f)
      return attn_status_set(st, ATTN_EINVAL, "URL \"%.160s\" holds a space or control character",
                             s);
  if (strchr(s, '#'))
    return attn_status_set(st, ATTN_EINVAL, "URL \"%.160s\" has a #fragment, which no server sees",
                           s);
  return 0;
}

int attn_url_parse(const char *s, attn_url *u, attn_status *st) {
  memset(u, 0, sizeof *u);
  int rc = bad_bytes(s, st);
  if (rc < 0)
    return rc;
  int n = scheme(s, u);
  if (n < 0)
    return attn_status_set(st, ATTN_EINVAL,
                           "the URL must start with http:// or https:// (\"%.160s\")", s);
  const char *h = s + n;
  if (memchr(h, '@', strcspn(h, "/?")))
    return attn_status_set(st, ATTN_EINVAL,
                           "URL \"%.160s\" holds credentials (user@); an API key goes "
                           "in its own setting (ATTND_API_KEY for the attn commands; attnd "
                           "sends each session's own key), never in a URL",
                           s);
  int hl = host(h, s, u, st);
  if (hl < 0)
    return hl;
  int pl = port(h + hl, s, u, st);
  if (pl < 0)
    return pl;
  const char *p = h + hl + pl;
  if (*p && *p != '/' && *p != '?')
    return attn_status_set(st, ATTN_EINVAL, "bad host in \"%.160s\"", s);
  return path_query(p, s, u, st);
}

int attn_url_base(const char *s, attn_status *st) {
  attn_url u;
  int rc = attn_url_parse(s, &u, st);
  if (rc < 0)
    return rc;
  if (u.has_query)
    return attn_status_set(st, ATTN_EINVAL,
                           "URL \"%.160s\" must be the server's base, like "
                           "http://127.0.0.1:8080 (options are flags)",
                           s);
  return 0;
}
