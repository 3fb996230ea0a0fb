/*
 * loop.c — attnd's request loop on libuv (the main thread).
 *
 * The HTTP thread hands each complete POST /attention over with a locked
 * list and uv_async_send; sends coalesce, so the callback drains the list
 * whole. Admission bounds the jobs admitted and not finished at
 * --max-queue (more get 503 with Retry-After). Admitted jobs wait until one
 * of max_running slots frees, which goes to the client address running the
 * fewest jobs (its oldest job: FIFO within a client), among those under
 * their cap (--max-running-per-client): one client cannot hold every slot
 * while others wait. A running job decodes and is
 * submitted to the engine on libuv's threadpool; the engine computes on its
 * own threads (CPU workers sized to the cores, or CUDA streams) and its
 * completion callback hands the job back here with uv_async_send; the reply
 * is encoded on the threadpool, and its completion here resumes the
 * connection.
 *
 * Deadlines and hang-ups (deadline.c) cut this short at any stage: the reply
 * (504, or a close for a client that is gone) goes out at once, the engine job
 * is canceled through its flag, and the job's end is still awaited before
 * its slot and memory are given back; its result is dropped.
 *
 * SIGTERM or SIGINT starts a drain: /readyz turns 503, the listening socket
 * closes, bodies whose headers came before it are read, queued and running
 * jobs finish, and the loop stops when nothing is left or --drain-timeout
 * passes (what is left then is answered 503 and canceled). SIGHUP and
 * SIGUSR1 are logged and ignored.
 */
#include "loop.h"
#include "kind.h"
#include "route.h"
#include "jobs.h"
#include "work.h"
#include "deadline.h"
#include "errors.h"
#include "log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/*
 * Jobs between dispatch and reply at once. The CPU engine gives each job
 * all the cores: two keep them busy while one decodes or encodes, without
 * making later jobs wait behind many. The CUDA engine overlaps a job per
 * stream: twice the streams keeps each fed while others are packed or
 * encoded.
 */
static int max_running(const attnd_server *s) {
  if (s->backend && !strcmp(s->backend, "cuda"))
    return 2 * s->cfg->streams * (s->cfg->ndevices > 0 ? s->cfg->ndevices : 1);
  return 2;
}

/* One client's running jobs at most: --max-running-per-client, whose auto
 * leaves a slot for another client (on the CPU backend's two: one each). */
static int client_cap(const attnd_server *s) {
  int n = s->cfg->max_running_per_client;
  if (n < 0)
    return s->max_running > 1 ? s->max_running - 1 : 1;
  return n == 0 ? INT_MAX : n;
}

/* The reply is set (or, for a client that is gone, the close decided): give
 * the connection back to the HTTP thread, once. From here on the reply
 * fields belong to that thread, and r->conn may be gone. */
static void finish(attnd_req *r) {
  r->answered = true;
  r->srv->transport->resume(r);
}

static void dispatch(attnd_server *s);

/* ---- deadlines: one timer over every admitted job (deadline.h) -------------- */

static void on_tick(uv_timer_t *t);

/* (Re)arms the timer after jobs were admitted or ended. Never postpones a
 * tick already due sooner: a steady stream of admissions must not starve
 * the polling for resets. */
static void arm_deadlines(attnd_server *s) {
  int64_t delay = attnd_deadline_next(s, attn_now());
  if (delay < 0) {
    uv_timer_stop(&s->tick);
    return;
  }
  if (uv_is_active((uv_handle_t *)&s->tick) && uv_timer_get_due_in(&s->tick) <= (uint64_t)delay)
    return;
  uv_timer_start(&s->tick, on_tick, (uint64_t)delay, 0);
}

static void on_tick(uv_timer_t *t) {
  attnd_server *s = t->data;
  double now = attn_now();
  attnd_req *next;
  for (attnd_req *r = s->act_head; r; r = next) {
    next = r->act_next; /* canceling a queued job unlinks (and may free) it */
    int why = r->answered ? -1 : attnd_deadline_due(s, r, now);
    if (why >= 0)
      attnd_loop_cancel(s, r, (attnd_cancel_reason)why);
  }
  arm_deadlines(s);
}

