/*
 * kvcall.c — a session call (engine.h, attn_kv_submit): its entries checked
 * all together, their new tokens appended (or found there already, bit for
 * bit: a replay), then attention computed by the engine straight from the
 * layer's pages.
 *
 * A call of one entry that reads keys runs alone, on its own buffers. Any
 * other (several entries, or no key to read) runs as a variable-length
 * batch whose sequence e is entry e: the varlen path computes each
 * sequence as the problem it would be alone, so the reply is bit for bit
 * the one a lone call gets. With batching on, calls applied while the
 * store has jobs running wait (applied, so in arrival order) until those
 * end, then go as one such batch per set of matching options, their q
 * gathered into the batch's buffer and o and the statistics scattered back.
 */
#include "check.h"
#include "job.h"
#include "kvstore_int.h"
#include "request_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kv_use {
  kv_session *ks;
  kv_layer *L;
  int64_t extent; /* keys it reads: [0, extent) */
  bool append;
} kv_use;

struct kv_pending {
  attn_kv_call *call;
  attn_done_fn done;
  void *arg;
  kv_use *uses; /* one per entry */
  double flops;
  kv_pending *next;
};

typedef struct kv_job {
  attn_kv_store *s;
  kv_pending *calls; /* in arrival order */
  int64_t ncalls, nentries;
  bool gathered; /* q, o and statistics pass through buf */
  attn_request req;
  const void **kp, **vp;
  int64_t *cu_q, *cu_kv;
  int64_t *used; /* a device batch's key counts per entry (seqused_kv) */
  char *buf;
  struct kv_job *next; /* jobs started together */
} kv_job;

static void pending_free(kv_pending *p) {
  free(p->uses);
  free(p);
}

static void job_free(kv_job *j) {
  for (kv_pending *p = j->calls, *n; p; p = n) {
    n = p->next;
    pending_free(p);
  }
  free(j->kp);
  free(j->vp);
  free(j->cu_q);
  free(j->cu_kv);
  free(j->used);
  free(j->buf);
  free(j);
}

/* ---- checks before the lock -------------------------------------------- */

/* Query rows of entry e. */
static int64_t entry_rows(const attn_kv_call *c, int64_t e) {
  const int64_t *cu = c->req.cu_seqlens_q;
  return cu ? cu[e + 1] - cu[e] : c->req.seq_q;
}

/* The entries' new rows tile k and v in order, every row used once, as
 * cu_seqlens_kv would lay them out. */
