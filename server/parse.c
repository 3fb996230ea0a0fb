/*
 * parse.c — the rules a request's head must meet (parse.h).
 */
#define _GNU_SOURCE
#include "parse.h"
#include "errors.h"
#include "proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Fields that carry one value: a second copy is a request two readers may
 * take differently (RFC 9110 §5.3). */
static const char *const one_value[] = {
    "Host", "Authorization", "Content-Type", "Content-Encoding", "Inference-Header-Content-Length",
};
enum { N_ONE_VALUE = sizeof one_value / sizeof *one_value };

/* RFC 9110 §5.6.2: a field name is a token. */
static bool is_token(const char *s) {
  if (!*s)
    return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          strchr("!#$%&'*+-.^_`|~", *s)))
      return false;
  return true;
}

static void count_one_value(attnd_head *h, const char *name) {
  for (int i = 0; i < N_ONE_VALUE; i++)
    if (!strcasecmp(name, one_value[i])) {
      if (h->seen & (1u << i) && !h->dup)
        h->dup = one_value[i];
      h->seen |= 1u << i;
    }
}

void attnd_head_line(attnd_head *h, const char *method, size_t target_len, const char *version) {
  h->bytes +=
      strlen(method ? method : "") + 1 + target_len + 1 + strlen(version ? version : "") + 2;
}

void attnd_head_add(attnd_head *h, const char *name, const char *value) {
  h->bytes += strlen(name) + 2 + strlen(value ? value : "") + 2;
  h->n_fields++;
  if (!is_token(name) && !h->bad_name)
    h->bad_name = name;
  count_one_value(h, name);
  if (!strcasecmp(name, "Content-Length")) {
    if (h->n_cl++ == 0)
      h->cl = value;
    else if (strcmp(value ? value : "", h->cl ? h->cl : ""))
      h->cl_differ = true;
  } else if (!strcasecmp(name, "Transfer-Encoding") && h->n_te++ == 0) {
    h->te = value;
  } else if (!strcasecmp(name, "Host") && h->n_host++ == 0) {
    h->host = value;
  }
}

static int bad_name(const char *name, char *msg, size_t cap) {
  char q[72];
  attn_quote(q, sizeof q, name, strlen(name));
  if (strpbrk(name, " \t"))
    snprintf(msg, cap,
             "the header name \"%s\" has whitespace before its colon, which HTTP forbids (RFC "
             "9112 section 5.1)",
             q);
  else
    snprintf(msg, cap, "\"%s\" is not a valid header name (RFC 9110 section 5.6.2)", q);
  return ATTND_EBAD_REQUEST;
}

int attnd_head_check(const attnd_head *h, const char *version, char *msg, size_t cap) {
  char te[72];
  if (h->bytes + 2 > ATTND_MAX_HEAD || h->n_fields > ATTND_MAX_HEADERS) {
    snprintf(msg, cap,
             "the request line and headers are %zu bytes in %d header fields; this server takes "
             "at most %d bytes (16 KiB) in at most %d fields: send fewer or shorter headers",
             h->bytes + 2, h->n_fields, ATTND_MAX_HEAD, ATTND_MAX_HEADERS);
    return ATTND_EHEADERS_TOO_LARGE;
  }
  if (h->bad_name)
    return bad_name(h->bad_name, msg, cap);
  if (h->cl_differ) {
    snprintf(msg, cap, "the request has Content-Length headers with different values");
  } else if (h->n_cl && h->n_te) {
    snprintf(msg, cap, "the request has both Content-Length and Transfer-Encoding; send one");
  } else if (h->dup) {
    snprintf(msg, cap, "the request has more than one %s header; it takes one value", h->dup);
  } else if (version && !strcmp(version, "HTTP/1.1") && !h->n_host) {
    snprintf(msg, cap, "an HTTP/1.1 request needs a Host header");
  } else if (h->n_te && (h->n_te > 1 || strcasecmp(h->te ? h->te : "", "chunked"))) {
    attn_quote(te, sizeof te, h->te ? h->te : "", h->te ? strlen(h->te) : 0);
    snprintf(msg, cap,
             "Transfer-Encoding \"%s\" is not supported; send the body with Content-Length or "
             "Transfer-Encoding: chunked",
             h->n_te > 1 ? "(more than one header)" : te);
    return ATTND_ENOT_IMPLEMENTED;
  } else {
    return 0;
  }
  return ATTND_EBAD_REQUEST;
}

bool attnd_head_has_body(const attnd_head *h) {
  return h->n_te || (h->n_cl && strcmp(h->cl ? h->cl : "", "0"));
}

