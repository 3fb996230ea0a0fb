/*
 * varlen.c — a variable-length batch (FlashAttention's cu_seqlens) as one
 * job per sequence.
 *
 * Each sequence is a problem of its own (attn__varlen_sub(): batch 1, its
 * own lengths and bottom-right offset, pointers advanced to its rows), so
 * every backend runs both passes of a varlen batch with its ordinary
 * kernels and no padding is computed. The jobs of one request go to one
 * backend and share its cancel flag; the request completes when the last
 * of them does. Its statistics are packed [Hq, total_q], a sequence's
 * [1, Hq, nq]: they pass through a small buffer per sequence (12 bytes a
 * query row), gathered (backward lse_in) before and scattered (forward m,
 * l, lse) after. A sequence with no key, or in a backward pass with no
 * query, is written here: O = 0, m = lse = -inf, l = 0 (with sinks the
 * sink's: m = lse = sinks[h], l = 1); dq, or dk and dv, 0.
 *
 * The request is one job of its own (job.h), never handed to a backend:
 * it is completed through attn__job_complete() like any other, once its
 * last sequence is done, so the caller's result is built in one place.
 */
#include "varlen.h"

#include "handle.h"
#include "request_int.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct varlen_job varlen_job;

typedef struct varlen_seq {
  varlen_job *vj;
  int64_t b;
  attn_request req; /* the sequence's problem */
  float *stats;     /* forward m, l, lse [Hq, nq] each; backward lse_in */
} varlen_seq;

struct varlen_job {
  attn_pool_task task;  /* completes a queued job on a worker (never in its submit) */
  attn_pool_task group; /* small sequences run on the workers in turn (queue_groups) */
  const attn_backend *be;
  attn_engine *e;
  attn_job *whole;         /* the request's own job: its callback, its result */
  const attn_request *req; /* the whole request, strides filled: whole's */
  int64_t refs;            /* running sequences, plus one while submitting */
  pthread_mutex_t mu;
  attn_status status; /* the first failure */
  varlen_seq *seqs;
  float *stats; /* every sequence's buffer, one allocation */
  float *dsk;   /* backward dsinks: [batch, Hq], summed at the end */
  bool here;    /* attn_engine_run_here's: every sequence on the caller's thread */
};

static bool has_work(const attn_request *sub) { return sub->seq_q > 0 && sub->seq_kv > 0; }

static void vj_free(varlen_job *vj) {
  pthread_mutex_destroy(&vj->mu);
  free(vj->dsk);
  free(vj->stats);
  free(vj->seqs);
  free(vj);
}

/* The whole request completes once its buffers are freed; dsinks sums the
 * sequences' in their order, so its bits do not depend on which ended
 * first. */
static void vj_finish(varlen_job *vj) {
  attn_job *whole = vj->whole;
  attn_status st = vj->status;
  const attn_request *r = vj->req;
  for (int64_t h = 0; vj->dsk && !st.code && h < r->heads_q; h++) {
    double sum = 0;
    for (int64_t b = 0; b < r->batch; b++)
      sum += vj->dsk[b * r->heads_q + h];
    r->dsinks[h] = (float)sum;
  }
  vj_free(vj);
  attn__job_complete(whole, st.code ? &st : NULL);
}

static void noop_run(attn_pool_task *t, int64_t item, void *ws) { (void)t, (void)item, (void)ws; }

static void task_finish(attn_pool_task *t) { vj_finish((varlen_job *)t); }

/* Drops one reference; the last completes the job, through the pool when
 * the submitter holds it (the callback never runs inside submit). */
