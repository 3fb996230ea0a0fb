/*
 * batch.c — the engine request a session call runs as: one entry alone
 * over its layer's pages, or a job of several calls (kv_int.h). Which calls
 * run together (the same options and shapes), and how their job is built:
 * a variable-length batch whose sequence e is entry e, which the varlen
 * path computes as the problem it would be alone, so every reply is bit
 * for bit the one the call gets alone; on a device, one batch of its
 * entries when they have the same query rows.
 *
 * Pure work on the calls and their pages' tables: no lock is taken here
 * (the callers hold the store's, or own the job), and nothing here calls
 * the rest of the store.
 */
#include "kv_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void attn__kv_pending_free(kv_pending *p) { free(p); /* uses and mx with it */ }

void attn__kv_job_free(kv_job *j) {
  for (kv_pending *p = j->calls, *n; p; p = n) {
    n = p->next;
    attn__kv_pending_free(p);
  }
  free(j->kp);
  free(j->vp);
  free(j->cu_q);
  free(j->cu_kv);
  free(j->used);
  free(j->rows);
  free(j->buf);
  free(j);
}

int64_t attn__kv_entry_rows(const attn_kv_call *c, int64_t e) {
  const int64_t *cu = c->req.cu_seqlens_q;
  return cu ? cu[e + 1] - cu[e] : c->req.seq_q;
}

/* Entry e's new rows of KV head h of K (t 0) or V (t 1), packed. */
const char *attn__kv_new_rows(const attn_kv_call *c, int64_t e, int t, int64_t h, size_t row) {
  const attn_kv_entry *en = &c->entries[e];
  return (const char *)(t ? c->v_new : c->k_new) + (size_t)(h * c->total_new + en->kv_off) * row;
}

/* Where r's pages are and who reads them: the cpu backend host pages, the
 * backend that lent them a device's (rows padded to ks's pitch). */
static void pages_of(const attn_kv_store *s, const kv_session *ks, attn_request *r) {
  r->page_tokens = ks->page_tokens;
  r->page_pitch = s->pages.dev ? ks->pitch : 0;
  r->backend = s->pages.dev ? s->pages.dev->ops.name : "cpu";
  r->kv_quant = ks->shape.kv_quant;
}

void attn__kv_lone_request(const attn_kv_store *s, const attn_kv_call *c, int64_t e,
                           const kv_use *u, attn_request *r) {
  const kv_session *ks = u->ks;
  *r = c->req;
  r->batch = 1;
  r->heads_kv = ks->shape.heads_kv;
  r->head_dim = ks->shape.head_dim;
  r->head_dim_v = attn_kv_shape_dv(&ks->shape);
  r->seq_q = attn__kv_entry_rows(c, e);
  r->seq_kv = u->extent;
  r->cu_seqlens_q = r->cu_seqlens_kv = NULL;
  r->k = r->v = NULL;
  r->page_rows = NULL;
  r->npage_rows = 0;
  r->k_pages = (const void *const *)u->L->kp;
  r->v_pages = (const void *const *)(u->L->vp ? u->L->vp : u->L->kp);
  r->pages_per_head = ks->pages_per_head;
  memcpy(r->kv_absmax, u->L->absmax, sizeof r->kv_absmax);
  pages_of(s, ks, r);
}

/* ---- which calls run together ---------------------------------------------- */