static int new_rows_check(const attn_kv_call *c, attn_status *st) {
  int64_t at = 0;
  for (int64_t e = 0; e < c->nentries; e++) {
    const attn_kv_entry *en = &c->entries[e];
    if (en->n_new < 0 || en->kv_off != at || (en->n_new > 0 && (!c->k_new || !c->v_new)))
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

static int call_shape_check(const attn_kv_call *c, attn_status *st) {
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
  int rc = r->cu_seqlens_q ? attn__check_cu(st, "cu_seqlens_q", r->cu_seqlens_q, c->nentries,
                                            r->seq_q, "q's rows")
                           : 0;
  return rc ? rc : new_rows_check(c, st);
}

/* The new tokens of entry e are finite; their largest |k|, |v| into mx. */
static int new_tokens_check(const attn_kv_call *c, int64_t e, float mx[2], attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  const attn_request *r = &c->req;
  const size_t es = attn_dtype_size(r->dtype), row = (size_t)r->head_dim * es;
  mx[0] = mx[1] = 0;
  for (int t = 0; t < 2 && en->n_new > 0; t++)
    for (int64_t h = 0; h < r->heads_kv; h++) {
      const char *p =
          (const char *)(t ? c->v_new : c->k_new) + (size_t)(h * c->total_new + en->kv_off) * row;
      float m = attn__absmax(p, r->dtype, (size_t)(en->n_new * r->head_dim));
      if (m < 0)
        return attn_status_set(st, ATTN_ENONFINITE,
                               "%s holds a non-finite value (NaN or infinity) in head %lld of "
                               "session %lld's new tokens; nothing was appended",
                               t ? "v" : "k", (long long)h, (long long)e);
      mx[t] = m > mx[t] ? m : mx[t];
    }
  return 0;
}

static int values_check(const attn_kv_call *c, float (*mx)[2], attn_status *st) {
  const attn_request *r = &c->req;
  if (attn_dtype_size(r->dtype) == 0 || r->head_dim < 1 || r->head_dim > ATTN_MAX_HEAD_DIM)
    return attn_status_set(st, ATTN_EINVAL, "q's dtype or head_dim is not one attnd takes");
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
  if (c->total_new > 0 && r->heads_kv != sh->heads_kv)
    return attn_status_set(st, ATTN_ESHAPE, "%sk and v have %lld heads; session '%s' has %lld", who,
                           (long long)r->heads_kv, ks->id, (long long)sh->heads_kv);
  if (r->heads_q % sh->heads_kv)
    return attn_status_set(st, ATTN_EHEADS,
                           "%sq's %lld heads are not a multiple of session '%s''s heads_kv %lld",
                           who, (long long)r->heads_q, ks->id, (long long)sh->heads_kv);
  return 0;
}

/* Entry e's new rows of KV head h of K (t 0) or V (t 1), packed. */
static const char *new_rows(const attn_kv_call *c, int64_t e, int t, int64_t h, size_t row) {
  const attn_kv_entry *en = &c->entries[e];
  return (const char *)(t ? c->v_new : c->k_new) + (size_t)(h * c->total_new + en->kv_off) * row;
}

/* Whether tokens [pos, pos + n) of L hold entry e's new keys and values,
 * read a page at a time into buf (a page's bytes; a device's pages are
 * copied out). A page that cannot be read holds nothing equal. */
static bool stored_equal(const attn_kv_store *s, const attn_kv_call *c, int64_t e,
                         const kv_session *ks, const kv_layer *L, char *buf) {
  const attn_kv_entry *en = &c->entries[e];
  const size_t row = (size_t)ks->shape.head_dim * attn_dtype_size(ks->shape.dtype);
  attn_status st;
  for (int t = 0; t < 2; t++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t j = 0, n; j < en->n_new; j += n) {
        n = attn__kv_run(ks, en->pos + j, en->pos + en->n_new);
        if (attn__kv_get(s, ks, L, t, h, en->pos + j, n, buf, &st) ||
            memcmp(new_rows(c, e, t, h, row) + (size_t)j * row, buf, (size_t)n * row))
          return false;
      }
  return true;
}

/* The same, with a buffer of its own. */
static bool replayed(const attn_kv_store *s, const attn_kv_call *c, int64_t e, const kv_session *ks,
                     const kv_layer *L) {
  char *buf = malloc(ATTN_KV_PAGE_BYTES);
  bool eq = buf && stored_equal(s, c, e, ks, L, buf);
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

/* What entry e does to its layer: append, replay or just read. 1 when it
 * must wait for the layer's readers (it would overwrite what they read). */
static int plan_entry(attn_kv_store *s, const attn_kv_call *c, int64_t e, kv_use *u,
                      attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  kv_layer *L = u->L;
  u->append = false;
  u->extent = L->length;
  if (en->n_new == 0)
    return 0;
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
    return L->readers > 0 && en->pos < L->read_hi ? 1 : 0;
  }
  if (en->pos >= 0 && u->extent <= L->length && replayed(s, c, e, u->ks, L))
    return 0;
  return conflict(s, c, e, u->ks, L, st);
}

/* Where r's pages are and who reads them: the cpu backend host pages, the
 * backend that lent them a device's (rows padded to ks's pitch). */
static void pages_of(const attn_kv_store *s, const kv_session *ks, attn_request *r) {
  r->page_tokens = ks->page_tokens;
  r->page_pitch = s->pages.dev ? ks->pitch : 0;
  r->backend = s->pages.dev ? s->pages.dev->ops.name : "cpu";
}

/* The request entry e runs as alone (k and v from its layer's pages). */
static void lone_request(const attn_kv_store *s, const attn_kv_call *c, int64_t e, const kv_use *u,
                         attn_request *r) {
  const kv_session *ks = u->ks;
  *r = c->req;
  r->batch = 1;
  r->heads_kv = ks->shape.heads_kv;
  r->head_dim = ks->shape.head_dim;
  r->seq_q = entry_rows(c, e);
  r->seq_kv = u->extent;
  r->cu_seqlens_q = r->cu_seqlens_kv = NULL;
  r->k = r->v = NULL;
  r->k_pages = (const void *const *)u->L->kp;
  r->v_pages = (const void *const *)u->L->vp;
  r->pages_per_head = ks->pages_per_head;
  memcpy(r->kv_absmax, u->L->absmax, sizeof r->kv_absmax);
  pages_of(s, ks, r);
}

/* Every entry's options against the engine's rules, as it would run
 * alone; its FLOPs into *flops. */
static int probe(const attn_kv_store *s, const attn_kv_call *c, const kv_use *uses, double *flops,
                 attn_status *st) {
  *flops = 0;
  for (int64_t e = 0; e < c->nentries; e++) {
    attn_request r;
    lone_request(s, c, e, &uses[e], &r);
    if (r.seq_kv == 0 || r.seq_q == 0)
      r.seq_kv = r.seq_q = 1; /* nothing to compute: only the options to check */
    int rc = attn_request_validate(&r, st);
    if (rc)
      return rc;
    *flops += uses[e].extent && entry_rows(c, e) ? attn_request_flops(&r) : 0;
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

/* Writes entry e's new tokens into its layer, a page's run at a time (on
 * a device: one small upload each). 0, or the device's error with the
 * layer's length unchanged. */
static int append(attn_kv_store *s, const attn_kv_call *c, int64_t e, kv_use *u, const float mx[2],
                  attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  kv_session *ks = u->ks;
  kv_layer *L = u->L;
  const size_t row = (size_t)ks->shape.head_dim * attn_dtype_size(ks->shape.dtype);
  attn__kv_grow(s, ks, L, en->pos + en->n_new);
  for (int t = 0; t < 2; t++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t j = 0, n; j < en->n_new; j += n) {
        n = attn__kv_run(ks, en->pos + j, en->pos + en->n_new);
        int rc = attn__kv_put(s, ks, L, t, h, en->pos + j, n,
                              new_rows(c, e, t, h, row) + (size_t)j * row, st);
        if (rc)
          return rc;
      }
  L->length += en->n_new;
  L->absmax[0] = fmaxf(L->absmax[0], mx[0]);
  L->absmax[1] = fmaxf(L->absmax[1], mx[1]);
  s->stats.appended_tokens += (uint64_t)en->n_new;
  return 0;
}

/* Appends or replays every entry, then makes each a reader of its layer.
 * An append the device fails stops the call before any entry reads: the
 * ones appended before it stay (their device has failed; its pages are
 * lost with it). */
static int apply(attn_kv_store *s, attn_kv_call *c, kv_use *uses, float (*mx)[2], double now,
                 attn_status *st) {
  for (int64_t e = 0; e < c->nentries; e++)
    if (uses[e].append && append(s, c, e, &uses[e], mx[e], st))
      return attn_status_set(st, ATTN_EDEVICE, "storing the new tokens failed: %s", st->message);
  for (int64_t e = 0; e < c->nentries; e++) {
    kv_use *u = &uses[e];
    attn_kv_entry *en = &c->entries[e];
    if (!u->append && en->n_new > 0)
      s->stats.replays++;
    en->replay = !u->append && en->n_new > 0;
    en->length = u->L->length;
    u->L->readers++;
    u->L->read_hi = u->extent > u->L->read_hi ? u->extent : u->L->read_hi;
    u->ks->readers++;
    u->ks->expires = now + u->ks->ttl_s;
  }
  return 0;
}

/* ---- jobs ---------------------------------------------------------------- */

static bool same_double(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* Whether two calls can be computed as one batch: the same options, so
 * the batch's one set of them is each call's own. */
static bool mergeable(const attn_kv_call *a, const attn_kv_call *b) {
  const attn_request *x = &a->req, *y = &b->req;
  return x->dtype == y->dtype && x->heads_q == y->heads_q && x->head_dim == y->head_dim &&
         x->heads_kv == y->heads_kv && same_double(x->scale, y->scale) && x->causal == y->causal &&
         x->window_left == y->window_left && x->window_right == y->window_right &&
         same_double(x->softcap, y->softcap) && !x->alibi_slopes && !y->alibi_slopes &&
         !x->m == !y->m && !x->l == !y->l && !x->lse == !y->lse;
}

static int64_t job_rows(const kv_job *j) {
  int64_t n = 0;
  for (kv_pending *p = j->calls; p; p = p->next)
    n += p->call->req.seq_q;
  return n;
}

/* The batch's page tables, [entry][heads_kv][pages_per_head], and offsets. */
static int job_tables(kv_job *j, int64_t hkv, int64_t pph) {
  const size_t n = (size_t)(j->nentries * hkv * pph);
  j->kp = calloc(n ? n : 1, sizeof *j->kp);
  j->vp = calloc(n ? n : 1, sizeof *j->vp);
  j->cu_q = calloc((size_t)j->nentries + 1, sizeof *j->cu_q);
  j->cu_kv = calloc((size_t)j->nentries + 1, sizeof *j->cu_kv);
  if (!j->kp || !j->vp || !j->cu_q || !j->cu_kv)
    return -1;
  int64_t b = 0, q0 = 0;
  for (kv_pending *p = j->calls; p; p = p->next) {
    for (int64_t e = 0; e < p->call->nentries; e++, b++) {
      const kv_use *u = &p->uses[e];
      const int64_t used = (u->extent + u->ks->page_tokens - 1) / u->ks->page_tokens;
      for (int64_t h = 0; h < hkv; h++) {
        memcpy(&j->kp[(b * hkv + h) * pph], &u->L->kp[h * u->ks->pages_per_head],
               (size_t)used * sizeof *j->kp);
        memcpy(&j->vp[(b * hkv + h) * pph], &u->L->vp[h * u->ks->pages_per_head],
               (size_t)used * sizeof *j->vp);
      }
      j->cu_q[b + 1] =
          q0 + (p->call->req.cu_seqlens_q ? p->call->req.cu_seqlens_q[e + 1] : p->call->req.seq_q);
      j->cu_kv[b + 1] = j->cu_kv[b] + u->extent;
      j->req.kv_absmax[0] = fmaxf(j->req.kv_absmax[0], u->L->absmax[0]);
      j->req.kv_absmax[1] = fmaxf(j->req.kv_absmax[1], u->L->absmax[1]);
    }
    q0 += p->call->req.seq_q;
  }
  return 0;
}

/* n rows of every head, from rows [s0, s0 + n) of a [H, sn, w] tensor to
 * rows [d0, d0 + n) of a [H, dn, w] one. */
static void rows_copy(char *dst, int64_t dn, int64_t d0, const char *src, int64_t sn, int64_t s0,
                      int64_t heads, int64_t n, size_t wbytes) {
  for (int64_t h = 0; h < heads; h++)
    memcpy(dst + (size_t)(h * dn + d0) * wbytes, src + (size_t)(h * sn + s0) * wbytes,
           (size_t)n * wbytes);
}

/* The batch's own q, o and statistics, q gathered from every call. */
static int job_gather(kv_job *j) {
  attn_request *r = &j->req;
  const size_t es = attn_dtype_size(r->dtype),
               qb = (size_t)(r->heads_q * r->seq_q * r->head_dim) * es;
  const size_t sb = (size_t)(r->heads_q * r->seq_q) * sizeof(float);
  j->buf = malloc(2 * qb + 3 * sb + 1);
  if (!j->buf)
    return -1;
  r->q = j->buf;
  r->o = j->buf + qb;
  float *f = (float *)(j->buf + 2 * qb);
  r->m = r->m ? f : NULL;
  r->l = r->l ? f + r->heads_q * r->seq_q : NULL;
  r->lse = r->lse ? f + 2 * r->heads_q * r->seq_q : NULL;
  int64_t row0 = 0;
  for (kv_pending *p = j->calls; p; p = p->next) {
    const int64_t n = p->call->req.seq_q;
    rows_copy(j->buf, r->seq_q, row0, p->call->req.q, n, 0, r->heads_q, n,
              (size_t)r->head_dim * es);
    row0 += n;
  }
  return 0;
}

/* o and the statistics of each call back into its own buffers. */
static void job_scatter(const kv_job *j) {
  const attn_request *r = &j->req;
  const size_t es = attn_dtype_size(r->dtype);
  int64_t row0 = 0;
  for (kv_pending *p = j->calls; p; p = p->next) {
    const attn_request *cr = &p->call->req;
    const int64_t n = cr->seq_q;
    rows_copy(cr->o, n, 0, r->o, r->seq_q, row0, r->heads_q, n, (size_t)r->head_dim * es);
    float *const mine[3] = {cr->m, cr->l, cr->lse}, *const ours[3] = {r->m, r->l, r->lse};
    for (int t = 0; t < 3; t++)
      if (mine[t])
        rows_copy((char *)mine[t], n, 0, (const char *)ours[t], r->seq_q, row0, r->heads_q, n,
                  sizeof(float));
    row0 += n;
  }
}

/* The query rows every entry of the job has, when it can run as one batch
 * on a device (its pages there, the same rows each, no statistics: those
 * are laid out per sequence); else 0. */
static int64_t uniform_rows(const kv_job *j) {
  const attn_request *r0 = &j->calls->call->req;
  if (!j->s->pages.dev || r0->m || r0->l || r0->lse)
    return 0;
  int64_t nq = -1;
  for (kv_pending *p = j->calls; p; p = p->next)
    for (int64_t e = 0; e < p->call->nentries; e++) {
      int64_t n = entry_rows(p->call, e);
      if (nq >= 0 && n != nq)
        return 0;
      nq = n;
    }
  return nq > 0 ? nq : 0;
}

/* The varlen batch as one batch of its entries, nq rows each (q and o
 * strided in place: entry b's rows are [b nq, (b + 1) nq) of each head),
 * each over its own keys. 0, or -1 out of memory. */
static int as_batch(kv_job *j, int64_t nq) {
  attn_request *r = &j->req;
  const int64_t total = r->seq_q, B = j->nentries, d = r->head_dim;
  if (!(j->used = malloc((size_t)B * sizeof *j->used)))
    return -1;
  int64_t most = 0;
  for (int64_t b = 0; b < B; b++) {
    j->used[b] = j->cu_kv[b + 1] - j->cu_kv[b];
    most = j->used[b] > most ? j->used[b] : most;
  }
  const int64_t stride[3] = {nq * d, total * d, d};
  memcpy(r->q_stride, stride, sizeof stride);
  memcpy(r->o_stride, stride, sizeof stride);
  r->seq_q = nq;
  r->seq_kv = most;
  r->seqused_kv = j->used;
  r->cu_seqlens_q = r->cu_seqlens_kv = NULL;
  return 0;
}

/* The request of a job: one lone entry on the call's buffers, or a
 * variable-length batch (one batch on a device, when its entries allow).
 * 0, or -1 out of memory. */
static int job_build(kv_job *j) {
  kv_pending *p = j->calls;
  const attn_kv_call *c = p->call;
  if (j->ncalls == 1 && c->nentries == 1 && p->uses[0].extent > 0) {
    lone_request(j->s, c, 0, &p->uses[0], &j->req);
    return 0;
  }
  j->req = c->req;
  attn_request *r = &j->req;
  int64_t pph = 1;
  for (kv_pending *q = j->calls; q; q = q->next)
    for (int64_t e = 0; e < q->call->nentries; e++)
      pph = q->uses[e].ks->pages_per_head > pph ? q->uses[e].ks->pages_per_head : pph;
  r->heads_kv = p->uses[0].ks->shape.heads_kv;
  r->head_dim = p->uses[0].ks->shape.head_dim;
  r->batch = j->nentries;
  r->seq_q = job_rows(j);
  r->k = r->v = NULL;
  pages_of(j->s, p->uses[0].ks, r);
  r->pages_per_head = pph;
  r->kv_absmax[0] = r->kv_absmax[1] = 0;
  j->gathered = j->ncalls > 1; /* several calls' q, o: one buffer */
  if (j->gathered)
    r->cancel = NULL; /* one caller's cancel would cancel the others' */
  if (job_tables(j, r->heads_kv, pph) < 0 || (j->gathered && job_gather(j) < 0))
    return -1;
  r->k_pages = (const void *const *)j->kp;
  r->v_pages = (const void *const *)j->vp;
  r->cu_seqlens_q = j->cu_q;
  r->cu_seqlens_kv = j->cu_kv;
  r->seq_kv = j->cu_kv[j->nentries];
  int64_t nq = uniform_rows(j);
  return nq ? as_batch(j, nq) : 0;
}

/* ---- running -------------------------------------------------------------- */

static void job_done(const attn_result *res, void *arg);

static void count_batch(attn_kv_store *s, int64_t ncalls) {
  int b = 0;
  while (b < ATTN_KV_BATCH_BUCKETS - 1 && ((int64_t)1 << b) < ncalls)
    b++;
  s->stats.batch_sizes[b]++;
  s->stats.batched_calls += (uint64_t)ncalls;
}

/* Ends each call of a job that did not run, with st. */
static void job_end(kv_job *j, const attn_result *res);

static void job_fail(kv_job *j, const attn_status *st) {
  attn_result res = {.status = *st};
  job_end(j, &res);
}

/* Builds and submits a job (counted in jobs_running already); on failure
 * its calls end with the error. */
static void job_start(kv_job *j) {
  attn_status st;
  int rc = job_build(j) < 0 ? attn_status_set(&st, ATTN_ENOMEM, "out of memory batching calls")
                            : attn_engine_submit(j->s->engine, &j->req, job_done, j, &st);
  if (rc)
    job_fail(j, &st);
}

/* A new job of one call. */
static kv_job *job_new(attn_kv_store *s, kv_pending *p) {
  kv_job *j = calloc(1, sizeof *j);
  if (j) {
    j->s = s;
    j->calls = p;
    j->ncalls = 1;
    j->nentries = p->call->nentries;
  }
  return j;
}

/* Adds p to the job of matching options in the list, or to a new one at
 * its end; false out of memory. */
static bool group_add(attn_kv_store *s, kv_job **jobs, kv_pending *p) {
  kv_job **jp = jobs;
  while (*jp && !mergeable((*jp)->calls->call, p->call))
    jp = &(*jp)->next;
  if (!*jp)
    return (*jp = job_new(s, p)) != NULL;
  kv_pending **pp = &(*jp)->calls;
  while (*pp)
    pp = &(*pp)->next;
  *pp = p;
  (*jp)->ncalls++;
  (*jp)->nentries += p->call->nentries;
  return true;
}

/* Under the lock: the waiting calls as jobs, counted as running. */
static kv_job *take_pending(attn_kv_store *s) {
  kv_job *jobs = NULL;
  kv_pending *list = s->pending;
  s->pending = NULL;
  while (list) {
    kv_pending *p = list;
    list = p->next;
    p->next = NULL;
    if (!group_add(s, &jobs, p))
      abort(); /* not even a job's few bytes: nothing can go on */
  }
  for (kv_job *j = jobs; j; j = j->next) {
    s->jobs_running++;
    count_batch(s, j->ncalls);
  }
  return jobs;
}

static void start_all(kv_job *jobs) {
  while (jobs) {
    kv_job *j = jobs;
    jobs = j->next;
    job_start(j);
  }
}

/* The job's calls are done (or failed to start); the waiting ones start. */
static void job_end(kv_job *j, const attn_result *res) {
  attn_kv_store *s = j->s;
  pthread_mutex_lock(&s->mu);
  for (kv_pending *p = j->calls; p; p = p->next)
    for (int64_t e = 0; e < p->call->nentries; e++)
      attn__kv_reader_done(s, p->uses[e].ks, p->uses[e].L);
  kv_job *next = --s->jobs_running == 0 ? take_pending(s) : NULL;
  pthread_mutex_unlock(&s->mu);
  for (kv_pending *p = j->calls; p; p = p->next) {
    attn_result mine = *res;
    mine.flops = p->flops;
    p->done(&mine, p->arg);
  }
  job_free(j);
  start_all(next);
}

/* Any engine thread, once the job's outputs are written. */
static void job_done(const attn_result *res, void *arg) {
  kv_job *j = arg;
  if (res->status.code == 0 && j->gathered)
    job_scatter(j);
  job_end(j, res);
}

/* Resolves the call, waiting while an entry would overwrite what a running
 * call reads; applies it and makes it a pending call. Under the lock. */
static int admit(attn_kv_store *s, kv_pending *p, float (*mx)[2], double now, attn_status *st) {
  int rc;
  while ((rc = resolve(s, p->call, p->uses, now, st)) == 1)
    pthread_cond_wait(&s->readers_done, &s->mu);
  if (rc == 0)
    rc = probe(s, p->call, p->uses, &p->flops, st);
  if (rc == 0)
    rc = apply(s, p->call, p->uses, mx, now, st);
  return rc;
}

int attn_kv_submit(attn_kv_store *s, attn_kv_call *call, double now, attn_done_fn done, void *arg,
                   attn_status *st) {
  int rc = call_shape_check(call, st);
  if (rc)
    return rc;
  kv_pending *p = calloc(1, sizeof *p);
  float(*mx)[2] = calloc((size_t)call->nentries, sizeof *mx);
  if (p)
    p->uses = calloc((size_t)call->nentries, sizeof *p->uses);
  rc = !p || !mx || !p->uses ? attn_status_set(st, ATTN_ENOMEM, "out of memory taking a call")
                             : values_check(call, mx, st);
  if (rc) {
    free(mx);
    if (p)
      pending_free(p);
    return rc;
  }
  *p = (kv_pending){.call = call, .done = done, .arg = arg, .uses = p->uses};
  pthread_mutex_lock(&s->mu);
  rc = admit(s, p, mx, now, st);
  kv_job *jobs = NULL;
  if (rc == 0) {
    kv_pending **pp = &s->pending; /* behind the calls waiting already, in order */
    while (*pp)
      pp = &(*pp)->next;
    *pp = p;
    if (!s->batch || s->jobs_running == 0)
      jobs = take_pending(s);
  }
  pthread_mutex_unlock(&s->mu);
  free(mx);
  if (rc)
    pending_free(p);
  start_all(jobs);
  return rc;
}

/* attn_kv_run's call, for attn__run_waiting. */
typedef struct run_ctx {
  attn_kv_store *s;
  attn_kv_call *call;
  double now;
} run_ctx;

static int start_run(void *ctx, attn_done_fn done, void *arg, attn_status *st) {
  const run_ctx *c = ctx;
  return attn_kv_submit(c->s, c->call, c->now, done, arg, st);
}

int attn_kv_run(attn_kv_store *s, attn_kv_call *call, double now, attn_result *res,
                attn_status *st) {
  run_ctx c = {s, call, now};
  return attn__run_waiting(start_run, &c, res, st);
}