/* ---- a job's end (work.h does its work between) ---------------------------- */

static void log_canceled(attnd_req *r, const char *what) {
  char method[80], path[560];
  attn_quote(method, sizeof method, r->method, strlen(r->method));
  attn_quote(path, sizeof path, r->path, strlen(r->path));
  attnd_log_note(r->srv, ATTND_WARN, NULL, r->id, "%s %s canceled (%s): %s id=%s", method, path,
                 attnd_cancel_reason_name(r->cancel_why), what, r->id);
}

/* A job answered early has ended: say whether the cancel cut it short. */
static void note_canceled_job(attnd_req *r) {
  if (!r->canceled)
    return;
  bool cut = r->job_st.code == ATTN_ECANCELED || r->res.status.code == ATTN_ECANCELED;
  char what[160];
  if (cut) {
    attnd_metrics_canceled(r->srv->metrics, r->cancel_why, ATTND_STAGE_RUNNING);
    snprintf(what, sizeof what, "the engine stopped the job %.3f s after it started",
             r->t_engine - r->t_started);
  } else {
    snprintf(what, sizeof what, "the job had already run to its end; its result was dropped");
  }
  log_canceled(r, what);
}

/* The job has ended: account for it and start the next. */
static void complete(attnd_req *r) {
  attnd_server *s = r->srv;
  if (r->route->kind->slot) {
    s->running--;
    r->who->running--;
  }
  attnd_jobs_client_put(s, r);
  s->admitted--;
  attnd_jobs_remove(s, r);
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, -1);
  if (!r->answered) {
    attnd_work_reply(r);
    if (r->status == 200)
      attnd_metrics_engine(s->metrics, r->res.backend, r->res.engine_seconds, r->res.flops);
    finish(r);
  } else {
    note_canceled_job(r);
  }
  attnd_req_unref(r);
  arm_deadlines(s);
  dispatch(s);
}

/* A submitted job completes once both the submit's and the encode's loop
 * callbacks have run, in whichever order they come. */
static void stage_done(attnd_req *r) {
  if (--r->stages_left == 0)
    complete(r);
}

static void after_submit(uv_work_t *w, int status) {
  (void)status;
  attnd_req *r = w->data;
  if (r->in_engine)
    stage_done(r);
  else
    complete(r);
}

static void after_encode(uv_work_t *w, int status) {
  (void)status;
  stage_done(w->data);
}

static void on_completed(uv_async_t *h) {
  attnd_server *s = h->data;
  pthread_mutex_lock(&s->mu);
  attnd_req *r = s->done_head;
  s->done_head = s->done_tail = NULL;
  pthread_mutex_unlock(&s->mu);
  while (r) {
    attnd_req *next = r->next;
    if (r->answered) { /* nobody waits for this result: skip the encoding */
      attnd_work_drop_inputs(r);
      stage_done(r);
    } else {
      r->work2.data = r;
      uv_queue_work(&s->loop, &r->work2, attnd_work_encode, after_encode);
    }
    r = next;
  }
}

/* ---- canceling ------------------------------------------------------------- */

/* The early reply of a canceled job; none for a client that is gone (a 499
 * is only ever logged, never sent). */
static void cancel_reply(attnd_req *r, attnd_cancel_reason why) {
  const char *where = r->dispatched ? "running" : "queued";
  char msg[200];
  if (why == ATTND_CANCEL_CLIENT_CLOSED) {
    attnd_req_fail(r, ATTND_ECLIENT_CLOSED,
                   "the client closed or reset the connection before its reply");
  } else if (why == ATTND_CANCEL_TIMEOUT) {
    snprintf(msg, sizeof msg,
             "no reply within the %g s deadline (--timeout); the request was %s after %.3f s "
             "and its job was canceled",
             r->srv->cfg->timeout, where, attn_now() - r->t_received);
    attnd_req_fail(r, ATTND_ETIMEOUT, msg);
  } else {
    snprintf(msg, sizeof msg, "the server shut down (--drain-timeout) while this request was %s",
             where);
    attnd_req_fail(r, ATTND_ESHUTTING_DOWN, msg);
  }
}

