/*
 * sched.c — a session call from its submit to its end (kv.h,
 * attn_kv_submit, attn_kv_run, attn_kv_run_here, attn_kv_cancel): an
 * admitted call's new rows stored, when it starts and with which calls
 * (batch.c builds the job), its cancel, and what its job's end sets going.
 *
 * A call starts at once unless a job that reads one of its layers is
 * running and batching is on; then it waits, admitted (its tokens stored,
 * so in arrival order), for that layer's jobs only, never for another
 * session's. On a device the tokens are stored by the call's job, so a
 * call waits, batching or not, for the jobs of its layers and behind the
 * calls waiting on them. The calls that become free together run as one job per set of
 * matching options and shapes (batch.c), each reply bit for bit the one the
 * call gets alone. A job of several calls is canceled once every one of its
 * callers has canceled.
 *
 * Calls go one way between the files: this one calls admit.c (a call's
 * checks and admission; the parked calls retried when a write or a job
 * ends) and batch.c, and neither calls back; the recursion of a job's end
 * starting more jobs stays inside this file (after).
 */
#include "job.h"
#include "kv_int.h"
#include "request_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What was found under the lock, done without it (below: it starts jobs
 * whose ends find more). */
static void after(attn_kv_store *s, kv_after *a);

/* ---- when a call starts ----------------------------------------------------- */

static void count_batch(attn_kv_store *s, int64_t ncalls) {
  int b = 0;
  while (b < ATTN_KV_BATCH_BUCKETS - 1 && ((int64_t)1 << b) < ncalls)
    b++;
  s->stats.batch_sizes[b]++;
  s->stats.batched_calls += (uint64_t)ncalls;
}

static bool canceled(const kv_pending *p) { return attn_cancel_is_set(p->call->req.cancel); }

/* Sets the job's own cancel once every caller has canceled. */
static void cancel_check(kv_job *j) {
  for (const kv_pending *p = j->calls; p; p = p->next)
    if (!canceled(p))
      return;
  attn_cancel_set(&j->cancel);
}

/* Under the lock: j counts as running, on each of its layers too. */
static void job_running(attn_kv_store *s, kv_job *j, kv_after *a) {
  for (kv_pending *p = j->calls; p; p = p->next)
    for (int64_t e = 0; e < p->call->nentries; e++)
      p->uses[e].L->jobs++;
  count_batch(s, j->ncalls);
  cancel_check(j);
  j->run_next = s->running;
  s->running = j;
  j->next = a->jobs;
  a->jobs = j;
}

/* Whether one of p's layers has a job running. */
static bool busy(const kv_pending *p) {
  for (int64_t e = 0; e < p->call->nentries; e++)
    if (p->uses[e].L->jobs > 0)
      return true;
  return false;
}

static bool appends(const kv_pending *p) {
  for (int64_t e = 0; e < p->call->nentries; e++)
    if (p->uses[e].append)
      return true;
  return false;
}

/* Whether p's rows wait for its job (a device store's appends): such a
 * call is never dropped before its job, which writes them even canceled. */
static bool owes_rows(const attn_kv_store *s, const kv_pending *p) {
  return s->pages.dev && appends(p);
}

/* Whether calls a and b use a layer in common. */
static bool shares(const kv_pending *a, const kv_pending *b) {
  for (int64_t e = 0; e < a->call->nentries; e++)
    for (int64_t f = 0; f < b->call->nentries; f++)
      if (a->uses[e].L == b->uses[f].L)
        return true;
  return false;
}

/* Whether a call of the list before `end` (NULL: all) uses one of p's
 * layers. */
static bool behind(const kv_pending *list, const kv_pending *end, const kv_pending *p) {
  for (const kv_pending *q = list; q != end; q = q->next)
    if (shares(q, p))
      return true;
  return false;
}

/* Whether one of p's layers is read by a job of the list. */
static bool taken(const kv_job *jobs, const kv_pending *p) {
  for (const kv_job *j = jobs; j; j = j->next)
    if (behind(j->calls, NULL, p))
      return true;
  return false;
}

/* On a device, whether p must wait: a call before it on one of its layers
 * (running, in a job of this round, or waiting itself, its rows maybe for
 * another layer's job) may not have written the rows p reads. */
