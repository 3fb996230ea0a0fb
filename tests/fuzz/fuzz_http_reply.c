/*
 * fuzz_http_reply.c — libFuzzer target for the HTTP/1.1 reply parser
 * (proto/http_reply.h, `attn load`'s and the session handover's). The
 * input is what a server sends on one keep-alive connection;
 * its first byte chooses how it is split into reads. Fed whole or in
 * pieces, the parser must end the same replies at the same offsets, never
 * report more bytes used than it was given, and never read past its input
 * or its buffers (ASan).
 */
#include "http_reply.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REPLIES 64

/* Feeds s[0..n) in pieces of `step` bytes (0: whole), starting a new reply
 * after each one that ends; the offsets where replies end go to ends.
 * Returns how many replies ended, or -1 - that count on an error. */
static int run(attn_http_reply *p, const char *s, size_t n, size_t step, size_t *ends) {
  int count = 0;
  size_t off = 0;
  attn_http_reply_start(p);
  while (off < n) {
    size_t piece = step && n - off > step ? step : n - off, used = 0;
    int rc = attn_http_reply_feed(p, s + off, piece, &used);
    if (used > piece || p->kept > p->keep_cap)
      abort();
    if (rc == ATTN_HTTP_ERROR)
      return -1 - count;
    off += used;
    if (rc == ATTN_HTTP_DONE) {
      if (count < MAX_REPLIES)
        ends[count] = off;
      count++;
      attn_http_reply_start(p);
    } else if (used != piece) {
      abort(); /* MORE means every byte was used */
    }
  }
  return count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  attn_http_reply p;
  if (attn_http_reply_init(&p) < 0)
    return 0;
  char keep[7]; /* small: bodies run past it, as an error message may */
  p.keep = keep;
  p.keep_cap = sizeof keep;
  size_t step = 1 + data[0] % 17, a[MAX_REPLIES], b[MAX_REPLIES];
  const char *s = (const char *)data + 1;
  int whole = run(&p, s, size - 1, 0, a);
  int split = run(&p, s, size - 1, step, b);
  /* an error may come sooner or later with another split only when the
   * head passes its limit; below it both must agree */
  if (size < ATTN_HTTP_MAX_HEAD && whole != split)
    abort();
  for (int i = 0; i < whole && i < split && i < MAX_REPLIES; i++)
    if (a[i] != b[i])
      abort();
  attn_http_reply_free(&p);
  return 0;
}
