/*
 * admit.c — a session call (kv.h, attn_kv_submit) checked and admitted:
 * its entries checked all together, then admitted (their new tokens to
 * append, or found there already, bit for bit: a replay), parked, or
 * refused. sched.c stores an admitted call's new rows and starts its job.
 *
 * The store's lock is held only to check and to book: an append takes its
 * pages and marks its layer as being written under the lock, copies its
 * rows without it, and publishes the layer's new length under it again. A
 * call that cannot be admitted yet — it would overwrite keys a running call
 * reads (after a truncate), a layer it names is being written, or an
 * earlier call on one of its layers waits — is parked in the store, never
 * waited for on the caller's thread, and admitted (or refused, through its
 * done) by the thread that ends what it waited for. So calls on one layer
 * are admitted in arrival order and never block a thread another caller
 * needs.
 */
#include "check.h"
#include "kv_int.h"
#include "request_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks before the lock -------------------------------------------- */

/* The entries' new rows tile k and v in order, every row used once, as
 * cu_seqlens_kv would lay them out. Whether v comes too is the sessions'
 * to say (a latent one takes k only: fits_session). */
static int new_rows_check(const attn_kv_call *c, attn_status *st) {
  int64_t at = 0;
  for (int64_t e = 0; e < c->nentries; e++) {
    const attn_kv_entry *en = &c->entries[e];
    if (en->n_new < 0 || en->kv_off != at || (en->n_new > 0 && !c->k_new))
      return attn_status_set(st, ATTN_EINVAL,
                             "session %lld's new keys must be rows %lld and on of k and v, "
                             "after the previous session's (not %lld + %lld)",
                             (long long)e, (long long)at, (long long)en->kv_off,
                             (long long)en->n_new);
    at += en->n_new;
  }
  if (at != c->total_new)
    return attn_status_set(st, ATTN_EINVAL, "k and v hold %lld new rows but the sessions take %lld",
                           (long long)c->total_new, (long long)at);
  return 0;
}

int attn__kv_call_check(const attn_kv_call *c, attn_status *st) {
  const attn_request *r = &c->req;
  if (c->nentries < 1 || !c->entries || !c->tenant)
    return attn_status_set(st, ATTN_EINVAL, "a session call names at least one session");
  if (c->layer < 0)
    return attn_status_set(st, ATTN_EINVAL, "layer must be 0 or more, not %lld",
                           (long long)c->layer);
  if (!r->q || !r->o || r->heads_q < 1 || r->seq_q < 0 || r->pass != ATTN_FORWARD)
    return attn_status_set(st, ATTN_EINVAL, "a session call needs q [Hq, Nq, D] and o");
  if (r->diag_offset != ATTN_DIAG_AUTO || r->cu_seqlens_kv)
    return attn_status_set(st, ATTN_EINVAL,
                           "a session call aligns its mask to the layer's keys: no diag_offset "
                           "and no cu_seqlens_kv of its own");
  if (!r->cu_seqlens_q && c->nentries > 1)
    return attn_status_set(st, ATTN_EINVAL, "a call of several sessions needs cu_seqlens_q");
  int rc = r->cu_seqlens_q ? attn_offsets_check(st, "cu_seqlens_q", r->cu_seqlens_q, c->nentries,
                                                r->seq_q, "q has")
                           : 0;
  return rc ? rc : new_rows_check(c, st);
}

/* The new tokens of entry e are finite; their largest |k|, |v| into mx
 * (without v, a latent session's call: v is within k, and so is its
 * largest, the bound of the whole rows its pages hand the kernel as v). */
