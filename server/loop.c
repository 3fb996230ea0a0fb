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
#include "jobs.h"
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

/* ---- the job: decode and submit, compute, encode ---------------------------- */

/* The tensors are no longer needed once the engine is done; the reply is
 * what stays. */
static void drop_inputs(attnd_req *r) {
  attn_proto_req_free(&r->pr);
  free(r->body);
  r->body = NULL;
  free(r->plain);
  r->plain = NULL;
  attnd_body_release(r);
}

/* The engine calls this, on one of its threads, when a submitted job ends. */
static void engine_done(const attn_result *res, void *arg);

/* What decoding r's body allocates beside it: nothing for safetensors
 * (read in place), the tensors of a JSON body (up to twice the body), and
 * for /v2 those of its JSON part plus an aligned copy of its binary part. */
static uint64_t decode_need(const attnd_req *r, size_t len) {
  if (r->v2)
    return attn_proto_v2_decode_bound(len, r->v2_json_len < len ? r->v2_json_len : len);
  return r->json_in ? attn_proto_json_decode_bound(len) : 0;
}

/* Reserves what decoding r's body will hold (decode_need), held like the
 * body until drop_inputs(); false with r's reply set. A body whose decode
 * could not fit even in an idle server is too large (a retry would never
 * help); one that does not fit now is asked to retry. */
static bool reserve_decode(attnd_req *r) {
  const attnd_config *c = r->srv->cfg;
  uint64_t need = decode_need(r, r->len);
  uint64_t budget = (uint64_t)c->max_queue * c->max_body;
  if (need == 0)
    return true;
  if (r->reserved + need > budget) {
    char msg[320];
    snprintf(msg, sizeof msg,
             "decoding this %zu-byte body needs %llu bytes beside it, past the server's "
             "memory budget (--max-queue x --max-body = %llu bytes); %s",
             r->len, (unsigned long long)need, (unsigned long long)budget,
             r->v2 ? "send the tensors as binary data, or raise --max-queue"
                   : "send it as safetensors (application/octet-stream), which needs no copy, "
                     "or raise --max-queue");
    attnd_req_fail(r, ATTND_ETOO_LARGE, msg);
    return false;
  }
  if (!attnd_body_reserve(r, need)) {
    attnd_body_over_budget(r);
    return false;
  }
  return true;
}

/* The decoded body draws on the body budget as the body did. */
static bool grow_plain(void *ctx, size_t more) { return attnd_body_reserve(ctx, more); }

/* A gzip or deflate body decoded into r->plain (threadpool), with what its
 * decode holds reserved beyond what the encoded size already did; the
 * encoded body is freed. 0, or -1 with *st set. */
static int inflate_body(attnd_req *r, attn_status *st) {
  const attnd_config *c = r->srv->cfg;
  st->code = attnd_inflate(r->encoding, r->body, r->len, (size_t)c->max_body, grow_plain, r,
                           &r->plain, &r->plain_len, st->message, sizeof st->message);
  if (st->code)
    return -1;
  free(r->body);
  r->body = NULL;
  uint64_t had = decode_need(r, r->len), need = decode_need(r, r->plain_len);
  if (need <= had || attnd_body_reserve(r, (size_t)(need - had)))
    return 0;
  st->code = ATTND_EQUEUE_FULL;
  snprintf(st->message, sizeof st->message,
           "decoding this body (%zu bytes after Content-Encoding) would pass the server's "
           "memory budget (--max-queue x --max-body); retry shortly, or send binary tensors",
           r->plain_len);
  return -1;
}

/* r's body into r->pr with its codec, once any Content-Encoding is undone.
 * The inference protocol takes its options from the body's "parameters"
 * only. */
static int decode_body(attnd_req *r, attn_status *st) {
  if (r->encoding != ATTND_ENC_IDENTITY && inflate_body(r, st) < 0)
    return st->code;
  const char *body = r->plain ? r->plain : r->body;
  size_t len = r->plain ? r->plain_len : r->len;
  if (r->v2) {
    size_t json_len = r->v2_json_len == SIZE_MAX ? len : r->v2_json_len;
    return attn_proto_decode_v2(body, len, json_len, &r->pr, &r->v2_info, st);
  }
  attn_options q;
  attn_options_init(&q);
  int rc = attn_options_parse_query(&q, r->query, st);
  attn_pass pass = attnd_req_pass(r);
  if (rc == 0)
    rc = r->json_in ? attn_proto_decode_json_pass(body, len, pass, &q, &r->pr, st)
                    : attn_proto_decode_safetensors_pass(body, len, pass, &q, &r->pr, st);
  return rc;
}

/* --max-pairs, checked on the decoded request before it computes: a body of
 * a few hundred kilobytes can ask for minutes of work (787 KB of F16 at
 * N = 131072, D = 1 is 1.7e10 pairs), which no --max-body catches. */
static int check_pairs(const attnd_req *r, attn_status *st) {
  uint64_t cap = r->srv->cfg->max_pairs, n = attn_request_pairs(&r->pr.req);
  if (cap == 0 || n <= cap)
    return 0;
  return attn_status_set(st, ATTND_ETOO_MUCH_WORK,
                         "this request has %llu score pairs, over --max-pairs %llu (batch x "
                         "heads x Nq x Nkv, summed over its sequences); split it into smaller "
                         "requests",
                         (unsigned long long)n, (unsigned long long)cap);
}

