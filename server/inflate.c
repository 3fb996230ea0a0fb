/*
 * inflate.c — bounded gzip and deflate decoding (inflate.h).
 *
 * The output buffer starts at a few times the input and doubles, each
 * growth first approved by the caller's budget and never past max: a bomb
 * stops at max + one buffer's worth of zlib's window, whatever it claims.
 */
#include "inflate.h"
#include "errors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#define FIRST_BUFFER ((size_t)64 * 1024)

attnd_encoding attnd_encoding_of(const char *header) {
  if (!header)
    return ATTND_ENC_IDENTITY;
  while (*header == ' ' || *header == '\t')
    header++;
  size_t n = strlen(header);
  while (n > 0 && (header[n - 1] == ' ' || header[n - 1] == '\t'))
    n--;
  static const struct {
    const char *name;
    attnd_encoding enc;
  } names[] = {{"identity", ATTND_ENC_IDENTITY},
               {"gzip", ATTND_ENC_GZIP},
               {"x-gzip", ATTND_ENC_GZIP},
               {"deflate", ATTND_ENC_DEFLATE}};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strlen(names[i].name) == n && !strncasecmp(header, names[i].name, n))
      return names[i].enc;
  return ATTND_ENC_UNKNOWN;
}

/* zlib's windowBits for the coding: gzip only (16+), a zlib header when
 * the first two bytes are one (RFC 1950's check), else raw deflate. */
static int window_bits(attnd_encoding enc, const unsigned char *in, size_t n) {
  if (enc == ATTND_ENC_GZIP)
    return 16 + MAX_WBITS;
  if (n >= 2 && (in[0] & 0x0f) == Z_DEFLATED && (in[0] >> 4) <= 7 &&
      (in[0] * 256 + in[1]) % 31 == 0)
    return MAX_WBITS;
  return -MAX_WBITS;
}

/* zlib counts in uInt: input and output are handed over in steps of at
 * most this, so bodies past 4 GiB decode too. */
#define STEP ((size_t)1 << 30)

typedef struct sink {
  char *p;
  size_t cap, used; /* used: decoded bytes before z's current window */
  size_t max;
  attnd_inflate_grow grow;
  void *ctx;
  const char *in; /* input not yet handed to zlib */
  size_t in_left;
} sink;

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Hands zlib the next step of output room, growing the buffer when it is
 * full; 0 or an error code. */
static int sink_room(sink *s, z_stream *z) {
  s->used = (size_t)((char *)z->next_out - s->p);
  if (s->used == s->cap) {
    if (s->cap >= s->max + 1) /* a byte past max: "more than max" */
      return ATTND_ETOO_LARGE;
    size_t cap = min_size(s->cap * 2, s->max + 1);
    if (!s->grow(s->ctx, cap - s->cap))
      return ATTND_EQUEUE_FULL;
    char *p = realloc(s->p, cap);
    if (!p)
      return ATTND_EOUT_OF_MEMORY;
    s->p = p;
    s->cap = cap;
  }
  z->next_out = (Bytef *)s->p + s->used;
  z->avail_out = (uInt)min_size(s->cap - s->used, STEP);
  return 0;
}

static void feed(sink *s, z_stream *z) {
  if (z->avail_in || !s->in_left)
    return;
  size_t n = min_size(s->in_left, STEP);
  z->next_in = (Bytef *)(uintptr_t)s->in;
  z->avail_in = (uInt)n;
  s->in += n;
  s->in_left -= n;
}

static int run_inflate(z_stream *z, sink *s, size_t *out_len) {
  for (;;) {
    int e = z->avail_out ? 0 : sink_room(s, z);
    if (e)
      return e;
    feed(s, z);
    int rc = inflate(z, Z_NO_FLUSH);
    size_t done = (size_t)((char *)z->next_out - s->p);
    if (rc == Z_STREAM_END) {
      feed(s, z);
      if (z->avail_in && z->next_in[0] == 0x1f && inflateReset(z) == Z_OK)
        continue; /* another gzip member follows (RFC 1952 2.2) */
      *out_len = done;
      if (done > s->max)
        return ATTND_ETOO_LARGE;
      return z->avail_in ? ATTND_EBAD_REQUEST : 0;
    }
    if (rc == Z_MEM_ERROR)
      return ATTND_EOUT_OF_MEMORY;
    /* Z_BUF_ERROR with room left: the input ended before the stream did */
    if (rc != Z_OK && !(rc == Z_BUF_ERROR && z->avail_out == 0))
      return ATTND_EBAD_REQUEST;
  }
}

static void describe(int e, attnd_encoding enc, size_t max, const char *zmsg, char *msg,
                     size_t cap) {
  const char *name = enc == ATTND_ENC_GZIP ? "gzip" : "deflate";
  if (e == ATTND_ETOO_LARGE)
    snprintf(msg, cap, "the %s body decodes to more than the limit of %zu bytes (--max-body)", name,
             max);
  else if (e == ATTND_EBAD_REQUEST)
    snprintf(msg, cap,
             "the body is not valid %s data (Content-Encoding: %s)%s%s: corrupt, truncated "
             "or followed by other bytes",
             name, name, zmsg ? ": " : "", zmsg ? zmsg : "");
  else if (e == ATTND_EQUEUE_FULL)
    snprintf(msg, cap,
             "decoding the %s body would pass the server's memory budget for request bodies "
             "(--max-queue x --max-body); retry shortly",
             name);
  else
    snprintf(msg, cap, "out of memory decoding the %s body", name);
}

int attnd_inflate(attnd_encoding enc, const char *in, size_t n, size_t max, attnd_inflate_grow grow,
                  void *ctx, char **out, size_t *out_len, char *msg, size_t cap) {
  *out = NULL;
  *out_len = 0;
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, window_bits(enc, (const unsigned char *)in, n)) != Z_OK) {
    describe(ATTND_EOUT_OF_MEMORY, enc, max, NULL, msg, cap);
    return ATTND_EOUT_OF_MEMORY;
  }
  size_t first = min_size(n * 4 > FIRST_BUFFER ? n * 4 : FIRST_BUFFER, max + 1);
  sink s = {.max = max, .grow = grow, .ctx = ctx, .in = in, .in_left = n};
  int e = 0;
  if (!grow(ctx, first))
    e = ATTND_EQUEUE_FULL;
  else if (!(s.p = malloc(first)))
    e = ATTND_EOUT_OF_MEMORY;
  if (!e) {
    s.cap = first;
    z.next_out = (Bytef *)s.p;
    z.avail_out = (uInt)min_size(first, STEP);
    e = run_inflate(&z, &s, out_len);
  }
  if (e) {
    describe(e, enc, max, e == ATTND_EBAD_REQUEST ? z.msg : NULL, msg, cap);
    free(s.p);
    *out_len = 0;
  } else {
    *out = s.p;
  }
  inflateEnd(&z);
  return e;
}