static bool must_follow(const attn_kv_store *s, const kv_job *jobs, const kv_pending *p) {
  return s->pages.dev && (taken(jobs, p) || behind(s->pending, p, p));
}

/* A call whose caller canceled it while it waited: its uses end, and it is
 * answered with ECANCELED, never computed. */
static void drop_canceled(attn_kv_store *s, kv_pending *p, kv_after *a) {
  attn__kv_release(s, p);
  attn__canceled(&p->st);
  p->next = a->failed;
  a->failed = p;
}

/* p as a job of its own at the end of the list; false out of memory. */
static bool group_alone(attn_kv_store *s, kv_job **jobs, kv_pending *p) {
  while (*jobs)
    jobs = &(*jobs)->next;
  return (*jobs = attn__kv_job_new(s, p)) != NULL;
}

/* Under the lock: the waiting calls none of whose layers has a job now,
 * as jobs (counted as running) into a. On a device, a call on a layer
 * that one of these jobs reads waits for it (taken), and without batching
 * each call is a job of its own. */
static void take_ready(attn_kv_store *s, kv_after *a) {
  kv_pending *ready = NULL, **rt = &ready, **pp = &s->pending;
  kv_job *jobs = NULL;
  while (*pp) {
    kv_pending *p = *pp;
    if (busy(p) || must_follow(s, jobs, p)) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    p->next = NULL;
    if (!s->pages.dev) {
      *rt = p;
      rt = &p->next;
    } else if (canceled(p) && !owes_rows(s, p)) {
      drop_canceled(s, p, a);
    } else if (!(s->batch ? attn__kv_group_add(s, &jobs, p) : group_alone(s, &jobs, p))) {
      abort();
    }
  }
  while (ready) {
    kv_pending *p = ready;
    ready = p->next;
    p->next = NULL;
    if (canceled(p))
      drop_canceled(s, p, a);
    else if (!attn__kv_group_add(s, &jobs, p))
      abort(); /* not even a job's few bytes: nothing can go on */
  }
  while (jobs) {
    kv_job *j = jobs;
    jobs = j->next;
    job_running(s, j, a);
  }
}

/* Under the lock: an admitted call to a job now, or waiting for its
 * layers' jobs (batching). */
static void schedule(attn_kv_store *s, kv_pending *p, kv_after *a) {
  p->next = NULL;
  /* canceled while its rows were stored: attn_kv_cancel could not see it */
  if (canceled(p) && !owes_rows(s, p)) {
    drop_canceled(s, p, a);
    return;
  }
  if ((s->batch && busy(p)) || (s->pages.dev && (busy(p) || behind(s->pending, NULL, p)))) {
    kv_pending **pp = &s->pending; /* behind the calls waiting already, in order */
    while (*pp)
      pp = &(*pp)->next;
    *pp = p;
    return;
  }
  kv_job *j = attn__kv_job_new(s, p);
  if (!j)
    abort(); /* as take_ready */
  job_running(s, j, a);
}

/* ---- storing the new rows -------------------------------------------------- */

/* A quantized session's span of rows quantized into q (a page's bytes),
 * their largest |k| or |v| bound raised to theirs (for the stored rows
 * the kernel reads, not the call's). */
static const void *quantized(const kv_session *ks, int t, const char *src, int64_t n, char *q,
                             float *mx) {
  int64_t bad;
  attn__kv_quantize(&ks->shape, t, src, n, q);
  *mx = fmaxf(*mx, attn__kv_xrows_absmax(&ks->shape, t, q, n, &bad));
  return q;
}

/* Writes entry e's new tokens into the pages claim took, a page's span at a
 * time (on a device: one small synchronous upload each, when its job does
 * not carry them); without the lock. A quantized session's rows are
 * quantized on the way, and mx (its new tokens' largest |k|, |v|) becomes
 * the stored rows' bound. */
