/*
 * file.c — what saving and loading session files share (file.h): the
 * checksum, the files' names, the directory.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t mix(uint64_t h, uint64_t w) {
  h = (h ^ w) * 0x100000001b3ull;
  return h ^ (h >> 32);
}

void attn__kvf_hash_add(kvf_hash *x, const void *p, size_t n) {
  const unsigned char *b = p;
  size_t have = (size_t)(x->n % 8);
  uint64_t w;
  x->n += n;
  if (have) { /* fill the word a previous add began */
    size_t k = 8 - have < n ? 8 - have : n;
    memcpy(x->tail + have, b, k);
    b += k;
    n -= k;
    if (have + k < 8)
      return;
    memcpy(&w, x->tail, 8);
    x->h = mix(x->h, w);
  }
  for (; n >= 8; b += 8, n -= 8) {
    memcpy(&w, b, 8);
    x->h = mix(x->h, w);
  }
  memcpy(x->tail, b, n);
}

uint64_t attn__kvf_hash_end(const kvf_hash *x) {
  uint64_t w = 0, h = x->h;
  if (x->n % 8) {
    memcpy(&w, x->tail, (size_t)(x->n % 8));
    h = mix(h, w);
  }
  return mix(h, x->n);
}

bool attn__kvf_tenant_ok(const char *t, size_t n) {
  if (n > ATTN_KV_TENANT_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)t[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  }
  return true;
}

void attn__kvf_file_name(const char *tenant, const char *id, char *buf, size_t cap) {
  snprintf(buf, cap, "%s@%s.kv", tenant, id);
}

size_t attn__kvf_row_bytes(const attn_kv_shape *sh, int t) {
  return (size_t)attn__kv_cols(sh, t) * attn_dtype_size(sh->dtype);
}

int attn__kvf_ctx_open(const attn_kv_store *s, const char *dir, kvf_ctx **pc, attn_status *st) {
  kvf_ctx *c = malloc(sizeof *c);
  if (!c)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory opening the session directory %s", dir);
  c->dir = dir;
  c->s = s;
  c->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (c->dfd < 0) {
    free(c);
    return attn_status_set(st, ATTN_EINVAL, "cannot open the session directory %s: %s", dir,
                           strerror(errno));
  }
  *pc = c;
  return 0;
}

void attn__kvf_ctx_close(kvf_ctx *c) {
  close(c->dfd);
  free(c);
}
