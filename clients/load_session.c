/*
 * load_session.c — `attn load --session N --steps M`: N sessions decoding
 * at once, a thread and a keep-alive connection each (session.h). Each
 * session is created, optionally prefilled, and then steps M times: one
 * call with q and the new tokens' k, v at the position it tracks, timed
 * from send to reply. The report: per-step latency percentiles, tokens/s
 * over the decode phase, errors by HTTP status; every session is deleted
 * at the end.
 */
#include "benchlib.h"
#include "hist.h"
#include "session.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ME "attn load"

typedef struct worker {
  const tool_load_session_plan *p;
  int index;
  char id[64];
  bool created, deleted;
  tool_hist hist;           /* step latencies, microseconds */
  uint64_t ok, failed;      /* steps */
  long err_status;          /* the first failed step's or create's status (0: transport) */
  char err[256];            /* and its message */
  char *mem;                /* q, k, v of one step (or of the prefill) */
  double t_end;             /* when its last step was answered */
  pthread_barrier_t *start; /* all sessions ready: the decode starts together */
  double *t0;
} worker;

/* The error of a reply, kept for the report. */
static void keep_error(worker *w, const tool_sess_reply *r, const char *what) {
  if (w->err[0])
    return;
  w->err_status = r ? r->status : 0;
  snprintf(w->err, sizeof w->err, "%s: %.200s", what, r && r->body.p ? r->body.p : "no HTTP reply");
  for (char *c = w->err; *c; c++)
    if (*c == '\n' || *c == '\r')
      *c = ' ';
}

static int create(worker *w, tool_sess_http *h) {
  const tool_load_session_plan *p = w->p;
  char path[128], body[256];
  snprintf(path, sizeof path, "/v1/sessions/%s", w->id);
  snprintf(body, sizeof body,
           "{\"heads_kv\":%lld,\"head_dim\":%lld,\"dtype\":\"%s\",\"layers\":1,"
           "\"max_tokens\":%lld,\"ttl_s\":600}",
           (long long)p->heads_kv, (long long)p->head_dim, attn_dtype_name(p->dtype),
           (long long)(p->prefill + p->steps * p->tokens));
  tool_sess_reply r;
  int rc = tool_sess_call(h, "PUT", path, body, strlen(body), false, &r);
  w->created = rc == 0 && r.status == 201;
  if (!w->created)
    keep_error(w, rc == 0 ? &r : NULL,
               rc == 0 && r.status == 200 ? "create: the id exists already" : "create");
  tool_sess_reply_free(&r);
  return w->created ? 0 : -1;
}

/* One call: n tokens of q, k, v at pos; 0 when it was answered 200 with
 * the length pos + n. *dt: seconds from its send to its reply. */
static int step(worker *w, tool_sess_http *h, int64_t pos, int64_t n, uint64_t *seed, double *dt) {
  const tool_load_session_plan *p = w->p;
  size_t es = attn_dtype_size(p->dtype);
  size_t nq = (size_t)(p->heads_q * n * p->head_dim), nk = (size_t)(p->heads_kv * n * p->head_dim);
  tool_sess_random(w->mem, (int64_t)(nq + 2 * nk), p->dtype, seed);
  tool_sess_tensor t[3] = {
      {"q", p->dtype, {p->heads_q, n, p->head_dim}, w->mem, 3},
      {"k", p->dtype, {p->heads_kv, n, p->head_dim}, w->mem + nq * es, 3},
      {"v", p->dtype, {p->heads_kv, n, p->head_dim}, w->mem + (nq + nk) * es, 3}};
  void *body;
  size_t len;
  if (tool_sess_encode(t, 3, &body, &len) < 0)
    return -1;
  char path[2048];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention?layer=0&pos=%lld%s%s", w->id,
           (long long)pos, p->query[0] ? "&" : "", p->query);
  tool_sess_reply r;
  double t0 = tool_bench_now();
  int rc = tool_sess_call(h, "POST", path, body, len, true, &r);
  *dt = tool_bench_now() - t0;
  free(body);
  bool good = rc == 0 && r.status == 200 && (r.length < 0 || r.length == pos + n);
  if (!good)
    keep_error(w, rc == 0 ? &r : NULL, rc == 0 && r.status == 200 ? "a wrong length" : "step");
  tool_sess_reply_free(&r);
  return good ? 0 : -1;
}

/* The decode: M steps from pos, each timed; stops at a session's first
 * failed step (its position is then unknown). */