static void decode_submit(uv_work_t *w) {
  attnd_req *r = w->data;
  attnd_server *s = r->srv;
  attn_status st;
  int rc = decode_body(r, &st);
  if (rc == 0)
    rc = check_pairs(r, &st);
  if (rc == 0) {
    /* "auto" means the server's backend; a named one is the client's call */
    if (!strcmp(r->pr.req.backend, "auto"))
      r->pr.req.backend = s->backend;
    /* a job canceled while it decoded is refused by the engine */
    r->pr.req.cancel = &r->cancel;
    /* Set before submitting: once submitted, the job may complete (and r be
     * touched by the loop) before this thread returns. */
    r->in_engine = true;
    rc = attn_engine_submit(s->engine, &r->pr.req, engine_done, r, &st);
    if (rc == 0)
      return;
    r->in_engine = false;
  }
  r->t_engine = attn_now();
  r->job_st = st;
  drop_inputs(r);
}

/* Any engine thread: hand the finished job to the loop. */
static void engine_done(const attn_result *res, void *arg) {
  attnd_req *r = arg;
  attnd_server *s = r->srv;
  r->res = *res;
  r->t_engine = attn_now();
  pthread_mutex_lock(&s->mu);
  attnd_jobs_push(&s->done_head, &s->done_tail, r);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->completed);
}

/* The threadpool: the result into r->out, or the failure into r->job_st. */
static void encode(uv_work_t *w) {
  attnd_req *r = w->data;
  attn_status st;
  int rc;
  if (r->res.status.code) {
    st = r->res.status;
    rc = -1;
  } else if (r->v2) {
    /* the request's id (X-Request-Id, or made) when the body had none */
    void *buf = NULL;
    rc = attn_proto_encode_v2(&r->pr, &r->v2_info, attn_proto_v2_model_name(r->v2_model), r->id,
                              r->res.backend, &buf, &r->out_len, &r->out_json_len, &st);
    r->out = buf;
    r->out_ctype = r->out_json_len ? "application/octet-stream" : "application/json";
  } else if (r->binary_out) {
    void *buf = NULL;
    rc = attn_proto_encode_safetensors(&r->pr, &buf, &r->out_len, &st);
    r->out = buf;
    r->out_ctype = "application/octet-stream";
  } else {
    rc = attn_proto_encode_json(&r->pr, r->res.backend, &r->out, &r->out_len, &st);
    r->out_ctype = "application/json";
  }
  if (rc < 0)
    r->job_st = st;
  drop_inputs(r);
}

/* The job's outcome becomes the reply. */
static void reply_from_job(attnd_req *r) {
  r->t_done = r->t_engine;
  if (r->job_st.code) {
    attnd_req_fail(r, r->job_st.code, r->job_st.message);
    return;
  }
  free(r->resp);
  r->status = 200;
  r->resp = r->out;
  r->resp_len = r->out_len;
  r->ctype = r->out_ctype;
  r->resp_json_len = r->out_json_len;
  r->out = NULL;
}

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
  s->running--;
  r->who->running--;
  attnd_jobs_client_put(s, r);
  s->admitted--;
  attnd_jobs_remove(s, r);
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, -1);
  if (!r->answered) {
    reply_from_job(r);
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
      drop_inputs(r);
      stage_done(r);
    } else {
      r->work2.data = r;
      uv_queue_work(&s->loop, &r->work2, encode, after_encode);
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
  s->running++;
  r->who->running++;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, 1);
  r->work.data = r;
  r->in_engine = false;
  r->stages_left = 2;
  uv_queue_work(&s->loop, &r->work, decode_submit, after_submit);
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
  if (s->admitted >= s->cfg->max_queue) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "the queue is full (%d requests admitted, --max-queue %d); retry shortly", s->admitted,
             s->cfg->max_queue);
    refuse(r, ATTND_EQUEUE_FULL, msg);
    return;
  }
  if (!reserve_decode(r)) {
    finish(r);
    attnd_req_unref(r);
    return;
  }
  if (!(r->who = attnd_jobs_client_get(s, r->client))) {
    refuse(r, ATTND_EOUT_OF_MEMORY, "out of memory admitting this request; retry shortly");
    return;
  }
  s->admitted++;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, 1);
  attnd_jobs_push(&s->pend_head, &s->pend_tail, r);
  attnd_jobs_add(s, r);
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

static void on_signal(uv_signal_t *h, int signum) {
  attnd_server *s = h->data;
  if (atomic_exchange(&s->draining, true))
    return;
  attnd_log_note(s, ATTND_INFO, NULL, NULL, "%s: draining (up to %g s)",
                 signum == SIGTERM ? "SIGTERM" : "SIGINT", s->cfg->drain_timeout);
  s->transport->quiesce(s);
  s->drain_deadline = attn_now() + s->cfg->drain_timeout;
  uv_timer_start(&s->drain_timer, check_drain, 0, DRAIN_CHECK_MS);
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
 * body's memory back as good as at once. */
#define SWEEP_MS 100
static void sweep(uv_timer_t *t) {
  attnd_server *s = t->data;
  attnd_conns_sweep(&s->conns, attn_now());
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
}