static void vj_release(varlen_job *vj, bool submitter) {
  if (__atomic_sub_fetch(&vj->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  if (!submitter) {
    vj_finish(vj);
    return;
  }
  vj->task.nitems = 1;
  vj->task.run = noop_run;
  vj->task.finish = task_finish;
  attn_pool_submit(attn__engine_pool(vj->e), &vj->task);
}

static void vj_fail(varlen_job *vj, int64_t b, const attn_status *st) {
  pthread_mutex_lock(&vj->mu);
  if (!vj->status.code)
    attn_status_set(&vj->status, st->code, "sequence %lld of the batch: %s", (long long)b,
                    st->message);
  pthread_mutex_unlock(&vj->mu);
}

/* Rows [row0, row0 + n) of every head of a packed [H, total] statistic. */
static void stat_rows(float *dst, const float *src, const attn_request *r, int64_t row0,
                      int64_t n) {
  if (!dst)
    return;
  for (int64_t h = 0; h < r->heads_q; h++)
    for (int64_t i = 0; i < n; i++)
      dst[h * r->seq_q + row0 + i] = src[h * n + i];
}

static void seq_done(const attn_result *res, void *arg) {
  varlen_seq *sq = arg;
  varlen_job *vj = sq->vj;
  const attn_request *r = vj->req, *s = &sq->req;
  if (res->status.code) {
    vj_fail(vj, sq->b, &res->status);
  } else if (r->pass == ATTN_FORWARD && sq->stats) {
    const int64_t n = s->seq_q, row0 = r->cu_seqlens_q[sq->b], per = r->heads_q * n;
    stat_rows(r->m, sq->stats, r, row0, n);
    stat_rows(r->l, sq->stats + per, r, row0, n);
    stat_rows(r->lse, sq->stats + 2 * per, r, row0, n);
  }
  vj_release(vj, false);
}

static void zero_rows(void *base, const int64_t s[3], const attn_request *r, int64_t heads,
                      int64_t n) {
  const size_t es = attn_dtype_size(r->dtype);
  for (int64_t h = 0; h < heads; h++)
    for (int64_t i = 0; i < n; i++)
      memset((char *)base + (size_t)(h * s[1] + i * s[2]) * es, 0, (size_t)r->head_dim * es);
}

/* The statistics of rows that see no key: m = lse = -inf and l = 0, or
 * with sinks those of the sink alone (m = lse = sinks[h], l = 1). */
static void empty_stats(const attn_request *r, int64_t row0, int64_t n) {
  for (int64_t h = 0; h < r->heads_q; h++) {
    const float t = r->sinks ? r->sinks[h] : -INFINITY;
    for (int64_t i = row0; i < row0 + n; i++) {
      const int64_t at = h * r->seq_q + i;
      if (r->m)
        r->m[at] = t;
      if (r->l)
        r->l[at] = r->sinks ? 1.0f : 0.0f;
      if (r->lse)
        r->lse[at] = t;
    }
  }
}

/* The outputs of a sequence no kernel runs: no key (forward O and stats,
 * backward dq) or, backward, no query (dk and dv). */
static void write_empty(const attn_request *r, const attn_request *s, int64_t row0) {
  if (s->seq_kv == 0 && r->pass == ATTN_FORWARD) {
    zero_rows(s->o, s->o_stride, s, s->heads_q, s->seq_q);
    empty_stats(r, row0, s->seq_q);
  } else if (s->seq_kv == 0) {
    zero_rows(s->dq, s->dq_stride, s, s->heads_q, s->seq_q);
  } else if (r->pass == ATTN_BACKWARD) {
    zero_rows(s->dk, s->dk_stride, s, s->heads_kv, s->seq_kv);
    zero_rows(s->dv, s->dv_stride, s, s->heads_kv, s->seq_kv);
  }
}

/* The sequences' problems, and one backend that supports them all: the one
 * picked for the largest (a 1 x 1 stand-in when none has work, so that the
 * backend's name is still checked and reported). */
static int plan_seqs(varlen_job *vj, const attn_backend **pbe, attn_status *st) {
  const attn_request *r = vj->req;
  int64_t big = -1, most = -1;
  for (int64_t b = 0; b < r->batch; b++) {
    varlen_seq *sq = &vj->seqs[b];
    sq->vj = vj;
    sq->b = b;
    attn__varlen_sub(r, b, &sq->req);
    int64_t size = sq->req.seq_q * sq->req.seq_kv;
    if (has_work(&sq->req) && size > most) {
      most = size;
      big = b;
    }
  }
  attn_request probe = vj->seqs[big < 0 ? 0 : big].req;
  if (big < 0)
    probe.seq_q = probe.seq_kv = 1;
  int rc = attn__engine_pick(vj->e, &probe, pbe, st);
  for (int64_t b = 0; rc == 0 && b < r->batch; b++)
    if (b != big && has_work(&vj->seqs[b].req))
      rc = (*pbe)->ops.supports((*pbe)->state, &vj->seqs[b].req, st);
  return rc;
}

/* Statistics buffers (and the gathered lse_in) of the sequences with work. */
static int alloc_stats(varlen_job *vj, attn_status *st) {
  const attn_request *r = vj->req;
  const bool fwd = r->pass == ATTN_FORWARD;
  if (r->dsinks) { /* a sequence that runs no kernel adds 0 */
    vj->dsk = calloc((size_t)(r->batch * r->heads_q), sizeof *vj->dsk);
    if (!vj->dsk)
      return attn_status_set(st, ATTN_ENOMEM, "out of memory for a variable-length batch");
    for (int64_t b = 0; b < r->batch; b++)
      vj->seqs[b].req.dsinks = has_work(&vj->seqs[b].req) ? vj->dsk + b * r->heads_q : NULL;
  }
  const int per = fwd ? (r->m || r->l || r->lse ? 3 : 0) : (r->lse_in ? 1 : 0);
  if (!per)
    return 0;
  vj->stats = malloc((size_t)(per * r->heads_q * r->seq_q) * sizeof(float) + 1);
  if (!vj->stats)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for a variable-length batch");
  float *p = vj->stats;
  for (int64_t b = 0; b < r->batch; b++) {
    varlen_seq *sq = &vj->seqs[b];
    const int64_t n = sq->req.seq_q, row0 = r->cu_seqlens_q[b], rows = r->heads_q * n;
    sq->stats = p;
    p += per * rows;
    if (fwd) {
      sq->req.m = r->m ? sq->stats : NULL;
      sq->req.l = r->l ? sq->stats + rows : NULL;
      sq->req.lse = r->lse ? sq->stats + 2 * rows : NULL;
      continue;
    }
    for (int64_t h = 0; h < r->heads_q; h++)
      memcpy(sq->stats + h * n, r->lse_in + h * r->seq_q + row0, (size_t)n * sizeof(float));
    sq->req.lse_in = sq->stats;
  }
  return 0;
}

/* Sequence b queued (here: run on this thread where the backend can), or
 * written here when it has no work; false when it could not be queued,
 * the job's result then. */
static bool queue_seq(varlen_job *vj, int64_t b, bool here) {
  const attn_request *r = vj->req;
  varlen_seq *sq = &vj->seqs[b];
  if (!has_work(&sq->req)) {
    write_empty(r, &sq->req, r->cu_seqlens_q[b]);
    return true;
  }
  attn_status st = {0};
  __atomic_add_fetch(&vj->refs, 1, __ATOMIC_ACQ_REL);
  if (attn__backend_queue(vj->be, attn__engine_jobs(vj->e), &sq->req, here, seq_done, sq, &st) == 0)
    return true;
  vj_fail(vj, b, &st);
  __atomic_sub_fetch(&vj->refs, 1, __ATOMIC_ACQ_REL);
  return false;
}

/* Queues the sequences with work; a failure after the first is the job's
 * result (its callback still runs once), as jobs already queued cannot be
 * taken back. */
static void queue_seqs(varlen_job *vj) {
  for (int64_t b = 0; b < vj->req->batch && queue_seq(vj, b, vj->here); b++)
    ;
}

/* Sequences of at most this much work each (a decode step of a few
 * thousand keys) are grouped: a job each costs some microseconds of
 * hand-offs to the workers, more than such a sequence's arithmetic. */
#define SMALL_SEQ_FLOPS ((double)(1 << 22))

static bool small_seqs(const varlen_job *vj) {
  for (int64_t b = 0; b < vj->req->batch; b++)
    if (attn_request_flops(&vj->seqs[b].req) > SMALL_SEQ_FLOPS)
      return false;
  return true;
}

static varlen_job *of_group(attn_pool_task *t) {
  return (varlen_job *)((char *)t - offsetof(varlen_job, group));
}

/* Group item g: sequences g, g + n, g + 2n, ... run on this worker. */
static void group_run(attn_pool_task *t, int64_t item, void *ws) {
  varlen_job *vj = of_group(t);
  (void)ws;
  for (int64_t b = item; b < vj->req->batch && queue_seq(vj, b, true); b += t->nitems)
    ;
}

static void group_finish(attn_pool_task *t) { vj_release(of_group(t), false); }

/* A batch of small sequences as one task of one item a worker, each item
 * running its share of the sequences one after the other on its worker,
 * instead of a job each through the queue. The task holds a reference
 * until its last item is done. */
static void queue_groups(varlen_job *vj) {
  attn_pool *p = attn__engine_pool(vj->e);
  int64_t n = attn_pool_threads(p);
  vj->group = (attn_pool_task){
      .nitems = n < vj->req->batch ? n : vj->req->batch, .run = group_run, .finish = group_finish};
  __atomic_add_fetch(&vj->refs, 1, __ATOMIC_ACQ_REL);
  attn_pool_submit(p, &vj->group);
}

int attn__varlen_submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done,
                        void *arg, attn_status *st) {
  varlen_job *vj = calloc(1, sizeof *vj);
  if (!vj || !(vj->seqs = calloc((size_t)r->batch, sizeof *vj->seqs)) ||
      !(vj->whole = attn__job_new(attn__engine_jobs(e), r, done, arg))) {
    if (vj)
      free(vj->seqs);
    free(vj);
    return attn_status_set(st, ATTN_ENOMEM, "out of memory for a variable-length batch");
  }
  pthread_mutex_init(&vj->mu, NULL);
  vj->e = e;
  vj->here = here;
  vj->req = &vj->whole->req;
  const attn_backend *be;
  int rc = plan_seqs(vj, &be, st);
  if (rc == 0)
    rc = alloc_stats(vj, st);
  if (rc < 0) {
    attn__job_drop(vj->whole);
    vj_free(vj);
    return rc;
  }
  vj->whole->backend = be->ops.name;
  vj->be = be;
  vj->refs = 1;
  if (!here && r->batch > 1 && small_seqs(vj))
    queue_groups(vj);
  else
    queue_seqs(vj);
  vj_release(vj, !here); /* run here, it may complete here */
  return 0;
}
