/*
 * store.c — a session store's table of sessions and their life (kv.h):
 * made with their reservation, found by (tenant, id), expired by TTL,
 * truncated, deleted. In that order, by section: the store opened and
 * closed; the table; a session made, described, cut and deleted; the end
 * of a reader. A shape's pages and checks are shape.c's, a layer's rows
 * rows.c's.
 */
#include "handle.h"
#include "kv_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- opening and closing ------------------------------------------------- */

/* The pages on a device when one lends them, else in host memory; a
 * device that could but refused (too little memory) is said on stderr.
 * A device finds a page's number from its address with
 * ATTN_KV_PAGE_BYTES: smaller pages stay in host memory. */
static int open_pages(attn_kv_store *s, attn_engine *e, uint64_t bytes, size_t page_bytes,
                      const char *backend, attn_status *st) {
  const bool any = !backend || !strcmp(backend, "auto");
  if (e && any && page_bytes == ATTN_KV_PAGE_BYTES) {
    attn_status why = {0};
    int rc = attn__kvpages_open(&s->pages, bytes, page_bytes, e, &why);
    if (rc == 0)
      return 0;
    if (rc != ATTN_EUNSUPPORTED)
      fprintf(stderr, "attn: session pages stay in host memory: %s\n", why.message);
  } else if (!any && strcmp(backend, "cpu")) {
    return attn_status_set(st, ATTN_EINVAL, "a session store is on auto or cpu, not %s", backend);
  }
  return attn__kvpages_open(&s->pages, bytes, page_bytes, NULL, st);
}

_Static_assert(ATTN_KV_PAGE_BYTES_MAX == ATTN_KV_PAGE_BYTES, "kv.h's largest page is the pool's");

bool attn_kv_page_bytes_ok(uint64_t b) {
  return b >= ATTN_KV_PAGE_BYTES_MIN && b <= ATTN_KV_PAGE_BYTES && (b & (b - 1)) == 0;
}

int attn_kv_open(attn_engine *e, uint64_t bytes, bool batch, const char *backend,
                 attn_kv_store **ps, attn_status *st) {
  return attn_kv_open_paged(e, bytes, 0, batch, backend, ps, st);
}

int attn_kv_open_paged(attn_engine *e, uint64_t bytes, size_t page_bytes, bool batch,
                       const char *backend, attn_kv_store **ps, attn_status *st) {
  page_bytes = page_bytes ? page_bytes : ATTN_KV_PAGE_BYTES;
  if (!attn_kv_page_bytes_ok(page_bytes))
    return attn_status_set(
        st, ATTN_EINVAL, "a session page is %zu, %zu or %zu bytes (16K, 32K or 64K), not %zu",
        ATTN_KV_PAGE_BYTES_MIN, ATTN_KV_PAGE_BYTES_MIN * 2, ATTN_KV_PAGE_BYTES, page_bytes);
  attn_kv_store *s = calloc(1, sizeof *s);
  if (!s)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory opening the session store");
  int rc = open_pages(s, e, bytes, page_bytes, backend, st);
  if (rc) {
    free(s);
    return rc;
  }
  s->engine = e;
  s->batch = batch;
  pthread_mutex_init(&s->mu, NULL);
  *ps = s;
  return 0;
}

static void session_free(attn_kv_store *s, kv_session *ks) {
  if (ks->layers)
    attn__kv_pass_all(s, ks); /* before its pages go: they say what it pays for */
  attn__kv_kin_leave(ks);
  for (int64_t l = 0; ks->layers && l < ks->shape.layers; l++) {
    kv_layer *L = &ks->layers[l];
    /* the pages it holds only: a grow session's tables may be huge and all but empty */
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t p = 0; p < L->npages; p++) {
        const int64_t i = h * ks->pages_per_head + p;
        attn__kvpages_give(&s->pages, L->kp[i]);
        if (L->vp)
          attn__kvpages_give(&s->pages, L->vp[i]);
      }
    free(L->kp);
    free(L->vp);
    free(L->ride);
  }
  attn__kvpages_unreserve(&s->pages, ks->reserved_pages);
  attn__kv_tenant_add(s, ks->tenant, -ks->reserved_pages);
  free(ks->layers);
  free(ks);
}

