/*
 * proxy.h — the proxies attnd trusts (--trusted-proxy) and the client
 * address a request came from through them. Behind a load balancer every
 * connection comes from the balancer: the per-client limits and the log
 * lines would see one client. A trusted proxy's X-Forwarded-For names the
 * real one; anyone else's is ignored, since a client can send any header.
 */
#ifndef ATTND_PROXY_H
#define ATTND_PROXY_H

#include <stdbool.h>
#include <stddef.h>

#define ATTND_MAX_PROXIES 32
#define ATTND_ADDR_MAX 48 /* an address as text (inet_ntop's INET6_ADDRSTRLEN, 46) */

/* An address and how many of its leading bits a match compares. */
typedef struct attnd_net {
  unsigned char addr[16]; /* IPv4 as ::ffff:a.b.c.d, so one compare serves both */
  int bits;               /* of the 128 */
} attnd_net;

typedef struct attnd_proxies {
  int n;
  attnd_net net[ATTND_MAX_PROXIES];
} attnd_proxies;

/* Adds a comma-separated list of addresses and networks (10.0.0.0/8,
 * ::1, fd00::/8) to p. -1 with a message in err naming the entry. */
int attnd_proxies_parse(attnd_proxies *p, const char *list, char *err, size_t cap);

/* Whether addr (as inet_ntop writes it) is one of p's. */
bool attnd_proxies_trusts(const attnd_proxies *p, const char *addr);

/*
 * The client behind peer, written to out (ATTND_ADDR_MAX): peer itself
 * unless p trusts it; else X-Forwarded-For's values (xff[0..n), in the
 * order the headers came, each a comma list) read from the right, past
 * every address p trusts, to the first it does not. An entry that is not
 * an address ends the walk at the hop that sent it: what lies left of it
 * was written by nobody trusted.
 */
void attnd_proxies_client(const attnd_proxies *p, const char *peer, const char *const *xff, int n,
                          char *out);

#endif