static int store_entry(const attn_kv_store *s, const attn_kv_call *c, int64_t e, const kv_use *u,
                       float mx[2], attn_status *st) {
  const attn_kv_entry *en = &c->entries[e];
  const kv_session *ks = u->ks;
  char *q = ks->shape.kv_quant ? malloc(ATTN_KV_PAGE_BYTES) : NULL;
  if (ks->shape.kv_quant && !q)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory quantizing a session's rows");
  if (q)
    mx[0] = mx[1] = 0;
  int rc = 0;
  for (int t = 0; t < attn__kv_tensors(&ks->shape); t++)
    for (int64_t h = 0; h < ks->shape.heads_kv; h++)
      for (int64_t j = 0, n; j < en->n_new && rc == 0; j += n) {
        const size_t row = (size_t)attn__kv_cols(&ks->shape, t) * attn_dtype_size(ks->shape.dtype);
        const char *src = attn__kv_new_rows(c, e, t, h, row) + (size_t)j * row;
        n = attn__kv_span(ks, en->pos + j, en->pos + en->n_new);
        rc = attn__kv_rows_put(s, ks, u->L, t, h, en->pos + j, n,
                               q ? quantized(ks, t, src, n, q, &mx[t]) : src, st);
      }
  if (q && ks->shape.v_from_k)
    mx[1] = mx[0];
  free(q);
  return rc;
}

/* Under the lock: the appends' new lengths (unless a truncate cut the
 * layer meanwhile: it came after), or none when storing failed. */
static void publish(attn_kv_store *s, kv_pending *p, bool ok) {
  const attn_kv_call *c = p->call;
  for (int64_t e = 0; e < c->nentries; e++) {
    kv_use *u = &p->uses[e];
    const attn_kv_entry *en = &c->entries[e];
    if (!u->append)
      continue;
    if (ok && !u->L->cut)
      u->L->length = en->pos + en->n_new;
    if (ok) {
      u->L->absmax[0] = fmaxf(u->L->absmax[0], p->mx[e][0]);
      u->L->absmax[1] = fmaxf(u->L->absmax[1], p->mx[e][1]);
      s->stats.appended_tokens += (uint64_t)en->n_new;
    }
    u->L->writing = u->L->cut = false;
  }
}

/* Every append's rows of a device job, the synchronous way: a job whose
 * request did not carry them, or that failed (it may have written some);
 * without the lock, while its calls still read their layers, so nothing
 * else writes those rows meanwhile. */
static int store_owed(kv_job *j, attn_status *st) {
  int rc = 0;
  for (const kv_pending *p = j->calls; rc == 0 && p; p = p->next)
    for (int64_t e = 0; rc == 0 && e < p->call->nentries; e++)
      if (p->uses[e].append)
        rc = store_entry(j->s, p->call, e, &p->uses[e], p->mx[e], st);
  j->owes_rows = rc != 0;
  return rc;
}

/* Without the lock: an admitted call's rows stored (on a device, its job
 * writes them), then the call scheduled; 0, or the error with nothing
 * appended. */
static int land(attn_kv_store *s, kv_pending *p, kv_after *a, attn_status *st) {
  int rc = 0;
  for (int64_t e = 0; rc == 0 && !s->pages.dev && e < p->call->nentries; e++)
    if (p->uses[e].append)
      rc = store_entry(s, p->call, e, &p->uses[e], p->mx[e], st);
  pthread_mutex_lock(&s->mu);
  publish(s, p, rc == 0);
  if (rc)
    attn__kv_release(s, p);
  else
    schedule(s, p, a);
  attn__kv_retry_parked(s, a); /* a write ended */
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    char why[sizeof st->message];
    snprintf(why, sizeof why, "%s", st->message);
    rc = attn_status_set(st, ATTN_EDEVICE, "storing the new tokens failed: %s", why);
  }
  return rc;
}

/* ---- running ---------------------------------------------------------------- */

static void unlink_running(attn_kv_store *s, kv_job *j) {
  kv_job **jp = &s->running;
  while (*jp && *jp != j)
    jp = &(*jp)->run_next;
  if (*jp)
    *jp = j->run_next;
}

/* The job's calls are done (or failed to start): their uses end, the calls
 * that waited for its layers start, and each caller gets its result. */
static void job_end(kv_job *j, const attn_result *res) {
  attn_kv_store *s = j->s;
  kv_after a = {0};
  pthread_mutex_lock(&s->mu);
  unlink_running(s, j);
  for (kv_pending *p = j->calls; p; p = p->next) {
    for (int64_t e = 0; e < p->call->nentries; e++)
      p->uses[e].L->jobs--;
    attn__kv_release(s, p);
  }
  take_ready(s, &a);
  attn__kv_retry_parked(s, &a);
  pthread_mutex_unlock(&s->mu);
  for (kv_pending *p = j->calls; p; p = p->next) {
    attn_result mine = *res;
    mine.flops = p->flops;
    p->done(&mine, p->arg);
  }
  attn__kv_job_free(j);
  after(s, &a);
}