void attnd_loop_cancel(attnd_server *s, attnd_req *r, attnd_cancel_reason why) {
  if (r->answered)
    return;
  attn_cancel_set(&r->cancel);
  if (r->dispatched && r->route->kind->cancel) /* a kind that holds jobs of its own */
    r->route->kind->cancel(r);
  r->canceled = true;
  r->cancel_why = why;
  r->t_done = attn_now();
  cancel_reply(r, why);
  if (r->dispatched) { /* the job's end is awaited in complete() */
    finish(r);
    return;
  }
  attnd_jobs_unqueue(s, r);
  attnd_jobs_remove(s, r);
  attnd_jobs_client_put(s, r);
  s->admitted--;
  attnd_metrics_canceled(s->metrics, why, ATTND_STAGE_QUEUED);
  log_canceled(r, "dropped from the queue before it ran");
  finish(r);
  attnd_req_unref(r);
}

/* ---- admission and dispatch ----------------------------------------------- */

/* r leaves the queue for a slot: decode and submit on the threadpool. */
static void start(attnd_server *s, attnd_req *r, double now) {
  attnd_jobs_unqueue(s, r);
  r->dispatched = true;
  r->t_started = now;
  attnd_metrics_queue_wait(s->metrics, now - r->t_admitted);
  if (r->route->kind->slot) { /* a kind without holds none (admit) */
    s->running++;
    r->who->running++;
  }
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, 1);
  r->work.data = r;
  r->in_engine = false;
  r->stages_left = 2;
  uv_queue_work(&s->loop, &r->work, attnd_work_decode_submit, after_submit);
}

static void dispatch(attnd_server *s) {
  attnd_req *r;
  while (s->running < s->max_running && (r = attnd_jobs_next(s))) {
    double now = attn_now();
    /* What the timer would find at its next tick, found now. */
    int why = attnd_deadline_due(s, r, now);
    if (why >= 0)
      attnd_loop_cancel(s, r, (attnd_cancel_reason)why);
    else
      start(s, r, now);
  }
}

static void refuse(attnd_req *r, int code, const char *msg) {
  attnd_req_fail(r, code, msg);
  finish(r);
  attnd_req_unref(r);
}

static void admit(attnd_server *s, attnd_req *r) {
  r->t_admitted = attn_now();
  if (s->drain_expired) {
    refuse(r, ATTND_ESHUTTING_DOWN, "the server shut down before this request ran");
    return;
  }
  if (!attnd_jobs_take_place(r)) {
    finish(r);
    attnd_req_unref(r);
    return;
  }
  if (!attnd_work_reserve(r)) {
    s->admitted--;
    finish(r);
    attnd_req_unref(r);
    return;
  }
  if (!(r->who = attnd_jobs_client_get(s, r->client))) {
    s->admitted--;
    refuse(r, ATTND_EOUT_OF_MEMORY, "out of memory admitting this request; retry shortly");
    return;
  }
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, 1);
  attnd_jobs_push(&s->pend_head, &s->pend_tail, r);
  attnd_jobs_add(s, r);
  /* A kind that takes no running slot holds a place of --max-queue but
   * does not wait for a slot either: it orders its jobs itself (kind.h). */
  if (!r->route->kind->slot)
    start(s, r, r->t_admitted);
}

static void on_incoming(uv_async_t *h) {
  attnd_server *s = h->data;
  pthread_mutex_lock(&s->mu);
  attnd_req *r = s->in_head;
  s->in_head = s->in_tail = NULL;
  pthread_mutex_unlock(&s->mu);
  while (r) {
    attnd_req *next = r->next;
    admit(s, r);
    r = next;
  }
  dispatch(s);
  arm_deadlines(s);
}

void attnd_loop_submit(attnd_server *s, attnd_req *r) {
  atomic_fetch_add(&r->refs, 1); /* the job's, dropped when it ends */
  pthread_mutex_lock(&s->mu);
  attnd_jobs_push(&s->in_head, &s->in_tail, r);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->incoming);
}

