/*
 * quota.c — what each tenant's sessions reserve, and the cap on it
 * (attn_kv_set_tenant_cap): without one, a single tenant could reserve the
 * whole pool and lock every other out until its sessions expire.
 *
 * A store keeps one entry per tenant that reserves pages (a list: the
 * server's tenants are its API keys, at most a few dozen), added to when a
 * session is inserted (a grow session: as it takes pages) and taken from
 * when it is freed (a grow session: as it gives pages back) (so a deleted
 * session's pages count until its last reader is done, as they do in the
 * pool). An entry at zero is dropped. Under the store's lock, like the rest.
 */
#include "kv_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_tenant {
  char name[ATTN_KV_TENANT_MAX + 1];
  int64_t pages;
  struct kv_tenant *next;
};

static kv_tenant **tenant_slot(attn_kv_store *s, const char *tenant) {
  kv_tenant **pp = &s->tenants;
  while (*pp && strcmp((*pp)->name, tenant))
    pp = &(*pp)->next;
  return pp;
}

int64_t attn__kv_tenant_pages(attn_kv_store *s, const char *tenant) {
  kv_tenant *t = *tenant_slot(s, tenant);
  return t ? t->pages : 0;
}

int attn__kv_tenant_add(attn_kv_store *s, const char *tenant, int64_t pages) {
  kv_tenant **pp = tenant_slot(s, tenant);
  if (!*pp) {
    if (pages <= 0)
      return 0;
    if (!(*pp = calloc(1, sizeof **pp)))
      return -1;
    snprintf((*pp)->name, sizeof(*pp)->name, "%s", tenant);
  }
  (*pp)->pages += pages;
  if ((*pp)->pages <= 0) {
    kv_tenant *t = *pp;
    *pp = t->next;
    free(t);
  }
  return 0;
}

void attn__kv_tenants_free(attn_kv_store *s) {
  while (s->tenants) {
    kv_tenant *t = s->tenants;
    s->tenants = t->next;
    free(t);
  }
}

bool attn__kv_tenant_fits(attn_kv_store *s, const char *tenant, int64_t need) {
  return s->tenant_cap <= 0 || attn__kv_tenant_pages(s, tenant) + need <= s->tenant_cap;
}

int attn__kv_tenant_refuse(attn_kv_store *s, const char *tenant, int64_t need, bool append,
                           attn_status *st) {
  s->stats.tenant_cap_refused++;
  return attn_status_set(
      st, ATTN_ESESSION_MEMORY,
      "%s %llu bytes, and this API key's sessions reserve %llu of the %llu bytes one key may "
      "(--session-memory-per-key); delete or truncate one of them, or ask fewer %s",
      append ? "these tokens take pages of" : "this session reserves",
      (unsigned long long)attn__kvpages_bytes(&s->pages, need),
      (unsigned long long)attn__kvpages_bytes(&s->pages, attn__kv_tenant_pages(s, tenant)),
      (unsigned long long)attn__kvpages_bytes(&s->pages, s->tenant_cap),
      append ? "tokens; nothing was appended" : "max_tokens");
}

void attn_kv_set_tenant_cap(attn_kv_store *s, uint64_t bytes) {
  pthread_mutex_lock(&s->mu);
  s->tenant_cap = (int64_t)(bytes / s->pages.page_bytes);
  /* 0 pages is "no cap": a cap below a page (which refuses every create
   * anyway) stays a cap */
  if (bytes > 0 && s->tenant_cap == 0)
    s->tenant_cap = 1;
  pthread_mutex_unlock(&s->mu);
}

uint64_t attn_kv_tenant_reserved(attn_kv_store *s, const char *tenant) {
  pthread_mutex_lock(&s->mu);
  uint64_t used = attn__kvpages_bytes(&s->pages, attn__kv_tenant_pages(s, tenant));
  pthread_mutex_unlock(&s->mu);
  return used;
}