/* Any engine thread, once the job's outputs are written. A device job
 * that failed may not have written its rows: written again here, before
 * the calls waiting for its layers start (a device that cannot take even
 * these is lost, its sessions with it). */
static void job_done(const attn_result *res, void *arg) {
  kv_job *j = arg;
  attn_status st;
  if (res->status.code == 0 && j->gathered)
    attn__kv_job_scatter(j);
  if (res->status.code != 0 && j->owes_rows)
    store_owed(j, &st);
  job_end(j, res);
}

/* The engine request of a job; 0 or the error. */
static int job_request(kv_job *j, attn_status *st) {
  int b = attn__kv_job_build(j);
  if (b == -1)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory batching calls");
  if (b == -2)
    return attn_status_set(st, ATTN_ESHAPE,
                           "the sessions of one job must share heads_kv, head_dim, head_dim_v, "
                           "v_from_k and dtype");
  return 0;
}

/* The engine request of a job ready to go: built, and on a device the
 * rows of a request that does not carry them written first; 0 or the
 * error. */
static int job_ready(kv_job *j, attn_status *st) {
  for (const kv_pending *p = j->calls; p && !j->owes_rows; p = p->next)
    j->owes_rows = owes_rows(j->s, p);
  int rc = job_request(j, st);
  if (rc == 0 && j->owes_rows && j->req.npage_rows == 0 && store_owed(j, st)) {
    char why[sizeof st->message];
    snprintf(why, sizeof why, "%s", st->message);
    rc = attn_status_set(st, ATTN_EDEVICE, "storing the new tokens failed: %s", why);
  }
  return rc;
}

/* Builds and submits a job (counted as running already); on failure its
 * calls end with the error. */
static void job_start(kv_job *j) {
  attn_status st;
  int rc = job_ready(j, &st);
  if (rc == 0)
    rc = attn_engine_submit(j->s->engine, &j->req, job_done, j, &st);
  if (rc) {
    attn_result res = {.status = st};
    job_done(&res, j);
  }
}

/* The same job computed on this thread, ended here. */
static void job_run_here(kv_job *j) {
  attn_status st;
  attn_result res = {0};
  int rc = job_ready(j, &st);
  if (rc == 0)
    rc = attn_engine_run_here(j->s->engine, &j->req, &res, &st);
  if (rc && !res.status.code)
    res.status = st; /* refused before it ran */
  job_done(&res, j);
}

/* The calls refused while parked or dropped canceled: answered with their
 * status, never computed. */
static void fail_all(kv_pending *p) {
  while (p) {
    kv_pending *n = p->next;
    attn_result res = {.status = p->st};
    p->done(&res, p->arg);
    attn__kv_pending_free(p);
    p = n;
  }
}

static void after(attn_kv_store *s, kv_after *a) {
  while (a->jobs || a->land || a->failed) {
    kv_after now = *a;
    *a = (kv_after){0};
    fail_all(now.failed);
    while (now.land) {
      kv_pending *p = now.land;
      now.land = p->next;
      if (land(s, p, a, &p->st)) {
        p->next = a->failed;
        a->failed = p;
      }
    }
    while (now.jobs) {
      kv_job *j = now.jobs;
      now.jobs = j->next;
      job_start(j);
    }
  }
}

void attn__kv_unread(attn_kv_store *s, kv_session *ks) {
  kv_after a = {0};
  pthread_mutex_lock(&s->mu);
  const int64_t layers = ks->shape.layers; /* the last reader_done may free ks */
  kv_layer *L = ks->layers;
  for (int64_t l = 0; l < layers; l++)
    attn__kv_reader_done(s, ks, &L[l]);
  attn__kv_retry_parked(s, &a);
  pthread_mutex_unlock(&s->mu);
  after(s, &a);
}

/* ---- submitting ------------------------------------------------------------ */

/* A call checked, admitted and its rows stored (jobs it lets go into a);
 * run here (a call for attn_kv_run_here, at most max_flops of work) never
 * parks. attn__kv_enter's code: 0, 1 parked, ATTN_KV_LATER, or an error;
 * the call is freed unless it is held (0, 1). */
