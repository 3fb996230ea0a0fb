/*
 * proxy.c — trusted proxies and the client behind them (proxy.h).
 */
#include "proxy.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const unsigned char v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* s[0..n) as an address; IPv4 (and an IPv4-mapped IPv6 address, which a
 * dual-stack socket reports) mapped into IPv6. *v4 says which it was. */
static bool parse_addr(const char *s, size_t n, unsigned char out[16], bool *v4) {
  char buf[64];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, s, n);
  buf[n] = 0;
  *v4 = inet_pton(AF_INET, buf, out + 12) == 1;
  if (*v4) {
    memcpy(out, v4_prefix, sizeof v4_prefix);
    return true;
  }
  if (inet_pton(AF_INET6, buf, out) != 1)
    return false;
  *v4 = !memcmp(out, v4_prefix, sizeof v4_prefix);
  return true;
}

static void trim(const char **s, size_t *n) {
  while (*n && (**s == ' ' || **s == '\t'))
    (*s)++, (*n)--;
  while (*n && ((*s)[*n - 1] == ' ' || (*s)[*n - 1] == '\t'))
    (*n)--;
}

/* One entry of --trusted-proxy: ADDR or ADDR/BITS. */
static bool parse_net(const char *s, size_t n, attnd_net *net) {
  const char *slash = memchr(s, '/', n);
  size_t alen = slash ? (size_t)(slash - s) : n;
  bool v4;
  if (!parse_addr(s, alen, net->addr, &v4))
    return false;
  int most = v4 ? 32 : 128, bits = most;
  if (slash) {
    char buf[8], *end;
    size_t blen = n - alen - 1;
    if (blen == 0 || blen >= sizeof buf)
      return false;
    memcpy(buf, slash + 1, blen);
    buf[blen] = 0;
    long b = strtol(buf, &end, 10);
    if (*end || buf[0] < '0' || buf[0] > '9' || b > most)
      return false;
    bits = (int)b;
  }
  net->bits = v4 ? bits + 96 : bits;
  return true;
}

int attnd_proxies_parse(attnd_proxies *p, const char *list, char *err, size_t cap) {
  for (const char *s = list; *s;) {
    const char *comma = strchr(s, ',');
    size_t n = comma ? (size_t)(comma - s) : strlen(s);
    const char *e = s;
    size_t en = n;
    trim(&e, &en);
    if (en && p->n >= ATTND_MAX_PROXIES) {
      snprintf(err, cap, "more than %d addresses or networks", ATTND_MAX_PROXIES);
      return -1;
    }
    if (en && !parse_net(e, en, &p->net[p->n])) {
      snprintf(err, cap, "'%.*s' is not an address or a network (ADDR or ADDR/BITS, IPv4 or IPv6)",
               (int)(en > 64 ? 64 : en), e);
      return -1;
    }
    p->n += en > 0;
    s += n + (comma != NULL);
  }
  return 0;
}

static bool matches(const attnd_net *net, const unsigned char a[16]) {
  int whole = net->bits / 8, rest = net->bits % 8;
  if (memcmp(net->addr, a, (size_t)whole))
    return false;
  unsigned char mask = (unsigned char)(0xff00 >> rest);
  return !rest || !((net->addr[whole] ^ a[whole]) & mask);
}

static bool trusted(const attnd_proxies *p, const unsigned char a[16]) {
  for (int i = 0; i < p->n; i++)
    if (matches(&p->net[i], a))
      return true;
  return false;
}

bool attnd_proxies_trusts(const attnd_proxies *p, const char *addr) {
  unsigned char a[16];
  bool v4;
  return p->n > 0 && parse_addr(addr, strlen(addr), a, &v4) && trusted(p, a);
}

/* One hop of X-Forwarded-For: an address, "[v6]" or "[v6]:port", or
 * "v4:port" (some proxies add the port). */
static bool parse_hop(const char *s, size_t n, unsigned char a[16]) {
  bool v4;
  if (n > 2 && s[0] == '[') {
    const char *close = memchr(s, ']', n);
    return close && parse_addr(s + 1, (size_t)(close - s - 1), a, &v4);
  }
  const char *colon = memchr(s, ':', n);
  if (colon && !memchr(colon + 1, ':', n - (size_t)(colon - s) - 1))
    n = (size_t)(colon - s); /* one colon: v4:port */
  return parse_addr(s, n, a, &v4);
}

static void addr_text(const unsigned char a[16], char *out) {
  bool v4 = !memcmp(a, v4_prefix, sizeof v4_prefix);
  if (!inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? a + 12 : a, out, ATTND_ADDR_MAX))
    snprintf(out, ATTND_ADDR_MAX, "?");
}

/* Walks one header's comma list from its right end; false once the walk
 * ends (an untrusted address, now in *client, or an entry not an address). */
static bool walk_value(const attnd_proxies *p, const char *v, unsigned char client[16]) {
  size_t end = strlen(v);
  while (end > 0) {
    size_t start = end;
    while (start > 0 && v[start - 1] != ',')
      start--;
    const char *e = v + start;
    size_t n = end - start;
    trim(&e, &n);
    end = start ? start - 1 : 0;
    if (n == 0)
      continue;
    unsigned char a[16];
    if (!parse_hop(e, n, a))
      return false;
    memcpy(client, a, 16);
    if (!trusted(p, a))
      return false;
  }
  return true;
}

void attnd_proxies_client(const attnd_proxies *p, const char *peer, const char *const *xff, int n,
                          char *out) {
  unsigned char client[16];
  bool v4;
  if (!p->n || !parse_addr(peer, strlen(peer), client, &v4) || !trusted(p, client)) {
    snprintf(out, ATTND_ADDR_MAX, "%s", peer);
    return;
  }
  for (int i = n - 1; i >= 0 && walk_value(p, xff[i], client); i--)
    ;
  addr_text(client, out);
}