static bool same_double(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

static bool same_shape(const kv_session *a, const kv_session *b) {
  return a->shape.heads_kv == b->shape.heads_kv && a->shape.head_dim == b->shape.head_dim &&
         attn_kv_shape_dv(&a->shape) == attn_kv_shape_dv(&b->shape) &&
         a->shape.v_from_k == b->shape.v_from_k && a->shape.dtype == b->shape.dtype &&
         a->shape.kv_quant == b->shape.kv_quant && a->page_tokens == b->page_tokens &&
         a->pitch == b->pitch;
}

/* Whether every entry of p has the sessions' shape of x's first entry:
 * a job's page tables and heads are built for one shape. */
static bool shapes_fit(const kv_pending *x, const kv_pending *p) {
  for (int64_t e = 0; e < p->call->nentries; e++)
    if (!same_shape(x->uses[0].ks, p->uses[e].ks))
      return false;
  return true;
}

/* Sinks (heads_q of them) both absent, or of the same values: the batch
 * computes every call with the first call's. */
static bool same_sinks(const attn_request *x, const attn_request *y) {
  if (!x->sinks || !y->sinks)
    return !x->sinks && !y->sinks;
  return memcmp(x->sinks, y->sinks, (size_t)x->heads_q * sizeof *x->sinks) == 0;
}

/* Whether two calls can be computed as one batch: the same options, so
 * the batch's one set of them is each call's own, and the same shapes. */
static bool mergeable(const kv_pending *pa, const kv_pending *pb) {
  const attn_request *x = &pa->call->req, *y = &pb->call->req;
  return x->dtype == y->dtype && x->heads_q == y->heads_q && x->head_dim == y->head_dim &&
         attn_request_dv(x) == attn_request_dv(y) && same_sinks(x, y) &&
         same_double(x->scale, y->scale) && x->causal == y->causal &&
         x->window_left == y->window_left && x->window_right == y->window_right &&
         same_double(x->softcap, y->softcap) && !x->alibi_slopes && !y->alibi_slopes &&
         !x->m == !y->m && !x->l == !y->l && !x->lse == !y->lse && shapes_fit(pa, pb);
}

kv_job *attn__kv_job_new(attn_kv_store *s, kv_pending *p) {
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
bool attn__kv_group_add(attn_kv_store *s, kv_job **jobs, kv_pending *p) {
  kv_job **jp = jobs;
  while (*jp && !mergeable((*jp)->calls, p))
    jp = &(*jp)->next;
  if (!*jp)
    return (*jp = attn__kv_job_new(s, p)) != NULL;
  kv_pending **pp = &(*jp)->calls;
  while (*pp)
    pp = &(*pp)->next;
  *pp = p;
  (*jp)->ncalls++;
  (*jp)->nentries += p->call->nentries;
  return true;
}

/* ---- building a job ---------------------------------------------------------- */

static int64_t job_rows(const kv_job *j) {
  int64_t n = 0;
  for (kv_pending *p = j->calls; p; p = p->next)
    n += p->call->req.seq_q;
  return n;
}

/* Entry e of p into the batch's row b of page tables and offsets. */
static void table_row(kv_job *j, const kv_pending *p, int64_t e, int64_t b, int64_t q0,
                      int64_t pph) {
  const kv_use *u = &p->uses[e];
  const int64_t hkv = j->req.heads_kv;
  const int64_t used = (u->extent + u->ks->page_tokens - 1) / u->ks->page_tokens;
  void **vp = u->L->vp ? u->L->vp : u->L->kp; /* a latent session's values are its keys */
  for (int64_t h = 0; h < hkv; h++) {
    memcpy(&j->kp[(b * hkv + h) * pph], &u->L->kp[h * u->ks->pages_per_head],
           (size_t)used * sizeof *j->kp);
    memcpy(&j->vp[(b * hkv + h) * pph], &vp[h * u->ks->pages_per_head],
           (size_t)used * sizeof *j->vp);
  }
  const attn_request *cr = &p->call->req;
  j->cu_q[b + 1] = q0 + (cr->cu_seqlens_q ? cr->cu_seqlens_q[e + 1] : cr->seq_q);
  j->cu_kv[b + 1] = j->cu_kv[b] + u->extent;
  j->req.kv_absmax[0] = fmaxf(j->req.kv_absmax[0], u->L->absmax[0]);
  j->req.kv_absmax[1] = fmaxf(j->req.kv_absmax[1], u->L->absmax[1]);
}

/* The batch's page tables, [entry][heads_kv][pages_per_head], and offsets. */
static int job_tables(kv_job *j, int64_t pph) {
  const size_t n = (size_t)(j->nentries * j->req.heads_kv * pph);
  j->kp = calloc(n ? n : 1, sizeof *j->kp);
  j->vp = calloc(n ? n : 1, sizeof *j->vp);
  j->cu_q = calloc((size_t)j->nentries + 1, sizeof *j->cu_q);
  j->cu_kv = calloc((size_t)j->nentries + 1, sizeof *j->cu_kv);
  if (!j->kp || !j->vp || !j->cu_q || !j->cu_kv)
    return -1;
  int64_t b = 0, q0 = 0;
  for (kv_pending *p = j->calls; p; p = p->next) {
    for (int64_t e = 0; e < p->call->nentries; e++, b++)
      table_row(j, p, e, b, q0, pph);
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
               qb = (size_t)(r->heads_q * r->seq_q * r->head_dim) * es,
               ob = (size_t)(r->heads_q * r->seq_q * attn_request_dv(r)) * es;
  const size_t sb = (size_t)(r->heads_q * r->seq_q) * sizeof(float);
  const size_t fo = (qb + ob + sizeof(float) - 1) / sizeof(float) * sizeof(float);
  j->buf = malloc(fo + 3 * sb + 1);
  if (!j->buf)
    return -1;
  r->q = j->buf;
  r->o = j->buf + qb;
  float *f = (float *)(void *)(j->buf + fo);
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
void attn__kv_job_scatter(const kv_job *j) {
  const attn_request *r = &j->req;
  const size_t es = attn_dtype_size(r->dtype);
  int64_t row0 = 0;
  for (kv_pending *p = j->calls; p; p = p->next) {
    const attn_request *cr = &p->call->req;
    const int64_t n = cr->seq_q;
    rows_copy(cr->o, n, 0, r->o, r->seq_q, row0, r->heads_q, n, (size_t)attn_request_dv(r) * es);
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
      int64_t n = attn__kv_entry_rows(p->call, e);
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
  const int64_t total = r->seq_q, B = j->nentries, d = r->head_dim, dv = attn_request_dv(r);
  if (!(j->used = malloc((size_t)B * sizeof *j->used)))
    return -1;
  int64_t most = 0;
  for (int64_t b = 0; b < B; b++) {
    j->used[b] = j->cu_kv[b + 1] - j->cu_kv[b];
    most = j->used[b] > most ? j->used[b] : most;
  }
  const int64_t stride[3] = {nq * d, total * d, d}, ostride[3] = {nq * dv, total * dv, dv};
  memcpy(r->q_stride, stride, sizeof stride);
  memcpy(r->o_stride, ostride, sizeof ostride);
  r->seq_q = nq;
  r->seq_kv = most;
  r->seqused_kv = j->used;
  r->cu_seqlens_q = r->cu_seqlens_kv = NULL;
  return 0;
}

/* A batch's request: the first call's options over every entry. */
static int batch_build(kv_job *j) {
  const kv_pending *p = j->calls;
  attn_request *r = &j->req;
  *r = p->call->req;
  int64_t pph = 1;
  for (kv_pending *q = j->calls; q; q = q->next)
    for (int64_t e = 0; e < q->call->nentries; e++)
      pph = q->uses[e].ks->pages_per_head > pph ? q->uses[e].ks->pages_per_head : pph;
  r->heads_kv = p->uses[0].ks->shape.heads_kv;
  r->head_dim = p->uses[0].ks->shape.head_dim;
  r->head_dim_v = attn_kv_shape_dv(&p->uses[0].ks->shape);
  r->batch = j->nentries;
  r->seq_q = job_rows(j);
  r->k = r->v = NULL;
  pages_of(j->s, p->uses[0].ks, r);
  r->pages_per_head = pph;
  r->kv_absmax[0] = r->kv_absmax[1] = 0;
  j->gathered = j->ncalls > 1; /* several calls' q, o: one buffer, one cancel */
  if (j->gathered)
    r->cancel = &j->cancel;
  if (job_tables(j, pph) < 0 || (j->gathered && job_gather(j) < 0))
    return -1;
  r->k_pages = (const void *const *)j->kp;
  r->v_pages = (const void *const *)j->vp;
  r->cu_seqlens_q = j->cu_q;
  r->cu_seqlens_kv = j->cu_kv;
  r->seq_kv = j->cu_kv[j->nentries];
  int64_t nq = uniform_rows(j);
  return nq ? as_batch(j, nq) : 0;
}

/* ---- a device job's new rows -------------------------------------------- */

/* Entry e's spans (K and V, each KV head, each page touched) into out
 * (when set); how many. Only of a shape whose K and V rows are head_dim
 * wide (page_rows' rows are). */
static int64_t entry_spans(const attn_kv_call *c, int64_t e, const kv_use *u, attn_page_rows *out) {
  const attn_kv_entry *en = &c->entries[e];
  const kv_session *ks = u->ks;
  const size_t row = (size_t)ks->shape.head_dim * attn_dtype_size(ks->shape.dtype);
  int64_t k = 0;
  for (int t = 0; t < attn__kv_tensors(&ks->shape); t++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t i = 0, n; i < en->n_new; i += n, k++) {
        n = attn__kv_span(ks, en->pos + i, en->pos + en->n_new);
        if (out)
          out[k] = (attn_page_rows){attn__kv_new_rows(c, e, t, h, row) + (size_t)i * row,
                                    attn__kv_row_at(ks, u->L, t, h, en->pos + i), n};
      }
  return k;
}

/* Every append's spans, or n of them counted (into NULL). */
static int64_t job_spans(const kv_job *j, attn_page_rows *out) {
  int64_t n = 0;
  for (const kv_pending *p = j->calls; p; p = p->next)
    for (int64_t e = 0; e < p->call->nentries; e++)
      if (p->uses[e].append)
        n += entry_spans(p->call, e, &p->uses[e], out ? out + n : NULL);
  return n;
}

/* A device job's new rows into its request, which writes them before it
 * reads its pages; 0, or -1 out of memory. Not for values of a head dim of
 * their own: page_rows are not taken with head_dim_v (their rows would be
 * two widths), and such a job's rows are the caller's to write. */
static int rows_build(kv_job *j) {
  if (attn_request_dv(&j->req) != j->req.head_dim)
    return 0;
  const int64_t n = job_spans(j, NULL);
  if (n == 0)
    return 0;
  if (!(j->rows = malloc((size_t)n * sizeof *j->rows)))
    return -1;
  job_spans(j, j->rows);
  j->req.page_rows = j->rows;
  j->req.npage_rows = n;
  return 0;
}

/* The request of a job: one lone entry on the call's buffers, or a
 * variable-length batch (one batch on a device, when its entries allow).
 * On a device, a request the engine runs whole carries the new rows; a
 * variable-length batch (split by the engine) does not, and its rows are
 * the caller's to write. 0; -1 out of memory; -2 when its calls are not
 * all of one shape. */
int attn__kv_job_build(kv_job *j) {
  const kv_pending *p = j->calls;
  for (const kv_pending *q = p; q; q = q->next)
    if (!shapes_fit(p, q))
      return -2; /* attn__kv_group_add and the call's checks keep this from happening */
  if (j->ncalls == 1 && p->call->nentries == 1)
    attn__kv_lone_request(j->s, p->call, 0, &p->uses[0], &j->req);
  else if (batch_build(j) < 0)
    return -1;
  return j->s->pages.dev && !j->req.cu_seqlens_q ? rows_build(j) : 0;
}