static int take_call(attn_kv_store *s, attn_kv_call *call, double now, attn_done_fn done, void *arg,
                     bool here, double max_flops, kv_after *a, kv_pending **pp, attn_status *st) {
  int rc = attn__kv_call_check(call, st);
  kv_pending *p = *pp = rc ? NULL : attn__kv_pending_new(call, done, arg, now, st);
  if (!p)
    return rc ? rc : st->code;
  p->here = here;
  p->max_flops = max_flops;
  pthread_mutex_lock(&s->mu);
  rc = attn__kv_enter(s, p, st);
  bool booked = rc == 0 && !appends(p); /* nothing to store: to its job now */
  if (booked)
    schedule(s, p, a);
  pthread_mutex_unlock(&s->mu);
  if (rc == 0 && !booked)
    rc = land(s, p, a, st);
  if (rc < 0 || rc == ATTN_KV_LATER) {
    attn__kv_pending_free(p);
    *pp = NULL;
  }
  return rc;
}

int attn_kv_submit(attn_kv_store *s, attn_kv_call *call, double now, attn_done_fn done, void *arg,
                   attn_status *st) {
  kv_after a = {0};
  kv_pending *p;
  int rc = take_call(s, call, now, done, arg, false, 0, &a, &p, st);
  after(s, &a);
  return rc < 0 ? rc : 0;
}

/* ---- on the caller's thread ------------------------------------------------- */

/* A call run here ends into its caller's result. */
static void here_done(const attn_result *res, void *arg) { *(attn_result *)arg = *res; }

/* The job a's list holds for p alone, taken out of it; NULL if none (p was
 * refused or canceled on the way, and a's failed list answers it). */
static kv_job *take_job(kv_after *a, const kv_pending *p) {
  for (kv_job **jp = &a->jobs; *jp; jp = &(*jp)->next)
    if ((*jp)->calls == p) {
      kv_job *j = *jp;
      *jp = j->next;
      j->next = NULL;
      return j;
    }
  return NULL;
}

/* Admitted on a quiet layer, a call's job starts at once (schedule finds
 * none of its layers busy: any other call on them parks while its rows
 * are stored), so it is taken from the jobs to start and run here. */
int attn_kv_run_here(attn_kv_store *s, attn_kv_call *call, double now, double max_flops,
                     attn_result *res, attn_status *st) {
  *res = (attn_result){0};
  kv_after a = {0};
  kv_pending *p;
  int rc = take_call(s, call, now, here_done, res, true, max_flops, &a, &p, st);
  kv_job *mine = rc == 0 ? take_job(&a, p) : NULL;
  after(s, &a); /* answers p here if it was canceled meanwhile */
  if (mine)
    job_run_here(mine);
  else if (rc == 0 && res->status.code == 0)
    abort(); /* p left waiting for a job, with done writing to the caller's stack later */
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

/* ---- cancel --------------------------------------------------------------- */

/* Takes the call whose cancel flag is flag out of list; NULL if none. */
static kv_pending *unlink_call(kv_pending **list, const int *flag) {
  for (kv_pending **pp = list; *pp; pp = &(*pp)->next)
    if ((*pp)->call->req.cancel == flag) {
      kv_pending *p = *pp;
      *pp = p->next;
      p->next = NULL;
      return p;
    }
  return NULL;
}

void attn_kv_cancel(attn_kv_store *s, const int *flag) {
  if (!s || !flag)
    return;
  kv_after a = {0};
  pthread_mutex_lock(&s->mu);
  kv_pending *p = s->pending;
  while (p && p->call->req.cancel != flag)
    p = p->next;
  if (p && owes_rows(s, p)) {
    /* its job writes its rows: it runs when its turn comes, canceled */
  } else if ((p = unlink_call(&s->pending, flag))) {
    drop_canceled(s, p, &a);
    attn__kv_retry_parked(s, &a);
  } else if ((p = unlink_call(&s->parked, flag))) {
    attn__canceled(&p->st);
    p->next = a.failed;
    a.failed = p;
    attn__kv_retry_parked(s, &a); /* the calls behind it on its layers */
  } else {
    for (kv_job *j = s->running; j; j = j->run_next)
      cancel_check(j);
  }
  pthread_mutex_unlock(&s->mu);
  after(s, &a);
}