static int new_tokens_check(const attn_kv_call *c, int64_t e, float mx[2], attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  const attn_request *r = &c->req;
  const size_t es = attn_dtype_size(r->dtype);
  mx[0] = mx[1] = 0;
  for (int t = 0; t < (c->v_new ? 2 : 1) && en->n_new > 0; t++)
    for (int64_t h = 0; h < r->heads_kv; h++) {
      const int64_t w = t ? attn_request_dv(r) : r->head_dim;
      const char *p = attn__kv_new_rows(c, e, t, h, (size_t)w * es);
      float m = attn__absmax(p, r->dtype, (size_t)(en->n_new * w));
      if (m < 0)
        return attn_status_set(st, ATTN_ENONFINITE,
                               "%s holds a non-finite value (NaN or infinity) in head %lld of "
                               "session %lld's new tokens; nothing was appended",
                               t ? "v" : "k", (long long)h, (long long)e);
      mx[t] = m > mx[t] ? m : mx[t];
    }
  if (!c->v_new)
    mx[1] = mx[0];
  return 0;
}

static int values_check(const attn_kv_call *c, float (*mx)[2], attn_status *st) {
  const attn_request *r = &c->req;
  if (attn_dtype_size(r->dtype) == 0 || r->head_dim < 1 || r->head_dim > ATTN_MAX_HEAD_DIM ||
      r->head_dim_v < 0 || r->head_dim_v > ATTN_MAX_HEAD_DIM_V)
    return attn_status_set(st, ATTN_EINVAL,
                           "q's dtype, head_dim or head_dim_v is not one attnd takes");
  if (attn__absmax(r->q, r->dtype, (size_t)(r->heads_q * r->seq_q * r->head_dim)) < 0)
    return attn_status_set(st, ATTN_ENONFINITE,
                           "q holds a non-finite value (NaN or infinity); nothing was appended");
  for (int64_t e = 0; e < c->nentries; e++) {
    int rc = new_tokens_check(c, e, mx[e], st);
    if (rc)
      return rc;
  }
  return 0;
}

/* ---- checks under the lock --------------------------------------------- */

/* "" for a lone call, else "sessions[e] ('id'): ", for messages. */
static void entry_name(const attn_kv_call *c, int64_t e, char *buf, size_t cap) {
  if (c->nentries == 1)
    buf[0] = 0;
  else
    snprintf(buf, cap, "sessions[%lld] ('%.40s'): ", (long long)e, c->entries[e].id);
}

static int fits_session(const attn_kv_call *c, int64_t e, const kv_session *ks, attn_status *st) {
  const attn_request *r = &c->req;
  const attn_kv_shape *sh = &ks->shape;
  char who[80];
  entry_name(c, e, who, sizeof who);
  if (c->layer >= sh->layers)
    return attn_status_set(st, ATTN_EINVAL, "%slayer %lld is past session '%s''s %lld layers", who,
                           (long long)c->layer, ks->id, (long long)sh->layers);
  if (r->dtype != sh->dtype)
    return attn_status_set(st, ATTN_EDTYPE, "%sthe tensors are %s; session '%s' holds %s", who,
                           attn_dtype_name(r->dtype), ks->id, attn_dtype_name(sh->dtype));
  if (r->head_dim != sh->head_dim)
    return attn_status_set(st, ATTN_ESHAPE, "%shead_dim is %lld; session '%s' has %lld", who,
                           (long long)r->head_dim, ks->id, (long long)sh->head_dim);
  if (attn_request_dv(r) != attn_kv_shape_dv(sh))
    return attn_status_set(st, ATTN_ESHAPE,
                           "%shead_dim_v (o's and v's last dimension) is %lld; session '%s' has "
                           "%lld",
                           who, (long long)attn_request_dv(r), ks->id,
                           (long long)attn_kv_shape_dv(sh));
  if (sh->v_from_k && c->v_new)
    return attn_status_set(st, ATTN_ESHAPE,
                           "%sa latent session (v_from_k) takes q and k only: v is the first Dv "
                           "columns of k (session '%s', Dv %lld)",
                           who, ks->id, (long long)attn_kv_shape_dv(sh));
  if (!sh->v_from_k && c->total_new > 0 && !c->v_new)
    return attn_status_set(st, ATTN_EINVAL, "%snew tokens need both k and v (session '%s')", who,
                           ks->id);
  if (c->total_new > 0 && r->heads_kv != sh->heads_kv)
    return attn_status_set(st, ATTN_ESHAPE, "%sk and v have %lld heads; session '%s' has %lld", who,
                           (long long)r->heads_kv, ks->id, (long long)sh->heads_kv);
  if (r->heads_q % sh->heads_kv)
    return attn_status_set(st, ATTN_EHEADS,
                           "%sq's %lld heads are not a multiple of session '%s''s heads_kv %lld",
                           who, (long long)r->heads_q, ks->id, (long long)sh->heads_kv);
  return 0;
}

