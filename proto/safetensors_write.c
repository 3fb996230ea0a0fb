/*
 * safetensors_write.c — the binary codec's writing half: replies as
 * safetensors files (their header, the 8-byte length, the padding, and
 * the outputs as parts sent where the engine wrote them), and the framing
 * the client's request encoder shares. safetensors.c reads them.
 */
#include "internal.h"
#include "proto.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t attn__st_put_entry(char *h, size_t cap, size_t o, const char *name, const char *dtype,
                          const int64_t *shape, int rank, size_t begin, size_t end) {
  if (o >= cap)
    return o;
  o += (size_t)snprintf(h + o, cap - o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", o > 1 ? "," : "",
                        name, dtype);
  for (int i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(h + o, cap - o, i ? ",%lld" : "%lld", (long long)shape[i]);
  if (o < cap)
    o += (size_t)snprintf(h + o, cap - o, "],\"data_offsets\":[%zu,%zu]}", begin, end);
  return o;
}

int attn__st_head(const char *h, size_t n, size_t extra, const char *what, void **pbuf,
                  size_t *plen, attn_status *st) {
  /* Data starting at a multiple of 8 keeps every tensor of a file read
   * whole into aligned memory usable in place. */
  size_t padded = (n + 7) & ~(size_t)7, head = 8 + padded;
  unsigned char *buf = malloc(head + extra);
  if (!buf)
    return attn_status_set(st, ATTN_PROTO_ENOMEM, "out of memory for the %zu-byte safetensors %s",
                           head + extra, what);
  for (int i = 0; i < 8; i++)
    buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  memcpy(buf + 8, h, n);
  memset(buf + 8 + n, ' ', padded - n);
  *pbuf = buf;
  *plen = head;
  return 0;
}

int attn__st_frame(const char *h, size_t n, const void *const *parts, const size_t *sizes,
                   int nparts, const char *what, void **pbuf, size_t *plen, attn_status *st) {
  size_t data = 0, head;
  for (int i = 0; i < nparts; i++)
    data += sizes[i];
  int rc = attn__st_head(h, n, data, what, pbuf, &head, st);
  if (rc < 0)
    return rc;
  unsigned char *d = (unsigned char *)*pbuf + head;
  for (int i = 0; i < nparts; i++) {
    memcpy(d, parts[i], sizes[i]);
    d += sizes[i];
  }
  *plen = head + data;
  return 0;
}

_Static_assert(ATTN_PROTO_MAX_PARTS >= ATTN__MAX_OUTS, "a part per output at most");

/* The reply's header (h, *hn bytes) and where its tensors lie; their
 * count, or an error. */
static int reply_layout(const attn_proto_req *pr, char *h, size_t cap, size_t *hn,
                        attn_proto_part parts[ATTN__MAX_OUTS], attn_status *st) {
  attn__out t[ATTN__MAX_OUTS];
  int n = pr->rank < 1 || pr->rank > 4 || !attn_dtype_size(pr->req.dtype)
              ? 0
              : attn__reply_outs(pr, false, t);
  for (int i = 0; i < n; i++)
    if (!t[i].data)
      n = 0;
  if (!n)
    return attn_status_set(st, ATTN_EINVAL,
                           "nothing to encode: the request holds no decoded result");
  /* attn_proto_build allocated these very sizes, so they cannot overflow. */
  size_t off = 0, o = (size_t)snprintf(h, cap, "{");
  for (int i = 0; i < n; i++) {
    parts[i] = (attn_proto_part){t[i].data, t[i].count * attn_dtype_size(t[i].dtype)};
    o = attn__st_put_entry(h, cap, o, t[i].name, attn_dtype_name(t[i].dtype), t[i].shape, t[i].rank,
                           off, off + parts[i].len);
    off += parts[i].len;
  }
  if (pr->reply_meta && *pr->reply_meta && o < cap)
    o += (size_t)snprintf(h + o, cap - o, ",\"__metadata__\":{%s}", pr->reply_meta);
  if (o < cap)
    o += (size_t)snprintf(h + o, cap - o, "}");
  if (o >= cap)
    return attn_status_set(st, ATTN_EINVAL, "safetensors header over %zu bytes", cap);
  *hn = o;
  return n;
}

/* Parts that lie one after the other in memory become one: the outputs
 * share one buffer (O, then m, l, lse), so most replies are two sends. */
static int join_adjacent(attn_proto_part *parts, int n) {
  int k = 0;
  for (int i = 1; i < n; i++) {
    if ((const char *)parts[k].data + parts[k].len == parts[i].data)
      parts[k].len += parts[i].len;
    else
      parts[++k] = parts[i];
  }
  return n ? k + 1 : 0;
}

int attn_proto_encode_safetensors_parts(const attn_proto_req *pr, void **phead, size_t *phlen,
                                        attn_proto_part parts[ATTN_PROTO_MAX_PARTS], int *nparts,
                                        attn_status *st) {
  *phead = NULL;
  *phlen = 0;
  *nparts = 0;
  char h[4096]; /* a batch call's lengths ride in __metadata__ */
  size_t hn = 0;
  int n = reply_layout(pr, h, sizeof h, &hn, parts, st);
  int rc = n < 0 ? n : attn__st_head(h, hn, 0, "reply", phead, phlen, st);
  if (rc < 0)
    return rc;
  *nparts = join_adjacent(parts, n);
  return 0;
}

int attn_proto_encode_safetensors(const attn_proto_req *pr, void **pbuf, size_t *plen,
                                  attn_status *st) {
  *pbuf = NULL;
  *plen = 0;
  char h[4096]; /* a batch call's lengths ride in __metadata__ */
  size_t hn = 0;
  attn_proto_part p[ATTN__MAX_OUTS];
  int n = reply_layout(pr, h, sizeof h, &hn, p, st);
  if (n < 0)
    return n;
  const void *parts[ATTN__MAX_OUTS];
  size_t sizes[ATTN__MAX_OUTS];
  for (int i = 0; i < n; i++)
    parts[i] = p[i].data, sizes[i] = p[i].len;
  return attn__st_frame(h, hn, parts, sizes, n, "reply", pbuf, plen, st);
}