static void decode(worker *w, tool_sess_http *h, uint64_t *seed) {
  const tool_load_session_plan *p = w->p;
  int64_t pos = p->prefill;
  for (int64_t i = 0; i < p->steps; i++) {
    double dt;
    if (step(w, h, pos, p->tokens, seed, &dt) != 0) {
      w->failed += (uint64_t)(p->steps - i);
      break;
    }
    tool_hist_record(&w->hist, (uint64_t)(dt * 1e6 + 0.5));
    w->ok++;
    pos += p->tokens;
  }
  w->t_end = tool_bench_now();
}

static void delete (worker *w, tool_sess_http *h) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s", w->id);
  tool_sess_reply r;
  w->deleted = tool_sess_call(h, "DELETE", path, NULL, 0, false, &r) == 0 && r.status == 204;
  tool_sess_reply_free(&r);
}

static void *run_worker(void *arg) {
  worker *w = arg;
  const tool_load_session_plan *p = w->p;
  uint64_t seed = 0x5e55 + (uint64_t)w->index;
  tool_sess_http h;
  bool up = tool_sess_http_init(&h, p->url, p->timeout, ME) == 0;
  bool ready = up && create(w, &h) == 0;
  double dt;
  if (ready && p->prefill > 0 && step(w, &h, 0, p->prefill, &seed, &dt) != 0)
    ready = false;
  if (pthread_barrier_wait(w->start) == PTHREAD_BARRIER_SERIAL_THREAD)
    *w->t0 = tool_bench_now();
  if (ready)
    decode(w, &h, &seed);
  else
    w->failed = (uint64_t)p->steps;
  if (w->created)
    delete (w, &h);
  if (up)
    tool_sess_http_free(&h);
  return NULL;
}

/* ---- the run and its report ------------------------------------------------- */

typedef struct totals {
  tool_hist hist;
  uint64_t ok, failed;
  int created, deleted, broken; /* broken: sessions that did not run every step */
  double elapsed;
  const worker *first_err;
} totals;

static void add_up(const worker *w, int n, double t0, totals *T) {
  double end = t0;
  for (int i = 0; i < n; i++) {
    tool_hist_merge(&T->hist, &w[i].hist);
    T->ok += w[i].ok;
    T->failed += w[i].failed;
    T->created += w[i].created;
    T->deleted += w[i].deleted;
    T->broken += w[i].failed > 0;
    if (w[i].err[0] && !T->first_err)
      T->first_err = &w[i];
    end = w[i].t_end > end ? w[i].t_end : end;
  }
  T->elapsed = end > t0 ? end - t0 : 1e-9;
}

static void print_text(const tool_load_session_plan *p, const totals *T) {
  const tool_hist *h = &T->hist;
  double tokens = (double)T->ok * (double)p->tokens;
  printf("attn load %s: %d sessions, %lld decode steps each, prefill %lld\n", p->url, p->sessions,
         (long long)p->steps, (long long)p->prefill);
  printf("step       q [%lld,%lld,%lld] k, v [%lld,%lld,%lld] %s%s%s\n", (long long)p->heads_q,
         (long long)p->tokens, (long long)p->head_dim, (long long)p->heads_kv, (long long)p->tokens,
         (long long)p->head_dim, attn_dtype_name(p->dtype), p->query[0] ? ", " : "", p->query);
  printf("steps      ok %llu, failed %llu; sessions created %d, deleted %d, stopped early %d\n",
         (unsigned long long)T->ok, (unsigned long long)T->failed, T->created, T->deleted,
         T->broken);
  if (T->first_err)
    printf("first error HTTP %ld, %s\n", T->first_err->err_status, T->first_err->err);
  printf("throughput %.1f tokens/s, %.1f steps/s over %.3f s\n", tokens / T->elapsed,
         (double)T->ok / T->elapsed, T->elapsed);
  printf("latency ms p50 %.3f  p90 %.3f  p99 %.3f  max %.3f  (min %.3f, mean %.3f, %llu steps)\n",
         tool_hist_percentile(h, 50) * 1e-3, tool_hist_percentile(h, 90) * 1e-3,
         tool_hist_percentile(h, 99) * 1e-3, (double)tool_hist_max(h) * 1e-3,
         (double)tool_hist_min(h) * 1e-3, tool_hist_mean(h) * 1e-3,
         (unsigned long long)tool_hist_count(h));
}

