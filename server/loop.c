/*
 * loop.c — attnd's request loop on libuv (the main thread).
 *
 * The HTTP thread hands each complete POST /attention over with a locked
 * list and uv_async_send; sends coalesce, so the callback drains the list
 * whole. Admission bounds the jobs admitted and not finished at
 * --max-queue (more get 503 with Retry-After). Admitted jobs wait in FIFO
 * order until one of max_running slots frees; a job that waited past
 * --timeout gets 504, and one whose client already hung up is dropped
 * without computing. A running job decodes and is submitted to the engine
 * on libuv's threadpool; the engine computes on its own threads (CPU
 * workers sized to the cores, or CUDA streams) and its completion callback
 * hands the job back here with uv_async_send; the reply is encoded on the
 * threadpool, and its completion here resumes the connection.
 *
 * SIGTERM or SIGINT starts a drain: /readyz turns 503, the listening socket
 * closes, queued and running jobs finish, and the loop stops when nothing is
 * left or --drain-timeout passes.
 */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

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

double attnd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The reply is set: give the connection back to the HTTP thread. */
static void finish(attnd_req *r) { MHD_resume_connection(r->conn); }

static void dispatch(attnd_server *s);

/* ---- the job: decode and submit, compute, encode ---------------------------- */

/* The tensors are no longer needed once the engine is done; the reply is
 * what stays. */
static void drop_inputs(attnd_req *r) {
  attn_proto_req_free(&r->pr);
  free(r->body);
  r->body = NULL;
  attnd_body_release(r);
}

/* The engine calls this, on one of its threads, when a submitted job ends. */
static void engine_done(const attn_result *res, void *arg);

/* Appends r to a list of requests (the handoffs under s->mu, or the
 * loop's own pending queue). */
static void push(attnd_req **head, attnd_req **tail, attnd_req *r) {
  r->next = NULL;
  if (*tail)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static void decode_submit(uv_work_t *w) {
  attnd_req *r = w->data;
  attnd_server *s = r->srv;
  attn_options q;
  attn_status st;
  attn_options_init(&q);
  int rc = attn_options_parse_query(&q, r->query, &st);
  /* A JSON decode allocates its tensors beyond the body (up to twice its
   * size): they count against the budget, like the body, until
   * drop_inputs(). */
  if (rc == 0 && r->json_in && !attnd_body_reserve(r, attn_proto_json_decode_bound(r->len))) {
    r->t_done = attnd_now();
    attnd_body_over_budget(r);
    drop_inputs(r);
    return;
  }
  if (rc == 0)
    rc = r->json_in ? attn_proto_decode_json(r->body, r->len, &q, &r->pr, &st)
                    : attn_proto_decode_safetensors(r->body, r->len, &q, &r->pr, &st);
  if (rc == 0) {
    /* "auto" means the server's backend; a named one is the client's call */
    if (!strcmp(r->pr.req.backend, "auto"))
      r->pr.req.backend = s->backend;
    /* Set before submitting: once submitted, the job may complete (and r be
     * touched by the loop) before this thread returns. */
    r->in_engine = true;
    rc = attn_engine_submit(s->engine, &r->pr.req, engine_done, r, &st);
    if (rc == 0)
      return;
    r->in_engine = false;
  }
  r->t_done = attnd_now();
  attnd_req_fail(r, &st);
  drop_inputs(r);
}

/* Any engine thread: hand the finished job to the loop. */
static void engine_done(const attn_result *res, void *arg) {
  attnd_req *r = arg;
  attnd_server *s = r->srv;
  r->res = *res;
  r->t_done = attnd_now();
  pthread_mutex_lock(&s->mu);
  push(&s->done_head, &s->done_tail, r);
  pthread_mutex_unlock(&s->mu);
  uv_async_send(&s->completed);
}

static void encode(uv_work_t *w) {
  attnd_req *r = w->data;
  attn_status st;
  if (r->res.status.code) {
    attnd_req_fail(r, &r->res.status);
  } else if (r->binary_out) {
    void *buf;
    size_t len;
    if (attn_proto_encode_safetensors(&r->pr, &buf, &len, &st) < 0)
      attnd_req_fail(r, &st);
    else {
      r->status = 200;
      r->resp = buf;
      r->resp_len = len;
      r->ctype = "application/octet-stream";
    }
  } else {
    char *buf;
    size_t len;
    if (attn_proto_encode_json(&r->pr, r->res.backend, &buf, &len, &st) < 0)
      attnd_req_fail(r, &st);
    else {
      r->status = 200;
      r->resp = buf;
      r->resp_len = len;
      r->ctype = "application/json";
    }
  }
  drop_inputs(r);
}

/* The reply is set: account for the job and start the next. */
static void complete(attnd_req *r) {
  attnd_server *s = r->srv;
  s->running--;
  s->admitted--;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, -1);
  if (r->status == 200)
    attnd_metrics_engine(s->metrics, r->res.backend, r->res.engine_seconds, r->res.flops);
  finish(r);
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
    r->work2.data = r;
    uv_queue_work(&s->loop, &r->work2, encode, after_encode);
    r = next;
  }
}