/* Whether tokens [pos, pos + n) of L hold entry e's new keys and values
 * (a quantized session's: the rows their quantizing would store, codes and
 * scales, in q), read a page at a time into buf (a page's bytes each; a
 * device's pages are copied out). A page that cannot be read holds nothing
 * equal. */
static bool stored_equal(const attn_kv_store *s, const attn_kv_call *c, int64_t e,
                         const kv_session *ks, const kv_layer *L, char *buf, char *q) {
  const attn_kv_entry *en = &c->entries[e];
  attn_status st;
  for (int t = 0; t < attn__kv_tensors(&ks->shape); t++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t j = 0, n; j < en->n_new; j += n) {
        const size_t row = (size_t)attn__kv_cols(&ks->shape, t) * attn_dtype_size(ks->shape.dtype);
        const char *src = attn__kv_new_rows(c, e, t, h, row) + (size_t)j * row;
        n = attn__kv_span(ks, en->pos + j, en->pos + en->n_new);
        if (ks->shape.kv_quant)
          attn__kv_quantize(&ks->shape, t, src, n, q);
        if (attn__kv_rows_get(s, ks, L, t, h, en->pos + j, n, buf, &st) ||
            memcmp(ks->shape.kv_quant ? q : src, buf, (size_t)n * attn__kv_xrow(&ks->shape, t)))
          return false;
      }
  return true;
}

/* The same, with buffers of its own. */
static bool replayed(const attn_kv_store *s, const attn_kv_call *c, int64_t e, const kv_session *ks,
                     const kv_layer *L) {
  char *buf = malloc(2 * (size_t)ATTN_KV_PAGE_BYTES);
  bool eq = buf && stored_equal(s, c, e, ks, L, buf, buf + ATTN_KV_PAGE_BYTES);
  free(buf);
  return eq;
}

static int conflict(attn_kv_store *s, const attn_kv_call *c, int64_t e, const kv_session *ks,
                    const kv_layer *L, attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  char who[80];
  entry_name(c, e, who, sizeof who);
  s->stats.conflicts++;
  bool old = en->pos >= 0 && en->pos + en->n_new <= L->length;
  return attn_status_set(st, ATTN_ESESSION_CONFLICT,
                         "%spos %lld is not layer %lld's length %lld in session '%s'%s; nothing "
                         "was appended",
                         who, (long long)en->pos, (long long)c->layer, (long long)L->length, ks->id,
                         old ? " (and the tokens stored there differ: not a replay)" : "");
}

/* A query with no key to attend: an empty layer and no tokens sent. The
 * same refusal alone and in a batch (a batch would otherwise answer zeros). */
static int nothing_to_attend(const attn_kv_call *c, int64_t e, const kv_session *ks,
                             attn_status *st) {
  char who[80];
  entry_name(c, e, who, sizeof who);
  return attn_status_set(st, ATTN_EINVAL,
                         "%slayer %lld of session '%s' holds no tokens and the call sends none "
                         "(no k, v): there is no key to attend; send the tokens first",
                         who, (long long)c->layer, ks->id);
}

/* What entry e does to its layer: append, replay or just read. 1 when it
 * must wait for the layer's readers (it would overwrite what they read). */
