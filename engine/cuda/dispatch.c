/*
 * dispatch.c — the cuda backend's one dispatcher thread.
 *
 * The dispatcher hands a queued job to a free slot on a healthy device
 * (round-robin over devices) and polls running slots' streams for faults
 * once a second by the monotonic clock, failing the job of a slot whose
 * stream reports one. It does no host work of its own: each slot has a
 * thread that stages and queues its job (the packing of a large job runs
 * there, one slot's beside another's) and, once the host function has
 * moved the slot to FINISH, checks and completes it.
 */
#include "cuda_int.h"

#include <time.h>

/* How often busy streams are polled for faults. */
#define POLL_SECONDS 1

static void release(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  sl->job = NULL;
  sl->phase = CU_FREE;
  sl->dev->busy--;
  s->busy--;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* A free slot on a healthy device for job, spreading jobs over devices
 * (a paged job: on the device its pages are on); mu held. */
static cu_slot *free_slot(cu_state *s, const attn_job *job) {
  const cu_dev *only = job->req.k_pages ? s->pages_dev : NULL;
  for (int k = 0; k < s->ndev; k++) {
    cu_dev *d = &s->devs[(s->next_dev + k) % s->ndev];
    if (!d->healthy || d->busy == d->nslots || (only && d != only))
      continue;
    for (int i = 0; i < d->nslots; i++)
      if (!d->slots[i].job) {
        s->next_dev = (int)((d - s->devs) + 1) % s->ndev;
        return &d->slots[i];
      }
  }
  return NULL;
}

bool attn__cu_any_healthy(cu_state *s) {
  for (int i = 0; i < s->ndev; i++)
    if (s->devs[i].healthy)
      return true;
  return false;
}

/* The first error any of the slot's streams reports. */
static cudaError_t query_slot(cu_slot *sl) {
  cudaStream_t st[3] = {sl->up, sl->stream, sl->down};
  for (int k = 0; k < 3; k++) {
    cudaError_t e = cudaStreamQuery(st[k]);
    if (e != cudaSuccess && e != cudaErrorNotReady)
      return e;
  }
  return cudaSuccess;
}

/* Fails the job of a running slot whose stream reports an error: its host
 * function will never run. The query runs without the mutex, and the host
 * function may run meanwhile (the context poisoned by another stream after
 * this one's work ended): the slot is then in FINISH, its thread ends the
 * job, and it is not completed here a second time. */
static void poll_slot(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  attn_job *job = sl->job;
  bool skip = !job || sl->phase != CU_RUN;
  pthread_mutex_unlock(&s->mu);
  if (skip)
    return;
  cudaSetDevice(sl->dev->ordinal);
  cudaError_t e = query_slot(sl);
  if (e == cudaSuccess)
    return;
  cudaGetLastError();
  attn__cu_mark_unhealthy(sl->dev, "a running job", e);
  pthread_mutex_lock(&s->mu);
  bool mine = sl->job == job && sl->phase == CU_RUN;
  if (mine)
    sl->phase = CU_FREE; /* owned here now: the host function leaves it be */
  pthread_mutex_unlock(&s->mu);
  if (!mine)
    return;
  attn_status st;
  attn__cu_fail(&st, ATTN_EDEVICE, "the job's stream failed", e);
  release(s, sl);
  attn__job_complete(job, &st);
}

static void poll_faults(cu_state *s) {
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++)
      poll_slot(s, &s->devs[i].slots[j]);
}

/* Now plus sec seconds on the monotonic clock (the condition variable's). */
static struct timespec deadline_in(int sec) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += sec;
  return ts;
}

static bool deadline_passed(const struct timespec *t) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

/* Whether no device can take job: none healthy is left, or (paged) the
 * one its pages are on is not. */
static bool hopeless(cu_state *s, const attn_job *job) {
  if (job->req.k_pages)
    return !s->pages_dev || !s->pages_dev->healthy;
  return !attn__cu_any_healthy(s);
}

/* A slot thread's step on its job: start it (failing it at once if that
 * fails), or finish it. Returns with mu held, as it was called. */