/* ---- draining ------------------------------------------------------------ */

static void close_handle(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/*
 * Uploads the drain waits for; s->mu held (the HTTP thread cannot end one
 * meanwhile, so its socket is still its own). One whose client closed or
 * reset in mid-body can never complete, and libmicrohttpd may not notice
 * until --idle-timeout: it is not waited for.
 */
static int live_uploads(attnd_server *s) {
  int n = 0;
  for (attnd_req *r = s->up_head; r; r = r->up_next)
    n += r->fd < 0 || attnd_peek(r->fd) > 0;
  return n;
}

/* Past --drain-timeout: every job still queued or running is answered 503
 * and its engine work canceled; main() exits without waiting for jobs the
 * engine has not yet stopped. */
static void expire_drain(attnd_server *s) {
  s->drain_expired = true;
  int running = s->running;
  attnd_req *next;
  for (attnd_req *r = s->act_head; r; r = next) {
    next = r->act_next;
    attnd_loop_cancel(s, r, ATTND_CANCEL_SHUTDOWN);
  }
  attnd_log_note(s, ATTND_WARN, NULL, NULL,
                 "drain timeout: %d running jobs canceled; uploads still under way are cut off",
                 running);
  s->jobs_done_at = 0;
}

/* How often a drain looks whether it is done, and how long it waits for
 * replies to be confirmed sent once no job is left (check_drain). */
#define DRAIN_CHECK_MS 20
#define REPLY_WAIT_S 2.0
#define REPLY_WAIT_EXPIRED_S 0.5

/*
 * Every DRAIN_CHECK_MS of a drain: stop once no upload that began before the drain
 * is still being read, no job is left and their replies are out. A reply
 * normally completes in microseconds; one to a client that is gone may only
 * complete when the idle timeout reaps its connection, so the wait for
 * replies is capped (2 s; 0.5 s past the drain deadline).
 */
static void check_drain(uv_timer_t *t) {
  attnd_server *s = t->data;
  double now = attn_now();
  if (!s->drain_expired && now >= s->drain_deadline)
    expire_drain(s);
  /* One lock for both lists: an upload that ends is on the incoming list
   * before it leaves the uploads'. */
  pthread_mutex_lock(&s->mu);
  int uploads = live_uploads(s);
  bool incoming = s->in_head != NULL;
  pthread_mutex_unlock(&s->mu);
  if (incoming || (!s->drain_expired && (s->admitted > 0 || uploads > 0)))
    return;
  if (s->jobs_done_at == 0)
    s->jobs_done_at = now;
  int left = atomic_load(&s->replying);
  if (left <= 0 ||
      now - s->jobs_done_at > (s->drain_expired ? REPLY_WAIT_EXPIRED_S : REPLY_WAIT_S)) {
    if (left > 0)
      attnd_log_note(s, ATTND_WARN, NULL, NULL, "%d replies not confirmed sent; stopping", left);
    uv_stop(&s->loop);
  }
}

static void begin_drain(attnd_server *s, const char *why) {
  if (atomic_exchange(&s->draining, true))
    return;
  attnd_log_note(s, ATTND_INFO, NULL, NULL, "%s: draining (up to %g s)", why,
                 s->cfg->drain_timeout);
  s->transport->quiesce(s);
  s->drain_deadline = attn_now() + s->cfg->drain_timeout;
  uv_timer_start(&s->drain_timer, check_drain, 0, DRAIN_CHECK_MS);
}

static void on_drain_delay(uv_timer_t *t) { begin_drain(t->data, "--drain-delay over"); }

/*
 * The first SIGTERM or SIGINT turns /readyz 503 at once. With
 * --drain-delay the server goes on serving that long, each reply closing
 * its connection, so that a load balancer's health check sees it leave
 * and sends elsewhere before the listening socket closes; a second
 * signal drains at once.
 */
static void on_signal(uv_signal_t *h, int signum) {
  attnd_server *s = h->data;
  const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
  double delay = s->cfg->drain_delay;
  if (!atomic_exchange(&s->unready, true) && delay > 0) {
    attnd_log_note(s, ATTND_INFO, NULL, NULL,
                   "%s: /readyz answers 503; serving %g s more (--drain-delay), then draining",
                   name, delay);
    uv_timer_start(&s->drain_timer, on_drain_delay, (uint64_t)(delay * 1000 + 0.5), 0);
    return;
  }
  begin_drain(s, name);
}

/*
 * SIGHUP and SIGUSR1 would end the process at once (their default), with
 * the work in flight lost: a closed terminal or a habit of "kill -HUP to
 * reload" must not do that. attnd has nothing to reload, so each is logged
 * and otherwise ignored; SIGTERM is what drains.
 */
static void on_ignored_signal(uv_signal_t *h, int signum) {
  attnd_log_note(h->data, ATTND_WARN, NULL, NULL,
                 "%s: ignored (attnd reloads nothing; send SIGTERM to drain and stop)",
                 signum == SIGHUP ? "SIGHUP" : "SIGUSR1");
}

static int init_signal(attnd_server *s, uv_signal_t *h, uv_signal_cb cb, int signum) {
  h->data = s;
  int rc = uv_signal_init(&s->loop, h);
  return rc < 0 ? rc : uv_signal_start(h, cb, signum);
}

/* Every handle the loop owns, set up; the first libuv error, if any. */
static int init_handles(attnd_server *s) {
  int rc;
  s->incoming.data = s->completed.data = s;
  s->drain_timer.data = s->sweep_timer.data = s->tick.data = s;
  if ((rc = uv_async_init(&s->loop, &s->incoming, on_incoming)) < 0 ||
      (rc = uv_async_init(&s->loop, &s->completed, on_completed)) < 0 ||
      (rc = uv_timer_init(&s->loop, &s->drain_timer)) < 0 ||
      (rc = uv_timer_init(&s->loop, &s->sweep_timer)) < 0 ||
      (rc = uv_timer_init(&s->loop, &s->tick)) < 0 ||
      (rc = init_signal(s, &s->sigterm, on_signal, SIGTERM)) < 0 ||
      (rc = init_signal(s, &s->sigint, on_signal, SIGINT)) < 0 ||
      (rc = init_signal(s, &s->sighup, on_ignored_signal, SIGHUP)) < 0 ||
      (rc = init_signal(s, &s->sigusr1, on_ignored_signal, SIGUSR1)) < 0)
    return rc;
  return 0;
}

int attnd_loop_init(attnd_server *s) {
  int rc = uv_loop_init(&s->loop);
  if (rc < 0) {
    fprintf(stderr, "attnd: cannot start the event loop: %s\n", uv_strerror(rc));
    return -1;
  }
  pthread_mutex_init(&s->mu, NULL);
  attnd_bodybufs_init(&s->bufs, s->engine);
  s->max_running = max_running(s);
  s->client_cap = client_cap(s);
  if ((rc = init_handles(s)) < 0) {
    fprintf(stderr, "attnd: cannot set up the event loop: %s\n", uv_strerror(rc));
    attnd_loop_close(s);
    return -1;
  }
  return 0;
}

/* Connections past their header or idle deadline, and uploads that are
 * late, too slow or abandoned, are closed by the registry; a tenth of a
 * second is finer than any deadline a flag can set, and gives an abandoned
 * body's memory back as good as at once. Body buffers idle too long are
 * unmapped on the same beat. */
#define SWEEP_MS 100
static void sweep(uv_timer_t *t) {
  attnd_server *s = t->data;
  double now = attn_now();
  attnd_conns_sweep(&s->conns, now);
  attnd_bodybufs_trim(&s->bufs, now);
  if (s->kv) /* sessions past their TTL, so their memory is free for others */
    attn_kv_expire(s->kv, now);
}

void attnd_loop_run(attnd_server *s) {
  uv_timer_start(&s->sweep_timer, sweep, SWEEP_MS, SWEEP_MS);
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

void attnd_loop_close(attnd_server *s) {
  uv_walk(&s->loop, close_handle, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
  pthread_mutex_destroy(&s->mu);
  attnd_bodybufs_close(&s->bufs);
}
