/*
 * share.c — pages that forks share (kv_int.h, P1-P4): the ring of sessions
 * forked from one another, who pays for a shared slot and how a payment
 * passes, and the copy a write into a shared slot makes first.
 *
 * A fork shares its source's pages at the same places of its tables, so
 * the holders of a slot are the sessions of the ring whose table holds the
 * same page there; a ring is a handful of sessions (a beam, some samples),
 * walked whole. A copy is made under the store's lock: one slot's rows
 * below an append, once per slot a fork diverges in (host pages: a
 * memcpy; a device's: a synchronous copy on the device, made when the
 * call is planned, where a failed one can still refuse it: admit.c).
 */
#include "kv_int.h"

#include <string.h>

void attn__kv_kin_join(kv_session *src, kv_session *ks) {
  ks->kin = src->kin;
  src->kin = ks;
}

void attn__kv_kin_leave(kv_session *ks) {
  kv_session *k = ks;
  while (k->kin != ks)
    k = k->kin;
  k->kin = ks->kin;
  ks->kin = ks;
}

/* Head 0's K page stands for the slot: its pages are held together. */
bool attn__kv_slot_shared(const attn_kvpages *pool, const kv_layer *L, int64_t p) {
  return p < L->npages && attn__kvpages_refs(pool, L->kp[p]) > 1;
}

static bool full(const kv_session *ks, const kv_layer *L, int64_t p) {
  return (p + 1) * ks->page_tokens <= L->length;
}

/* Another holder of slot (l, p) of ks for which it is full and that rides
 * on it; NULL if none. */
static kv_session *rider(const kv_session *ks, int64_t l, int64_t p) {
  const void *page = ks->layers[l].kp[p];
  for (kv_session *k = ks->kin; k != ks; k = k->kin) {
    const kv_layer *L = &k->layers[l];
    if (p < L->npages && L->kp[p] == page && full(k, L, p) && L->ride[p])
      return k;
  }
  return NULL;
}

/* Pages added to ks's count, to the pool's and its tenant's (a count
 * grown under the caller's check: P3 holds the pool's below its pages). */
static void pay(attn_kv_store *s, kv_session *ks, int64_t pages) {
  ks->reserved_pages += pages;
  s->pages.reserved += pages;
  (void)attn__kv_tenant_add(s, ks->tenant, pages);
}

/* Slot (l, p) of ks stops being full for it: P4. ks keeps paying for it
 * (a whole session always pays for a slot, held or not; a grow one for a
 * slot it still holds), or stops (its end; a grow session's slot dropped
 * now). Returns the pages added to the pool's count. */
static int64_t unfill(attn_kv_store *s, kv_session *ks, int64_t l, int64_t p, bool keeps_paying,
                      bool apply) {
  kv_layer *L = &ks->layers[l];
  const int64_t u = ks->unit;
  if (L->ride[p]) {
    if (!keeps_paying)
      return 0; /* shrink lets it go without a payment */
    if (apply) {
      L->ride[p] = false;
      pay(s, ks, u);
    }
    return u;
  }
  kv_session *r = attn__kv_slot_shared(&s->pages, L, p) ? rider(ks, l, p) : NULL;
  if (!r)
    return 0;
  if (apply)
    r->layers[l].ride[p] = false;
  if (keeps_paying) {
    if (apply)
      pay(s, r, u);
    return u;
  }
  if (apply) { /* moved: neither the pool's count nor the tenant's changes */
    r->reserved_pages += u;
    ks->reserved_pages -= u;
    L->ride[p] = true; /* so that shrink does not give it back again */
  }
  return 0;
}

int64_t attn__kv_cut_need(attn_kv_store *s, kv_session *ks, int64_t l, int64_t length, bool apply) {
  kv_layer *L = &ks->layers[l];
  const int64_t pt = ks->page_tokens, keep = (length + pt - 1) / pt;
  int64_t need = 0;
  for (int64_t p = length / pt; p < L->npages && full(ks, L, p); p++)
    need += unfill(s, ks, l, p, !ks->shape.grow || p < keep || L->readers > 0, apply);
  return need;
}

