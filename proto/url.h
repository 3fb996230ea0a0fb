/*
 * url.h — the server URLs the attn commands and attnd's --handover take, read in one place:
 * [http:// | https://]HOST[:PORT][/PATH][?QUERY], HOST a name, an IPv4
 * address or an IPv6 literal in brackets ("[::1]"). No scheme means
 * http://, as curl reads it.
 *
 * Only what a client of attnd can use is accepted: no credentials
 * ("user@", the key goes in ATTND_API_KEY), no #fragment (it never reaches
 * a server), no space or control byte anywhere. A refusal is one sentence
 * quoting the URL, for the command to print after its name.
 */
#ifndef ATTN_URL_H
#define ATTN_URL_H

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct attn_url {
  char scheme[8];   /* "http" or "https", lower case; "" when none was given */
  char host[256];   /* without the brackets of an IPv6 literal */
  bool ipv6;        /* host was an IPv6 literal */
  int port;         /* 1 to 65535; 80 (443 for https) when not given */
  char path[1024];  /* "" when the URL has none, or just "/" */
  bool has_query;   /* a '?' follows the path, even with nothing after it */
  char query[1024]; /* what follows the '?' */
} attn_url;

/* Reads s into u; 0, or ATTN_EINVAL with why it cannot be used in st. */
int attn_url_parse(const char *s, attn_url *u, attn_status *st);

/* Whether s is a server's base URL as `attn infer` takes it: one
 * attn_url_parse() reads, with no query (the options are flags there);
 * 0, or ATTN_EINVAL with why not in st. */
int attn_url_base(const char *s, attn_status *st);

#endif