static int plan_entry(attn_kv_store *s, const attn_kv_call *c, int64_t e, kv_use *u,
                      attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  kv_layer *L = u->L;
  u->append = false;
  u->extent = L->length;
  if (en->n_new == 0)
    return u->extent == 0 && attn__kv_entry_rows(c, e) > 0 ? nothing_to_attend(c, e, u->ks, st) : 0;
  u->extent = en->pos + en->n_new;
  if (en->pos == L->length) {
    if (u->extent > u->ks->shape.max_tokens) {
      char who[80];
      entry_name(c, e, who, sizeof who);
      return attn_status_set(st, ATTN_ESESSION_FULL,
                             "%sappending %lld tokens at %lld passes session '%s''s max_tokens "
                             "%lld; nothing was appended",
                             who, (long long)en->n_new, (long long)en->pos, u->ks->id,
                             (long long)u->ks->shape.max_tokens);
    }
    u->append = true;
    /* a write into pages a fork shares copies them first: not under a reader (kv_int.h, P1) */
    if (L->readers > 0 &&
        (en->pos < L->read_hi || attn__kv_cow_needed(&s->pages, u->ks, L, en->pos, u->extent)))
      return 1;
    /* a device's copy can fail: made now (if any), while the call can still be refused */
    return s->pages.dev ? attn__kv_cow(s, u->ks, L, en->pos, u->extent, st) : 0;
  }
  /* on a device, rows published may still be in a reader's job, not yet
   * written: the check reads them once the readers are done */
  if (en->pos >= 0 && u->extent <= L->length && s->pages.dev && L->readers > 0)
    return 1;
  if (en->pos >= 0 && u->extent <= L->length && replayed(s, c, e, u->ks, L))
    return 0;
  return conflict(s, c, e, u->ks, L, st);
}

/* Entries of one call share the sessions' heads_kv and how they hold v
 * (head_dim they share with the call's): the job that computes them is
 * built for one shape. */
static int same_heads(int64_t e, const kv_session *first, const kv_session *ks, attn_status *st) {
  if (ks->shape.heads_kv != first->shape.heads_kv)
    return attn_status_set(st, ATTN_ESHAPE,
                           "sessions[%lld] ('%.40s') has heads_kv %lld and sessions[0] ('%.40s') "
                           "%lld: the sessions of one batch must share heads_kv",
                           (long long)e, ks->id, (long long)ks->shape.heads_kv, first->id,
                           (long long)first->shape.heads_kv);
  if (ks->shape.v_from_k != first->shape.v_from_k)
    return attn_status_set(st, ATTN_ESHAPE,
                           "sessions[%lld] ('%.40s') is %s and sessions[0] ('%.40s') is %s: the "
                           "sessions of one batch must all be latent (v_from_k) or none",
                           (long long)e, ks->id, ks->shape.v_from_k ? "latent" : "not latent",
                           first->id, first->shape.v_from_k ? "latent" : "not latent");
  if (ks->shape.kv_quant != first->shape.kv_quant)
    return attn_status_set(st, ATTN_ESHAPE,
                           "sessions[%lld] ('%.40s') stores kv_dtype %s and sessions[0] ('%.40s') "
                           "%s: the sessions of one batch must store one kv_dtype",
                           (long long)e, ks->id, attn_kv_shape_kv_dtype(&ks->shape), first->id,
                           attn_kv_shape_kv_dtype(&first->shape));
  return 0;
}

/* Every entry's options against the engine's rules, as it would run
 * alone; its FLOPs into *flops. */
static int probe(const attn_kv_store *s, const attn_kv_call *c, const kv_use *uses, double *flops,
                 attn_status *st) {
  *flops = 0;
  for (int64_t e = 0; e < c->nentries; e++) {
    attn_request r;
    attn__kv_lone_request(s, c, e, &uses[e], &r);
    if (r.seq_kv == 0 || r.seq_q == 0)
      r.seq_kv = r.seq_q = 1; /* nothing to compute: only the options to check */
    int rc = attn_request_validate(&r, st);
    if (rc)
      return rc;
    *flops += uses[e].extent && attn__kv_entry_rows(c, e) ? attn_request_flops(&r) : 0;
  }
  return 0;
}