/* At its end a session pays for nothing: each full slot it pays for that a
 * rider holds is moved to the rider (P4). */
void attn__kv_pass_all(attn_kv_store *s, kv_session *ks) {
  if (ks->kin == ks)
    return;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int64_t p = 0; p < ks->layers[l].npages && full(ks, &ks->layers[l], p); p++)
      if (!ks->layers[l].ride[p])
        (void)unfill(s, ks, l, p, false, true);
}

/* The held slots an append over [from, to) writes: [from / pt, end). */
static int64_t written_end(const kv_session *ks, const kv_layer *L, int64_t to) {
  const int64_t want = (to + ks->page_tokens - 1) / ks->page_tokens;
  return want < L->npages ? want : L->npages;
}

bool attn__kv_cow_needed(const attn_kvpages *pool, const kv_session *ks, const kv_layer *L,
                         int64_t from, int64_t to) {
  for (int64_t p = from / ks->page_tokens; p < written_end(ks, L, to); p++)
    if (attn__kv_slot_shared(pool, L, p))
      return true;
  return false;
}

/* Page *slot replaced by a fresh one holding its first `rows` rows (a
 * quantized session's: their codes, and their scales after the page's
 * rows, engine.h); on a failed copy (a device's) *slot stays as it was. */
static int copy_page(attn_kv_store *s, const kv_session *ks, void **slot, int64_t rows,
                     attn_status *st) {
  char *fresh = attn__kvpages_take(&s->pages);
  const size_t es = ks->shape.kv_quant ? 1 : attn_dtype_size(ks->shape.dtype);
  const size_t bytes = (size_t)rows * (size_t)ks->pitch * es;
  int rc = rows ? attn__kvpages_copy(&s->pages, fresh, bytes, *slot, bytes, bytes, 1, st) : 0;
  if (rc == 0 && rows && ks->shape.kv_quant) {
    const size_t at = attn_kv_quant_scales_at(ks->page_tokens, ks->pitch),
                 n = (size_t)rows * sizeof(float);
    rc = attn__kvpages_copy(&s->pages, fresh + at, n, (const char *)*slot + at, n, n, 1, st);
  }
  void *gone = rc ? fresh : *slot;
  *slot = rc ? *slot : fresh;
  attn__kvpages_give(&s->pages, gone);
  return rc;
}

/* The slot was partial for ks (it writes it), so ks pays for it already
 * (P2): the fresh pages come out of its own reservation (P3). On a failed
 * copy the error is returned: the append that would have written into the
 * slot must not. */
int attn__kv_cow(attn_kv_store *s, const kv_session *ks, kv_layer *L, int64_t from, int64_t to,
                 attn_status *st) {
  const int64_t pt = ks->page_tokens;
  for (int64_t p = from / pt; p < written_end(ks, L, to); p++) {
    if (!attn__kv_slot_shared(&s->pages, L, p))
      continue;
    const int64_t rows = from > p * pt ? from - p * pt : 0;
    /* head 0's K page last: it stands for the slot, so a slot whose
     * copy failed part way still counts as shared, and the next append
     * copies it again, whole */
    for (int64_t h = ks->shape.heads_kv - 1; h >= 0; h--) {
      int rc = L->vp ? copy_page(s, ks, &L->vp[h * ks->pages_per_head + p], rows, st) : 0;
      if (rc == 0)
        rc = copy_page(s, ks, &L->kp[h * ks->pages_per_head + p], rows, st);
      if (rc)
        return rc;
    }
  }
  return 0;
}

int64_t attn__kv_shared_pages(const attn_kvpages *pool, const kv_session *ks) {
  int64_t n = 0;
  for (int64_t l = 0; l < ks->shape.layers; l++)
    for (int64_t p = 0; p < ks->layers[l].npages; p++)
      n += attn__kv_slot_shared(pool, &ks->layers[l], p);
  return n * ks->unit;
}