static void slot_step(cu_state *s, cu_slot *sl) {
  cu_phase ph = sl->phase;
  attn_job *job = sl->job;
  pthread_mutex_unlock(&s->mu);
  attn_status st = {0};
  int rc = ph == CU_START ? attn__cu_start(sl, &st) : attn__cu_finish(sl, &st);
  if (ph == CU_FINISH || rc < 0) {
    release(s, sl);
    attn__job_complete(job, rc < 0 ? &st : NULL);
    pthread_mutex_lock(&s->mu);
    return;
  }
  pthread_mutex_lock(&s->mu);
  /* queued: the host function moves it to FINISH, or already has */
  sl->phase = sl->fn_ran ? CU_FINISH : CU_RUN;
}

static void *slot_main(void *arg) {
  cu_slot *sl = arg;
  cu_state *s = sl->dev->state;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (sl->phase != CU_START && sl->phase != CU_FINISH && !s->quit)
      pthread_cond_wait(&sl->cv, &s->mu);
    if (sl->phase != CU_START && sl->phase != CU_FINISH)
      break;
    slot_step(s, sl);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* The next queued job to a free slot (its thread starts it), or failed when
 * no device is left; mu held, and kept. */
static void assign(cu_state *s, cu_slot *sl) {
  attn_job *job = s->pend_head;
  s->pend_head = job->next;
  if (!s->pend_head)
    s->pend_tail = NULL;
  if (!sl) {
    pthread_mutex_unlock(&s->mu);
    attn_status st;
    attn_status_set(&st, ATTN_ENODEV, "cuda: no healthy device is left");
    attn__job_complete(job, &st);
    pthread_mutex_lock(&s->mu);
    return;
  }
  sl->job = job;
  sl->phase = CU_START;
  sl->fn_ran = false;
  sl->dev->busy++;
  if (s->busy++ == 0)
    s->next_poll = deadline_in(POLL_SECONDS);
  pthread_cond_signal(&sl->cv);
}

static void *dispatcher(void *arg) {
  cu_state *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (s->pend_head) {
      cu_slot *sl = free_slot(s, s->pend_head);
      if (sl || hopeless(s, s->pend_head)) {
        assign(s, sl);
        continue;
      }
    }
    if (s->stop && !s->pend_head && s->busy == 0)
      break;
    if (s->busy > 0 && deadline_passed(&s->next_poll)) {
      /* By the clock, not by a timed-out wait: requests that keep waking
       * the thread must not keep a fault from being noticed. */
      pthread_mutex_unlock(&s->mu);
      poll_faults(s);
      pthread_mutex_lock(&s->mu);
      s->next_poll = deadline_in(POLL_SECONDS);
    } else if (s->busy > 0) {
      pthread_cond_timedwait(&s->cv, &s->mu, &s->next_poll);
    } else {
      pthread_cond_wait(&s->cv, &s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

void attn__cu_enqueue(cu_state *s, attn_job *job) {
  job->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->pend_tail)
    s->pend_tail->next = job;
  else
    s->pend_head = job;
  s->pend_tail = job;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Ends and joins the slot threads made so far. */
static void stop_slots(cu_state *s) {
  pthread_mutex_lock(&s->mu);
  s->quit = true;
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++)
      pthread_cond_signal(&s->devs[i].slots[j].cv);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++) {
      cu_slot *sl = &s->devs[i].slots[j];
      if (sl->th_made)
        pthread_join(sl->th, NULL);
      pthread_cond_destroy(&sl->cv);
      sl->th_made = false;
    }
}

static bool start_slots(cu_state *s) {
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++)
      pthread_cond_init(&s->devs[i].slots[j].cv, NULL);
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++) {
      cu_slot *sl = &s->devs[i].slots[j];
      if (pthread_create(&sl->th, NULL, slot_main, sl) != 0)
        return false;
      sl->th_made = true;
    }
  return true;
}

int attn__cu_dispatch_start(cu_state *s, attn_status *st) {
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (start_slots(s) && pthread_create(&s->thread, NULL, dispatcher, s) == 0)
    return 0;
  stop_slots(s);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  return attn_status_set(st, ATTN_ENOMEM, "cannot start the cuda dispatcher's threads");
}

void attn__cu_dispatch_stop(cu_state *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  stop_slots(s);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}