/* Finds and checks every entry; 1 when one must wait (nothing applied). */
static int resolve(attn_kv_store *s, const attn_kv_call *c, kv_use *uses, double now,
                   attn_status *st) {
  int wait = 0;
  for (int64_t e = 0; e < c->nentries; e++) {
    const char *id = c->entries[e].id;
    kv_session *ks = attn__kv_find(s, c->tenant, id, now);
    if (!ks)
      return attn_status_set(st, ATTN_ESESSION_NOT_FOUND,
                             "no session '%.128s': it was never made, was deleted, or expired "
                             "(ttl_s after its last use)",
                             id);
    int rc = fits_session(c, e, ks, st);
    if (rc == 0 && e > 0)
      rc = same_heads(e, uses[0].ks, ks, st);
    for (int64_t d = 0; rc == 0 && d < e; d++)
      if (uses[d].ks == ks)
        rc = attn_status_set(st, ATTN_EINVAL, "session '%s' is named twice in one call", id);
    if (rc)
      return rc;
    uses[e].ks = ks;
    uses[e].L = &ks->layers[c->layer];
    rc = plan_entry(s, c, e, &uses[e], st);
    if (rc < 0)
      return rc;
    wait |= rc;
  }
  return wait;
}

/* Grow sessions' appends reserve their new pages at admission, the whole
 * call's or none: what they need together must fit the tenant's cap and
 * the pool's pages no session reserves (so never a whole session's). */
static int room_check(attn_kv_store *s, const kv_pending *p, attn_status *st) {
  const attn_kv_call *c = p->call;
  int64_t need = 0;
  for (int64_t e = 0; e < c->nentries; e++)
    if (p->uses[e].append)
      need +=
          attn__kv_grow_need(p->uses[e].ks, p->uses[e].L, c->entries[e].pos + c->entries[e].n_new);
  if (need == 0)
    return 0;
  if (!attn__kv_tenant_fits(s, c->tenant, need))
    return attn__kv_tenant_refuse(s, c->tenant, need, true, st);
  const int64_t free_pages = s->pages.npages - s->pages.reserved;
  if (need <= free_pages)
    return 0;
  return attn_status_set(st, ATTN_ESESSION_MEMORY,
                         "these tokens take pages of %llu bytes, and %llu of the %llu bytes of "
                         "session memory are free (--session-memory; a session of reserve "
                         "\"whole\" keeps its whole max_tokens'); nothing was appended: delete or "
                         "truncate a session, or retry when one has expired",
                         (unsigned long long)attn__kvpages_bytes(&s->pages, need),
                         (unsigned long long)attn__kvpages_bytes(&s->pages, free_pages),
                         (unsigned long long)attn__kvpages_bytes(&s->pages, s->pages.npages));
}

/* ---- admitting ------------------------------------------------------------ */

/* Books an admitted call: pages taken and the layer marked written for
 * each append (a grow session's within room_check's, so it cannot fail),
 * each entry a reader of its layer, the sessions used. */
static void claim(attn_kv_store *s, kv_pending *p) {
  attn_kv_call *c = p->call;
  for (int64_t e = 0; e < c->nentries; e++) {
    kv_use *u = &p->uses[e];
    attn_kv_entry *en = &c->entries[e];
    if (u->append) {
      (void)attn__kv_grow(s, u->ks, u->L, en->pos + en->n_new);
      u->L->writing = true;
      u->L->cut = false;
    } else if (en->n_new > 0) {
      s->stats.replays++;
    }
    en->replay = !u->append && en->n_new > 0;
    en->length = u->append ? en->pos + en->n_new : u->L->length;
    u->L->readers++;
    u->L->read_hi = u->extent > u->L->read_hi ? u->extent : u->L->read_hi;
    u->ks->readers++;
    u->ks->expires = p->now + u->ks->ttl_s;
  }
}

void attn__kv_release(attn_kv_store *s, kv_pending *p) {
  for (int64_t e = 0; e < p->call->nentries; e++)
    attn__kv_reader_done(s, p->uses[e].ks, p->uses[e].L);
}

