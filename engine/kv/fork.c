/*
 * fork.c — a session forked (kv.h, attn_kv_fork): a new session of the same
 * tenant and shape that holds its source's pages for the tokens it keeps,
 * shared, not copied. What a shared page costs whom, and the copy a write
 * into one makes first, are share.c's (kv_int.h, P1-P4).
 *
 * On a device a call's rows reach their pages in its job, after it was
 * admitted, so a fork made meanwhile would share pages whose rows are not
 * there yet: a source with calls running is not forked there
 * (ESESSION_CONFLICT, to retry). Once made, a shared page is never
 * written, so what its holders copy from it later is all there.
 */
#include "kv_int.h"

#include <stdio.h>
#include <string.h>

/* The request's own checks, before the lock. */
static int fork_args(const char *new_id, int64_t length, double ttl_s, attn_status *st) {
  int rc = attn_kv_id_check(new_id, strlen(new_id), st);
  if (rc)
    return rc;
  if (length < -1)
    return attn_status_set(st, ATTN_EINVAL, "length must be 0 or more, not %lld",
                           (long long)length);
  if (ttl_s > 1e9 || ttl_s != ttl_s)
    return attn_status_set(st, ATTN_EINVAL, "ttl_s must be a number of seconds above 0");
  return 0;
}

/* Each layer's tokens the fork keeps into n; EINVAL naming a layer shorter
 * than length. */
static int fork_lengths(const kv_session *src, int64_t length, int64_t *n, attn_status *st) {
  for (int64_t l = 0; l < src->shape.layers; l++) {
    n[l] = length < 0 ? src->layers[l].length : length;
    if (n[l] > src->layers[l].length)
      return attn_status_set(st, ATTN_EINVAL,
                             "layer %lld of session '%s' holds %lld tokens, fewer than length "
                             "%lld: fork at most its shortest layer's length, or leave length "
                             "out to keep each layer's own",
                             (long long)l, src->id, (long long)src->layers[l].length,
                             (long long)length);
  }
  return 0;
}

/* What the fork reserves (P2): a whole one all it does not ride on, the
 * full pages it shares; a grow one its partial last pages. */
static int64_t fork_need(const attn_kv_store *s, const kv_session *src, const int64_t *n) {
  int64_t full = 0, partial = 0;
  for (int64_t l = 0; l < src->shape.layers; l++) {
    full += n[l] / src->page_tokens;
    partial += n[l] % src->page_tokens != 0;
  }
  const int64_t u = src->unit;
  if (src->shape.grow)
    return partial * u;
  return (int64_t)(attn_kv_reserve_bytes(s, &src->shape) / s->pages.page_bytes) - full * u;
}

/* The fork's tables: the source's pages of its first n[l] tokens, held
 * once more, riding on the full ones (the source or one of its forks pays
 * for those already). */
static void share(attn_kv_store *s, kv_session *src, kv_session *ks, const int64_t *n) {
  for (int64_t l = 0; l < src->shape.layers; l++) {
    const kv_layer *from = &src->layers[l];
    kv_layer *L = &ks->layers[l];
    L->length = n[l];
    L->npages = (n[l] + src->page_tokens - 1) / src->page_tokens;
    L->absmax[0] = from->absmax[0];
    L->absmax[1] = from->absmax[1];
    for (int64_t p = 0; p < L->npages; p++) {
      L->ride[p] = (p + 1) * src->page_tokens <= n[l];
      for (int64_t h = 0; h < src->shape.heads_kv; h++) {
        const int64_t i = h * src->pages_per_head + p;
        attn__kvpages_hold(&s->pages, L->kp[i] = from->kp[i]);
        if (L->vp)
          attn__kvpages_hold(&s->pages, L->vp[i] = from->vp[i]);
      }
    }
  }
  attn__kv_kin_join(src, ks);
}

static int forked(attn_kv_store *s, kv_session *src, const char *new_id, int64_t length,
                  double ttl_s, double now, attn_status *st) {
  int64_t n[ATTN_KV_MAX_LAYERS];
  int rc = fork_lengths(src, length, n, st);
  if (rc == 0)
    rc = attn__kv_dev_settled(s, src, "fork", st);
  if (rc)
    return rc;
  if (attn__kv_find(s, src->tenant, new_id, now))
    return attn_status_set(st, ATTN_ESESSION_EXISTS,
                           "session '%s' exists; delete it first, or fork into another id", new_id);
  const int64_t need = fork_need(s, src, n);
  if (!attn__kv_tenant_fits(s, src->tenant, need))
    return attn__kv_tenant_refuse(s, src->tenant, need, false, st);
  kv_session *ks = attn__kv_insert_need(s, src->tenant, new_id, &src->shape,
                                        ttl_s > 0 ? ttl_s : src->ttl_s, now, need, st);
  if (!ks)
    return st->code;
  share(s, src, ks, n);
  src->expires = now + src->ttl_s; /* a fork is a use of its source */
  return 0;
}

int attn_kv_fork(attn_kv_store *s, const char *tenant, const char *id, const char *new_id,
                 int64_t length, double ttl_s, double now, attn_status *st) {
  int rc = fork_args(new_id, length, ttl_s, st);
  if (rc)
    return rc;
  pthread_mutex_lock(&s->mu);
  kv_session *src = attn__kv_find(s, tenant, id, now);
  rc = src ? forked(s, src, new_id, length, ttl_s, now, st)
           : attn_status_set(st, ATTN_ESESSION_NOT_FOUND,
                             "no session '%s' to fork: it was never made, was deleted, or "
                             "expired (ttl_s after its last use)",
                             id);
  pthread_mutex_unlock(&s->mu);
  return rc;
}