static void print_json(const tool_load_session_plan *p, const totals *T) {
  const tool_hist *h = &T->hist;
  printf("{\"mode\": \"sessions\", \"url\": \"%s\", \"sessions\": %d, \"steps\": %lld, "
         "\"prefill\": %lld, \"tokens_per_step\": %lld,\n",
         p->url, p->sessions, (long long)p->steps, (long long)p->prefill, (long long)p->tokens);
  printf(" \"steps_ok\": %llu, \"steps_failed\": %llu, \"created\": %d, \"deleted\": %d, "
         "\"stopped_early\": %d, \"first_error_status\": %ld,\n",
         (unsigned long long)T->ok, (unsigned long long)T->failed, T->created, T->deleted,
         T->broken, T->first_err ? T->first_err->err_status : 0);
  printf(" \"tokens\": %llu, \"elapsed_s\": %.6f, \"tokens_per_s\": %.3f,\n",
         (unsigned long long)(T->ok * (uint64_t)p->tokens), T->elapsed,
         (double)T->ok * (double)p->tokens / T->elapsed);
  printf(" \"latency_ms\": {\"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, \"max\": %.4f, "
         "\"min\": %.4f, \"mean\": %.4f, \"count\": %llu}}\n",
         tool_hist_percentile(h, 50) * 1e-3, tool_hist_percentile(h, 90) * 1e-3,
         tool_hist_percentile(h, 99) * 1e-3, (double)tool_hist_max(h) * 1e-3,
         (double)tool_hist_min(h) * 1e-3, tool_hist_mean(h) * 1e-3,
         (unsigned long long)tool_hist_count(h));
}

/* The workers' memory and histograms; -1 when out of memory. */
static int workers_init(worker *w, const tool_load_session_plan *p, pthread_barrier_t *b,
                        double *t0) {
  int64_t n = p->prefill > p->tokens ? p->prefill : p->tokens;
  size_t bytes =
      (size_t)((p->heads_q + 2 * p->heads_kv) * n * p->head_dim) * attn_dtype_size(p->dtype);
  for (int i = 0; i < p->sessions; i++) {
    w[i] = (worker){.p = p, .index = i, .start = b, .t0 = t0};
    snprintf(w[i].id, sizeof w[i].id, "attn-load-%ld-%d", (long)getpid(), i);
    w[i].mem = malloc(bytes);
    if (!w[i].mem || tool_hist_init(&w[i].hist) < 0)
      return -1;
  }
  return 0;
}

static void workers_free(worker *w, int n) {
  for (int i = 0; i < n; i++) {
    free(w[i].mem);
    tool_hist_free(&w[i].hist);
  }
}

/* Starts the threads and waits for them; 0, or 1 after a message. */
static int run_all(worker *w, int n) {
  pthread_t *th = calloc((size_t)n, sizeof *th);
  if (!th)
    return 1;
  int started = 0;
  for (; started < n; started++)
    if (pthread_create(&th[started], NULL, run_worker, &w[started]) != 0)
      break;
  if (started < n) /* the barrier waits for n: nothing can start without them all */
    fprintf(stderr, ME ": cannot start thread %d of %d\n", started + 1, n), _exit(1);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  free(th);
  return 0;
}

/* The run on initialized workers: the threads, then the report; the exit
 * status. */
static int run_and_report(worker *w, const tool_load_session_plan *p, const double *t0) {
  totals T = {0};
  if (tool_hist_init(&T.hist) < 0 || run_all(w, p->sessions) != 0) {
    fprintf(stderr, ME ": out of memory\n");
    return 1;
  }
  add_up(w, p->sessions, *t0, &T);
  (p->json ? print_json : print_text)(p, &T);
  fflush(stdout);
  int rc = 0;
  if (T.created < p->sessions) {
    fprintf(stderr, ME ": %d of %d sessions could not be created (HTTP %ld, %s)\n",
            p->sessions - T.created, p->sessions, T.first_err ? T.first_err->err_status : 0,
            T.first_err ? T.first_err->err : "?");
    rc = 1;
  }
  tool_hist_free(&T.hist);
  return rc;
}

int tool_load_sessions(const tool_load_session_plan *p) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
    fprintf(stderr, ME ": cannot initialize libcurl\n");
    return 1;
  }
  worker *w = calloc((size_t)p->sessions, sizeof *w);
  pthread_barrier_t b;
  double t0 = 0;
  int rc = 1;
  if (!w || pthread_barrier_init(&b, NULL, (unsigned)p->sessions) != 0) {
    fprintf(stderr, ME ": out of memory for %d sessions\n", p->sessions);
  } else {
    if (workers_init(w, p, &b, &t0) < 0)
      fprintf(stderr, ME ": out of memory for %d sessions\n", p->sessions);
    else
      rc = run_and_report(w, p, &t0);
    pthread_barrier_destroy(&b);
  }
  if (w)
    workers_free(w, p->sessions);
  free(w);
  curl_global_cleanup();
  return rc;
}