/* Whether calls a and b name a layer in common. */
static bool share_layer(const attn_kv_call *a, const attn_kv_call *b) {
  if (a->layer != b->layer || strcmp(a->tenant, b->tenant))
    return false;
  for (int64_t i = 0; i < a->nentries; i++)
    for (int64_t j = 0; j < b->nentries; j++)
      if (!strcmp(a->entries[i].id, b->entries[j].id))
        return true;
  return false;
}

/* Whether c must wait before it is even resolved: a layer it names is
 * being written, or an earlier parked call names one of its layers. */
static bool blocked(attn_kv_store *s, const attn_kv_call *c, double now) {
  for (int64_t e = 0; e < c->nentries; e++) {
    const kv_session *ks = attn__kv_find(s, c->tenant, c->entries[e].id, now);
    if (ks && c->layer < ks->shape.layers && ks->layers[c->layer].writing)
      return true;
  }
  for (const kv_pending *q = s->parked; q; q = q->next)
    if (share_layer(q->call, c))
      return true;
  return false;
}

static void park(attn_kv_store *s, kv_pending *p) {
  kv_pending **pp = &s->parked;
  while (*pp)
    pp = &(*pp)->next;
  p->next = NULL;
  *pp = p;
}

/* What an entry costs beyond its arithmetic (a job of its own: some
 * microseconds), counted as this many FLOPs against a call's bound, so that
 * a batch of many tiny entries is not taken for a tiny call. */
#define ENTRY_FLOPS 16384.0

/* Whether a call run here must go the queued way after all: one of its
 * layers has readers (its job would wait for theirs, or be batched with
 * them), or its work is past what it may do on the caller's thread. */
static bool not_here(const kv_pending *p) {
  for (int64_t e = 0; e < p->call->nentries; e++)
    if (p->uses[e].L->readers > 0)
      return true;
  return p->flops + ENTRY_FLOPS * (double)p->call->nentries > p->max_flops;
}

/* Under the lock: p admitted (0), parked (1), left for the queue
 * (ATTN_KV_LATER: a call run here never parks), or refused (an error). */
int attn__kv_enter(attn_kv_store *s, kv_pending *p, attn_status *st) {
  if (attn_cancel_is_set(p->call->req.cancel))
    return attn__canceled(st);
  int rc = blocked(s, p->call, p->now) ? 1 : resolve(s, p->call, p->uses, p->now, st);
  if (rc == 1 && p->here)
    return ATTN_KV_LATER;
  if (rc == 1) {
    park(s, p);
    return 1;
  }
  if (rc == 0)
    rc = probe(s, p->call, p->uses, &p->flops, st);
  if (rc == 0)
    rc = room_check(s, p, st);
  if (rc == 0 && p->here && not_here(p))
    return ATTN_KV_LATER;
  if (rc == 0)
    claim(s, p);
  return rc;
}

void attn__kv_retry_parked(attn_kv_store *s, kv_after *a) {
  kv_pending *list = s->parked;
  s->parked = NULL;
  while (list) {
    kv_pending *p = list;
    list = p->next;
    p->next = NULL;
    int rc = attn__kv_enter(s, p, &p->st);
    if (rc < 0) {
      p->next = a->failed;
      a->failed = p;
    } else if (rc == 0) {
      p->next = a->land;
      a->land = p;
    }
  }
}

/* The call as the store keeps it, its values checked (before the lock); NULL
 * with st set. One allocation holds it and its entries' uses and maxima. */
kv_pending *attn__kv_pending_new(attn_kv_call *call, attn_done_fn done, void *arg, double now,
                                 attn_status *st) {
  const size_t n = (size_t)call->nentries;
  kv_pending *p = calloc(1, sizeof *p + n * sizeof *p->uses + n * sizeof *p->mx);
  if (p) {
    *p = (kv_pending){.call = call, .done = done, .arg = arg, .now = now};
    p->uses = (kv_use *)(p + 1);
    p->mx = (float(*)[2])(p->uses + n);
  }
  int rc = !p ? attn_status_set(st, ATTN_ENOMEM, "out of memory taking a call")
              : values_check(call, p->mx, st);
  if (rc) {
    attn__kv_pending_free(p);
    return NULL;
  }
  return p;
}