static int hex(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

size_t attnd_parse_unescape(char *s, bool path, bool *nul) {
  char *w = s;
  for (const char *p = s; *p;) {
    int hi = p[0] == '%' ? hex(p[1]) : -1, lo = hi >= 0 ? hex(p[2]) : -1;
    int c = hi * 16 + lo;
    if (lo < 0 || (path && c == '/')) {
      *w++ = *p++;
      continue;
    }
    if (c == 0)
      *nul = true;
    else
      *w++ = (char)c;
    p += 3;
  }
  *w = 0;
  return (size_t)(w - s);
}

/* The host of a Host value or an origin's authority, without its port,
 * into out (false when it does not fit or is malformed). */
static bool host_part(const char *v, char *out, size_t cap) {
  size_t n;
  if (*v == '[') {
    const char *end = strchr(v, ']');
    if (!end)
      return false;
    v++;
    n = (size_t)(end - v);
  } else {
    const char *colon = strchr(v, ':');
    n = colon && !strchr(colon + 1, ':') ? (size_t)(colon - v) : strlen(v);
  }
  if (n >= cap)
    return false;
  memcpy(out, v, n);
  out[n] = 0;
  return true;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), t = strlen(tail);
  return n >= t && !strcasecmp(s + n - t, tail);
}

/* Whether name is one of allowed's comma-separated entries: "*", a name,
 * or ".suffix" for every name under it. */
static bool in_list(const char *name, const char *allowed) {
  while (allowed && *allowed) {
    size_t n = strcspn(allowed, ",");
    char e[256];
    if (n < sizeof e) {
      memcpy(e, allowed, n);
      e[n] = 0;
      if (!strcmp(e, "*") || !strcasecmp(e, name) || (e[0] == '.' && ends_with(name, e)))
        return true;
    }
    allowed += n + (allowed[n] == ',');
  }
  return false;
}

bool attnd_parse_host_allowed(const char *host, const char *allowed) {
  char name[256];
  unsigned char addr[16];
  if (!host || !*host)
    return true;
  if (!host_part(host, name, sizeof name))
    return false;
  return inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1 ||
         !strcasecmp(name, "localhost") || ends_with(name, ".localhost") || in_list(name, allowed);
}

/* The authority of an origin or Host value with its scheme's default port
 * dropped, into out; false when it does not fit. */
static bool authority(const char *v, bool https, char *out, size_t cap) {
  const char *dflt = https ? ":443" : ":80";
  size_t n = strlen(v);
  if (n >= cap)
    return false;
  memcpy(out, v, n + 1);
  if (ends_with(out, dflt))
    out[n - strlen(dflt)] = 0;
  return true;
}

bool attnd_parse_origin_allowed(const char *origin, const char *host, const char *cors) {
  if (!origin || (cors && (!strcmp(cors, "*") || !strcasecmp(cors, origin))))
    return true;
  const char *at = strstr(origin, "://");
  if (!host || !at)
    return false;
  bool https = (size_t)(at - origin) == 5 && !strncasecmp(origin, "https", 5);
  char a[300], b[300];
  return authority(at + 3, https, a, sizeof a) && authority(host, https, b, sizeof b) &&
         !strcasecmp(a, b);
}

/* ---- the target, the body's framing, what a reply may be ------------------ */

const char *attnd_parse_target(const char *uri, int *code) {
  size_t params = 0;
  const char *q = strchr(uri, '?');
  for (const char *p = q; p && *p; p++)
    params += *p == '&' || p == q;
  *code = ATTND_EURI_TOO_LONG;
  if (strlen(uri) > ATTND_MAX_TARGET)
    return "the request target is longer than 8192 bytes";
  if (params > ATTND_MAX_QUERY_PARAMS)
    return "the query string has more than 100 parameters";
  *code = ATTND_EBAD_REQUEST;
  if (strpbrk(uri, " \t"))
    return "the request target holds a space or tab; percent-encode it (%20)";
  return NULL;
}

const char *attnd_parse_origin_path(const char *url) {
  const char *p = !strncasecmp(url, "http://", 7)    ? url + 7
                  : !strncasecmp(url, "https://", 8) ? url + 8
                                                     : NULL;
  if (!p)
    return url;
  p = strchr(p, '/');
  return p ? p : "/";
}

bool attnd_parse_media_is(const char *v, const char *type) {
  if (!v)
    return false;
  while (*v == ' ')
    v++;
  size_t n = strlen(type);
  if (strncasecmp(v, type, n) != 0)
    return false;
  v += n;
  while (*v == ' ' || *v == '\t')
    v++;
  return *v == 0 || *v == ';';
}

bool attnd_parse_accepts_binary(const char *a) {
  if (!a)
    return false;
  /* A list: binary when octet-stream is in it and JSON is not preferred
   * before it. */
  const char *bin = strcasestr(a, "application/octet-stream");
  const char *js = strcasestr(a, "application/json");
  return bin && (!js || bin < js);
}

uint64_t attnd_parse_content_length(const char *cl) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(cl, &end, 10);
  return (*cl && !*end && !errno) ? v : UINT64_MAX;
}

bool attnd_parse_json_length(const char *h, size_t *len) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(h, &end, 10);
  if (*h < '0' || *h > '9' || *end || errno || v > SIZE_MAX - 1)
    return false;
  *len = (size_t)v;
  return true;
}
