/*
 * dispatch.c — the cuda backend's one dispatcher thread.
 *
 * It does all the host work: it takes a queued job when a slot is free on
 * a healthy device (round-robin over devices), starts it (stream.c),
 * finishes the jobs whose host functions have put their slots on the done
 * list, and polls busy streams for faults once a second by the monotonic
 * clock, failing the job of a stream that reports one.
 */
#include "cuda_int.h"

#include <time.h>

/* How often busy streams are polled for faults. */
#define POLL_SECONDS 1

static void release(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  sl->job = NULL;
  sl->dev->busy--;
  s->busy--;
  pthread_mutex_unlock(&s->mu);
}

/* A free slot on a healthy device, spreading jobs over devices; mu held. */
static cu_slot *free_slot(cu_state *s) {
  for (int k = 0; k < s->ndev; k++) {
    cu_dev *d = &s->devs[(s->next_dev + k) % s->ndev];
    if (!d->healthy || d->busy == d->nslots)
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

/* Whether the slot's host function has put it on the done list; mu held. */
static bool on_done_list(const cu_state *s, const cu_slot *sl) {
  for (const cu_slot *x = s->done; x; x = x->next_done)
    if (x == sl)
      return true;
  return false;
}

/* Fails the job of a busy stream that reports an error: its host function
 * will never run. The query runs without the mutex, and the host function
 * may run meanwhile (the context poisoned by another stream after this
 * one's work ended): the job is then on the done list, ends there, and is
 * not completed here a second time. */
static void poll_slot(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  attn_job *job = sl->job;
  bool skip = !job || on_done_list(s, sl);
  pthread_mutex_unlock(&s->mu);
  if (skip)
    return;
  cudaSetDevice(sl->dev->ordinal);
  cudaError_t e = cudaStreamQuery(sl->stream);
  if (e == cudaSuccess || e == cudaErrorNotReady)
    return;
  cudaGetLastError();
  attn__cu_mark_unhealthy(sl->dev, "a running job", e);
  pthread_mutex_lock(&s->mu);
  bool mine = sl->job == job && !on_done_list(s, sl);
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

/* The done list's jobs: outcomes copied out, slots freed; mu not held. */
static void finish_done(cu_state *s, cu_slot *list) {
  while (list) {
    cu_slot *sl = list;
    list = sl->next_done;
    attn_job *job = sl->job;
    if (!job) /* already failed by the fault poll */
      continue;
    attn_status st = {0};
    int rc = attn__cu_finish(sl, &st);
    release(s, sl);
    attn__job_complete(job, rc < 0 ? &st : NULL);
  }
}

static void *dispatcher(void *arg) {
  cu_state *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (s->done) {
      cu_slot *list = s->done;
      s->done = NULL;
      pthread_mutex_unlock(&s->mu);
      finish_done(s, list);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (s->pend_head) {
      cu_slot *sl = free_slot(s);
      if (sl || !attn__cu_any_healthy(s)) {
        attn_job *job = s->pend_head;
        s->pend_head = job->next;
        if (!s->pend_head)
          s->pend_tail = NULL;
        if (sl) {
          sl->job = job;
          sl->dev->busy++;
          if (s->busy++ == 0)
            s->next_poll = deadline_in(POLL_SECONDS);
        }
        pthread_mutex_unlock(&s->mu);
        attn_status st = {0};
        if (!sl)
          attn_status_set(&st, ATTN_ENODEV, "cuda: no healthy device is left");
        else if (attn__cu_start(sl, &st) < 0)
          release(s, sl);
        if (st.code)
          attn__job_complete(job, &st);
        pthread_mutex_lock(&s->mu);
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

int attn__cu_dispatch_start(cu_state *s, attn_status *st) {
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&s->thread, NULL, dispatcher, s) == 0)
    return 0;
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  return attn_status_set(st, ATTN_ENOMEM, "cannot start the cuda dispatcher thread");
}

void attn__cu_dispatch_stop(cu_state *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}
