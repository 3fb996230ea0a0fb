/*
 * file.c — what saving and loading session files share (file.h), and
 * exporting and importing a session (move.c) with them: the checksum, the
 * files' names, the directory, a session's rows moved out of and into its
 * pages, a session made whole.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

int attn__kvf_rows_out(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                       int64_t hk, int64_t end, void *page, kvf_rows_fn fn, void *arg,
                       attn_status *st) {
  const size_t row = attn__kv_xrow(&ks->shape, t);
  int rc = 0;
  for (int64_t j = 0, n; j < end && rc == 0; j += n) {
    n = attn__kv_span(ks, j, end);
    rc = attn__kv_rows_get(s, ks, L, t, hk, j, n, page, st);
    rc = rc ? rc : fn(arg, page, j, n, (size_t)n * row, st);
  }
  return rc;
}

int attn__kvf_rows_in(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t end, void *page, kvf_rows_fn fn, void *arg,
                      attn_status *st) {
  const size_t row = attn__kv_xrow(&ks->shape, t);
  int rc = 0;
  for (int64_t j = 0, n; j < end && rc == 0; j += n) {
    n = attn__kv_span(ks, j, end);
    rc = fn(arg, page, j, n, (size_t)n * row, st);
    rc = rc ? rc : attn__kv_rows_put(s, ks, L, t, hk, j, n, page, st);
  }
  return rc;
}

/* A grow session takes the pages of the lengths h gives, as its appends
 * would have (within the tenant's share when capped); a whole one has
 * them from its insert. attn__kv_remove gives back what a failure took. */
static int take_pages(attn_kv_store *s, kv_session *ks, const kvf_header *h, bool capped,
                      attn_status *st) {
  int64_t need = 0;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    need += attn__kv_grow_need(ks, &ks->layers[l], h->length[l]);
  if (capped && need > 0 && !attn__kv_tenant_fits(s, h->tenant, need))
    return attn__kv_tenant_refuse(s, h->tenant, need, true, st);
  for (int64_t l = 0; l < ks->shape.layers; l++)
    if (!attn__kv_grow(s, ks, &ks->layers[l], h->length[l]))
      return attn_status_set(
          st, ATTN_ESESSION_MEMORY,
          "session '%s' (reserve grow) holds tokens of %llu bytes, more than "
          "the %llu of the %llu bytes of session memory free",
          h->id, (unsigned long long)attn__kvpages_bytes(&s->pages, need),
          (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages - s->pages.reserved),
          (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages));
  return 0;
}

/* Under the lock: the session of h made and its pages taken (NULL with
 * st set when it cannot be), every layer marked as being written and read
 * by the fill to come: calls on it wait, and a delete or an expiry
 * meanwhile leaves its pages to the fill's end. */
static kv_session *install_begin(attn_kv_store *s, const kvf_header *h, double ttl, double now,
                                 bool capped, attn_status *st) {
  const int64_t need = (int64_t)(attn_kv_reserve_bytes(s, &h->shape) / s->pages.page_bytes);
  kv_session *ks = NULL;
  if (attn__kv_find(s, h->tenant, h->id, now))
    attn_status_set(st, ATTN_ESESSION_EXISTS,
                    "session '%s' exists; delete it first, or use another id", h->id);
  else if (capped && !attn__kv_tenant_fits(s, h->tenant, need))
    attn__kv_tenant_refuse(s, h->tenant, need, false, st);
  else if ((ks = attn__kv_insert(s, h->tenant, h->id, &h->shape, ttl, now, st)) &&
           take_pages(s, ks, h, capped, st)) {
    attn__kv_remove(s, h->tenant, h->id); /* no call reads it yet */
    ks = NULL;
  }
  for (int64_t l = 0; ks && l < ks->shape.layers; l++) {
    ks->layers[l].writing = true;
    ks->layers[l].readers++;
    ks->readers++;
  }
  return ks;
}

/* Under the lock: the filled session's lengths published (a layer cut by
 * a truncate meanwhile keeps the truncate's), or, the fill failed, the
 * session gone; either way its layers no longer written. */
static void install_end(attn_kv_store *s, kv_session *ks, const kvf_header *h, double ttl,
                        double now, bool ok) {
  for (int64_t l = 0; l < ks->shape.layers; l++) {
    kv_layer *L = &ks->layers[l];
    if (ok && !L->cut) {
      L->length = h->length[l];
      memcpy(L->absmax, h->absmax[l], sizeof h->absmax[l]);
    }
    L->writing = L->cut = false;
  }
  if (ok)
    ks->expires = now + fmin(h->left_s, ttl);
  else if (!ks->dead)
    attn__kv_remove(s, h->tenant, h->id);
}

int attn__kvf_install(attn_kv_store *s, const kvf_header *h, double ttl, double now, bool capped,
                      kvf_fill_fn fill, void *arg, attn_status *st) {
  pthread_mutex_lock(&s->mu);
  kv_session *ks = install_begin(s, h, ttl, now, capped, st);
  pthread_mutex_unlock(&s->mu);
  if (!ks)
    return st->code;
  /* a session's whole rows are copied without the lock: calls on others go on */
  int rc = fill(s, ks, arg, st);
  pthread_mutex_lock(&s->mu);
  install_end(s, ks, h, ttl, now, rc == 0);
  pthread_mutex_unlock(&s->mu);
  attn__kv_unread(s, ks); /* the calls that waited for it start */
  return rc;
}