/* Whether the client closed its end while the job waited (a peek that sees
 * end-of-file). Data in the socket means a live, pipelining client. */
static bool client_gone(attnd_req *r) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci)
    return false;
  char c;
  return recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void dispatch(attnd_server *s) {
  while (s->running < s->max_running && s->pend_head) {
    attnd_req *r = s->pend_head;
    s->pend_head = r->next;
    if (!s->pend_head)
      s->pend_tail = NULL;
    attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, -1);
    double now = attnd_now();
    if (now - r->t_received > s->cfg->timeout) {
      char msg[160];
      snprintf(msg, sizeof msg,
               "the request waited %.3f s in the queue, past the %g s deadline (--timeout)",
               now - r->t_received, s->cfg->timeout);
      attnd_req_error(r, 504, "timeout", msg);
      s->admitted--;
      finish(r);
      continue;
    }
    if (client_gone(r)) {
      attnd_req_error(r, 499, "client_closed", "the client closed the connection");
      s->admitted--;
      finish(r);
      continue;
    }
    r->t_started = now;
    attnd_metrics_queue_wait(s->metrics, now - r->t_admitted);
    s->running++;
    attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_INFLIGHT, 1);
    r->work.data = r;
    r->in_engine = false;
    r->stages_left = 2;
    uv_queue_work(&s->loop, &r->work, decode_submit, after_submit);
  }
}

static void admit(attnd_server *s, attnd_req *r) {
  r->t_admitted = attnd_now();
  if (s->admitted >= s->cfg->max_queue) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "the queue is full (%d requests admitted, --max-queue %d); retry shortly",
             s->admitted, s->cfg->max_queue);
    attnd_req_error(r, 503, "queue_full", msg);
    finish(r);
    return;
  }
  s->admitted++;
  attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, 1);
  push(&s->pend_head, &s->pend_tail, r);
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
}

void attnd_loop_submit(attnd_server *s, attnd_req *r) {
  pthread_mutex_lock(&s->mu);
  push(&s->in_head, &s->in_tail, r);
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
 * Every 20 ms of a drain: stop once no job is left and their replies are
 * out. A reply normally completes in microseconds; one to a client that is
 * gone may only complete when the idle timeout reaps its connection, so the
 * wait for replies is capped (2 s; 0.5 s past the drain deadline).
 */
static void check_drain(uv_timer_t *t) {
  attnd_server *s = t->data;
  double now = attnd_now();
  if (!s->drain_expired && now >= s->drain_deadline) {
    /* Out of time: whatever still waits is told so; running jobs cannot be
     * stopped, and main() exits without waiting for them. */
    s->drain_expired = true;
    while (s->pend_head) {
      attnd_req *r = s->pend_head;
      s->pend_head = r->next;
      attnd_req_error(r, 503, "shutting_down", "the server shut down before this request ran");
      s->admitted--;
      attnd_metrics_gauge_add(s->metrics, ATTND_GAUGE_QUEUE_DEPTH, -1);
      finish(r);
    }
    s->pend_tail = NULL;
    fprintf(stderr, "attnd: drain timeout: %d jobs still running\n", s->running);
    s->jobs_done_at = 0;
  }
  pthread_mutex_lock(&s->mu);
  bool incoming = s->in_head != NULL;
  pthread_mutex_unlock(&s->mu);
  if (incoming || (!s->drain_expired && s->admitted > 0))
    return;
  if (s->jobs_done_at == 0)
    s->jobs_done_at = now;
  int left = atomic_load(&s->replying) - (s->drain_expired ? s->running : 0);
  if (left <= 0 || now - s->jobs_done_at > (s->drain_expired ? 0.5 : 2.0)) {
    if (left > 0)
      fprintf(stderr, "attnd: %d replies not confirmed sent; stopping\n", left);
    uv_stop(&s->loop);
  }
}

static void on_signal(uv_signal_t *h, int signum) {
  attnd_server *s = h->data;
  if (atomic_exchange(&s->draining, true))
    return;
  fprintf(stderr, "attnd: %s: draining (up to %g s)\n", signum == SIGTERM ? "SIGTERM" : "SIGINT",
          s->cfg->drain_timeout);
  attnd_http_quiesce(s);
  s->drain_deadline = attnd_now() + s->cfg->drain_timeout;
  uv_timer_start(&s->drain_timer, check_drain, 0, 20);
}

int attnd_loop_init(attnd_server *s) {
  if (uv_loop_init(&s->loop) < 0)
    return -1;
  pthread_mutex_init(&s->mu, NULL);
  s->incoming.data = s->sigterm.data = s->sigint.data = s->drain_timer.data = s;
  s->completed.data = s;
  s->max_running = max_running(s);
  uv_async_init(&s->loop, &s->incoming, on_incoming);
  uv_async_init(&s->loop, &s->completed, on_completed);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sigint);
  uv_timer_init(&s->loop, &s->drain_timer);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  return 0;
}

void attnd_loop_run(attnd_server *s) { uv_run(&s->loop, UV_RUN_DEFAULT); }

void attnd_loop_close(attnd_server *s) {
  uv_walk(&s->loop, close_handle, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
  pthread_mutex_destroy(&s->mu);
}