void attn_kv_close(attn_kv_store *s) {
  if (!s)
    return;
  for (int b = 0; b < KV_BUCKETS; b++)
    while (s->buckets[b]) {
      kv_session *ks = s->buckets[b];
      s->buckets[b] = ks->next;
      session_free(s, ks);
    }
  attn__kv_tenants_free(s);
  attn__kvpages_close(&s->pages);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- the table ----------------------------------------------------------- */

static unsigned bucket_of(const char *tenant, const char *id) {
  uint32_t h = 2166136261u; /* FNV-1a over tenant, a NUL, id */
  for (const char *p = tenant; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  h *= 16777619u;
  for (const char *p = id; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  return h % KV_BUCKETS;
}

static kv_session **slot_of(attn_kv_store *s, const char *tenant, const char *id) {
  kv_session **pp = &s->buckets[bucket_of(tenant, id)];
  while (*pp && (strcmp((*pp)->tenant, tenant) || strcmp((*pp)->id, id)))
    pp = &(*pp)->next;
  return pp;
}

/* Out of the table; freed now, or by its last reader. */
static void unlink_session(attn_kv_store *s, kv_session **pp) {
  kv_session *ks = *pp;
  *pp = ks->next;
  s->nsessions--;
  if (ks->readers > 0)
    ks->dead = true;
  else
    session_free(s, ks);
}

/* Drops every session past its TTL; under the lock. */
static int64_t expire_locked(attn_kv_store *s, double now) {
  int64_t n = 0;
  for (int b = 0; b < KV_BUCKETS; b++)
    for (kv_session **pp = &s->buckets[b]; *pp;)
      if ((*pp)->expires <= now) {
        unlink_session(s, pp);
        n++;
      } else {
        pp = &(*pp)->next;
      }
  s->stats.expired += (uint64_t)n;
  return n;
}

void attn__kv_remove(attn_kv_store *s, const char *tenant, const char *id) {
  kv_session **pp = slot_of(s, tenant, id);
  if (*pp)
    unlink_session(s, pp);
}

kv_session *attn__kv_find(attn_kv_store *s, const char *tenant, const char *id, double now) {
  kv_session **pp = slot_of(s, tenant, id);
  if (*pp && (*pp)->expires <= now) {
    unlink_session(s, pp);
    s->stats.expired++;
  }
  return *pp;
}

/* ---- a session made, described, cut and deleted -------------------------- */

/* The layers and their page tables (a latent session's: K's only). */
static int layers_alloc(kv_session *ks) {
  const size_t n = (size_t)(ks->shape.heads_kv * ks->pages_per_head);
  ks->layers = calloc((size_t)ks->shape.layers, sizeof *ks->layers);
  if (!ks->layers)
    return -1;
  for (int64_t l = 0; l < ks->shape.layers; l++) {
    kv_layer *L = &ks->layers[l];
    L->kp = calloc(n, sizeof(void *));
    L->vp = ks->shape.v_from_k ? NULL : calloc(n, sizeof(void *));
    L->ride = calloc((size_t)ks->pages_per_head, sizeof *L->ride);
    if (!L->kp || (!L->vp && !ks->shape.v_from_k) || !L->ride)
      return -1;
  }
  return 0;
}

kv_session *attn__kv_insert(attn_kv_store *s, const char *tenant, const char *id,
                            const attn_kv_shape *sh, double ttl_s, double now, attn_status *st) {
  return attn__kv_insert_need(s, tenant, id, sh, ttl_s, now, attn__kv_reserve_pages(s, sh), st);
}

kv_session *attn__kv_insert_need(attn_kv_store *s, const char *tenant, const char *id,
                                 const attn_kv_shape *sh, double ttl_s, double now, int64_t need,
                                 attn_status *st) {
  /* sessions past their TTL that no sweep has dropped yet give way first */
  if (!attn__kvpages_reserve(&s->pages, need) &&
      (expire_locked(s, now) == 0 || !attn__kvpages_reserve(&s->pages, need))) {
    attn_status_set(
        st, ATTN_ESESSION_MEMORY,
        "this session reserves %llu bytes, and %llu of the %llu bytes of session "
        "memory are free (--session-memory); delete a session, ask fewer "
        "max_tokens, or retry when one has expired",
        (unsigned long long)attn__kvpages_bytes(&s->pages, need),
        (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages - s->pages.reserved),
        (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages));
    return NULL;
  }
  /* counted before the session exists, so that session_free takes it back */
  kv_session *ks = attn__kv_tenant_add(s, tenant, need) == 0 ? calloc(1, sizeof *ks) : NULL;
  if (ks) {
    ks->kin = ks;
    snprintf(ks->tenant, sizeof ks->tenant, "%s", tenant);
    snprintf(ks->id, sizeof ks->id, "%s", id);
    ks->shape = *sh;
    ks->shape.head_dim_v = attn_kv_shape_dv(sh); /* what attn_kv_info reports: set, never 0 */
    ks->ttl_s = ttl_s;
    ks->expires = now + ttl_s;
    ks->page_tokens = attn__kv_page_tokens(s, sh);
    ks->pages_per_head = attn__kv_pages_per_head(s, sh);
    ks->pitch = attn__kv_pitch(s, sh);
    ks->unit = sh->heads_kv * attn__kv_tensors(sh);
    ks->reserved_pages = need;
  }
  if (!ks || layers_alloc(ks) < 0) {
    if (ks)
      session_free(s, ks);
    else {
      attn__kvpages_unreserve(&s->pages, need);
      attn__kv_tenant_add(s, tenant, -need);
    }
    attn_status_set(st, ATTN_ENOMEM, "out of memory making a session");
    return NULL;
  }
  kv_session **pp = slot_of(s, tenant, id);
  ks->next = *pp;
  *pp = ks;
  s->nsessions++;
  return ks;
}

static bool same_params(const kv_session *ks, const attn_kv_shape *sh, double ttl_s) {
  const attn_kv_shape *a = &ks->shape;
  return a->heads_kv == sh->heads_kv && a->head_dim == sh->head_dim &&
         attn_kv_shape_dv(a) == attn_kv_shape_dv(sh) && a->v_from_k == sh->v_from_k &&
         a->dtype == sh->dtype && a->kv_quant == sh->kv_quant && a->layers == sh->layers &&
         a->max_tokens == sh->max_tokens && a->grow == sh->grow && ks->ttl_s == ttl_s;
}

static int exists_error(const kv_session *ks, attn_status *st) {
  const attn_kv_shape *a = &ks->shape;
  return attn_status_set(st, ATTN_ESESSION_EXISTS,
                         "session '%s' exists with other parameters (heads_kv %lld, head_dim "
                         "%lld, head_dim_v %lld%s, dtype %s, kv_dtype %s, layers %lld, max_tokens "
                         "%lld, ttl_s %g, reserve %s); delete it first, or use another id",
                         ks->id, (long long)a->heads_kv, (long long)a->head_dim,
                         (long long)attn_kv_shape_dv(a), a->v_from_k ? " (v_from_k)" : "",
                         attn_dtype_name(a->dtype), attn_kv_shape_kv_dtype(a), (long long)a->layers,
                         (long long)a->max_tokens, ks->ttl_s, a->grow ? "grow" : "whole");
}

/* A new session of tenant must fit under the store's per-tenant cap (as
 * in attn__kv_insert, its sessions past their TTL give way first). Loading
 * saved sessions is not held to it: they were made under the cap of then. */
static int tenant_check(attn_kv_store *s, const char *tenant, const attn_kv_shape *sh, double now,
                        attn_status *st) {
  int64_t need = attn__kv_reserve_pages(s, sh);
  if (attn__kv_tenant_fits(s, tenant, need) ||
      (expire_locked(s, now) > 0 && attn__kv_tenant_fits(s, tenant, need)))
    return 0;
  return attn__kv_tenant_refuse(s, tenant, need, false, st);
}

int attn_kv_create(attn_kv_store *s, const char *tenant, const char *id, const attn_kv_shape *sh,
                   double ttl_s, double now, bool *created, attn_status *st) {
  int rc = attn_kv_id_check(id, strlen(id), st);
  if (rc == 0)
    rc = attn__kv_shape_check(sh, st);
  if (rc == 0)
    rc = attn__kv_computable(s, sh, st);
  if (rc == 0 && !(ttl_s > 0 && ttl_s <= 1e9))
    rc = attn_status_set(st, ATTN_EINVAL, "ttl_s must be a number of seconds above 0");
  if (rc)
    return rc;
  *created = false;
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, tenant, id, now);
  if (ks && same_params(ks, sh, ttl_s))
    ks->expires = now + ttl_s; /* a retried create is a use */
  else if (ks)
    rc = exists_error(ks, st);
  else if ((rc = tenant_check(s, tenant, sh, now, st)) == 0 &&
           attn__kv_insert(s, tenant, id, sh, ttl_s, now, st))
    *created = true;
  else if (rc == 0)
    rc = st ? st->code : ATTN_ENOMEM;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int not_found(const char *id, attn_status *st) {
  return attn_status_set(st, ATTN_ESESSION_NOT_FOUND,
                         "no session '%s': it was never made, was deleted, or expired "
                         "(ttl_s after its last use)",
                         id);
}

void attn__kv_info_of(const attn_kv_store *s, const kv_session *ks, attn_kv_info *info) {
  snprintf(info->tenant, sizeof info->tenant, "%s", ks->tenant);
  snprintf(info->id, sizeof info->id, "%s", ks->id);
  info->shape = ks->shape;
  info->ttl_s = ks->ttl_s;
  info->expires = ks->expires;
  info->reserved_bytes = attn__kvpages_bytes(&s->pages, ks->reserved_pages);
  info->shared_bytes = 0;
  info->tokens = 0;
  int64_t pages = 0; /* per KV head and tensor */
  for (int64_t l = 0; l < ks->shape.layers; l++) {
    info->tokens += ks->layers[l].length;
    pages += (ks->layers[l].length + ks->page_tokens - 1) / ks->page_tokens;
  }
  info->used_bytes = attn__kvpages_bytes(&s->pages, pages * ks->unit);
}

/* attn__kv_info_of with what the pool knows: the pages others hold too. */
static void describe(const attn_kv_store *s, const kv_session *ks, attn_kv_info *info) {
  attn__kv_info_of(s, ks, info);
  info->shared_bytes = attn__kvpages_bytes(&s->pages, attn__kv_shared_pages(&s->pages, ks));
}

int attn_kv_get(attn_kv_store *s, const char *tenant, const char *id, double now,
                attn_kv_info *info, int64_t *lengths, int64_t cap, attn_status *st) {
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, tenant, id, now);
  if (ks) {
    describe(s, ks, info);
    for (int64_t l = 0; lengths && l < cap && l < ks->shape.layers; l++)
      lengths[l] = ks->layers[l].length;
  }
  pthread_mutex_unlock(&s->mu);
  return ks ? 0 : not_found(id, st);
}

int attn_kv_delete(attn_kv_store *s, const char *tenant, const char *id, double now,
                   attn_status *st) {
  pthread_mutex_lock(&s->mu);
  bool found = attn__kv_find(s, tenant, id, now) != NULL; /* an expired one is gone */
  if (found)
    attn__kv_remove(s, tenant, id);
  pthread_mutex_unlock(&s->mu);
  return found ? 0 : not_found(id, st);
}

/* A grow session's reservation of pages it gave back, given back too. */
static void unbook(attn_kv_store *s, kv_session *ks, int64_t pages) {
  if (!ks->shape.grow || pages <= 0)
    return;
  attn__kvpages_unreserve(&s->pages, pages);
  attn__kv_tenant_add(s, ks->tenant, -pages);
  ks->reserved_pages -= pages;
}

/* Gives back the pages of L past its length, unless a reader may see them
 * (a slot ridden on was never paid for: P2). */
static void shrink(attn_kv_store *s, kv_session *ks, kv_layer *L) {
  if (L->readers > 0)
    return;
  int64_t keep = (L->length + ks->page_tokens - 1) / ks->page_tokens, paid = 0;
  for (int64_t p = keep; p < L->npages; p++) {
    paid += !L->ride[p];
    L->ride[p] = false;
  }
  unbook(s, ks, paid * ks->unit);
  for (int64_t h = 0; h < ks->shape.heads_kv; h++)
    for (int64_t p = keep; p < L->npages; p++) {
      int64_t i = h * ks->pages_per_head + p;
      attn__kvpages_give(&s->pages, L->kp[i]);
      L->kp[i] = NULL;
      if (L->vp) {
        attn__kvpages_give(&s->pages, L->vp[i]);
        L->vp[i] = NULL;
      }
    }
  L->npages = keep < L->npages ? keep : L->npages;
}

/* A truncate below pages ks shares may make it, or a fork it passes its
 * payment to, pay for pages it rode on (kv_int.h, P4): they must fit the
 * pool and the tenant's cap, or nothing is cut. */
static int cut_check(attn_kv_store *s, kv_session *ks, int64_t length, attn_status *st) {
  int64_t need = 0;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    if (ks->layers[l].length > length)
      need += attn__kv_cut_need(s, ks, l, length, false);
  if (need == 0)
    return 0;
  const bool capped = !attn__kv_tenant_fits(s, ks->tenant, need);
  const int64_t free_pages = s->pages.npages - s->pages.reserved;
  if (!capped && need <= free_pages)
    return 0;
  s->stats.tenant_cap_refused += capped;
  int64_t room = capped ? s->tenant_cap - attn__kv_tenant_pages(s, ks->tenant) : free_pages;
  room = room > 0 ? room : 0;
  return attn_status_set(
      st, ATTN_ESESSION_MEMORY,
      "cutting session '%s' below pages it shares with its forks makes it or a fork reserve %llu "
      "more bytes (pages each may then have to copy), and %s %llu bytes; nothing was cut: delete "
      "a session, or cut less",
      ks->id, (unsigned long long)attn__kvpages_bytes(&s->pages, need),
      capped ? "this API key's sessions may reserve (--session-memory-per-key) another"
             : "the session memory (--session-memory) has",
      (unsigned long long)attn__kvpages_bytes(&s->pages, room));
}

int attn_kv_truncate(attn_kv_store *s, const char *tenant, const char *id, int64_t length,
                     double now, attn_status *st) {
  if (length < 0)
    return attn_status_set(st, ATTN_EINVAL, "length must be 0 or more, not %lld",
                           (long long)length);
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, tenant, id, now);
  int rc = ks ? cut_check(s, ks, length, st) : not_found(id, st);
  for (int64_t l = 0; rc == 0 && l < ks->shape.layers; l++) {
    kv_layer *L = &ks->layers[l];
    if (L->length > length) {
      (void)attn__kv_cut_need(s, ks, l, length, true);
      L->length = length;
      L->cut = L->writing; /* an append being stored came first: it is cut too */
      shrink(s, ks, L);
    }
  }
  if (rc == 0)
    ks->expires = now + ks->ttl_s;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int64_t attn_kv_list(attn_kv_store *s, const char *tenant, double now,
                     void (*fn)(const attn_kv_info *info, const int64_t *lengths, void *arg),
                     void *arg) {
  int64_t n = 0, lengths[ATTN_KV_MAX_LAYERS];
  attn_kv_info info;
  pthread_mutex_lock(&s->mu);
  for (int b = 0; b < KV_BUCKETS; b++)
    for (kv_session *ks = s->buckets[b]; ks; ks = ks->next)
      if ((!tenant || !strcmp(ks->tenant, tenant)) && ks->expires > now) {
        describe(s, ks, &info);
        for (int64_t l = 0; l < ks->shape.layers; l++)
          lengths[l] = ks->layers[l].length;
        fn(&info, lengths, arg);
        n++;
      }
  pthread_mutex_unlock(&s->mu);
  return n;
}

int64_t attn_kv_expire(attn_kv_store *s, double now) {
  pthread_mutex_lock(&s->mu);
  int64_t n = expire_locked(s, now);
  attn__kvpages_trim(&s->pages, now); /* this is the server's sweep */
  pthread_mutex_unlock(&s->mu);
  return n;
}

void attn_kv_stats_get(attn_kv_store *s, attn_kv_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->stats;
  out->sessions = s->nsessions;
  out->page_bytes = (int64_t)s->pages.page_bytes;
  out->where = s->pages.dev ? s->pages.dev->ops.name : "host";
  out->pool_bytes = attn__kvpages_bytes(&s->pages, s->pages.npages);
  out->reserved_bytes = attn__kvpages_bytes(&s->pages, s->pages.reserved);
  out->used_bytes = attn__kvpages_bytes(&s->pages, s->pages.npages - s->pages.nfree);
  out->waiting = 0;
  for (const kv_pending *p = s->pending; p; p = p->next)
    out->waiting++;
  for (const kv_pending *p = s->parked; p; p = p->next)
    out->waiting++;
  out->tenant_cap_bytes = attn__kvpages_bytes(&s->pages, s->tenant_cap);
  out->quantized_bytes = 0;
  for (int b = 0; b < KV_BUCKETS; b++)
    for (const kv_session *ks = s->buckets[b]; ks; ks = ks->next)
      if (ks->shape.kv_quant)
        out->quantized_bytes += attn__kvpages_bytes(&s->pages, ks->reserved_pages);
  out->returned_bytes = s->pages.returned;
  out->shared_bytes = attn__kvpages_bytes(&s->pages, s->pages.nshared);
  out->saved_bytes = attn__kvpages_bytes(&s->pages, s->pages.extra);
  pthread_mutex_unlock(&s->mu);
}

/* ---- the end of a reader ------------------------------------------------ */

void attn__kv_reader_done(attn_kv_store *s, kv_session *ks, kv_layer *L) {
  if (--L->readers == 0) {
    L->read_hi = 0;
    if (!ks->dead)
      shrink(s, ks, L);
  }
  if (--ks->readers == 0 && ks->dead)
    session_free(s, ks);
}
