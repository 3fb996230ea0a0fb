/*
 * metrics.c — the numbers behind GET /metrics: request counts and latencies
 * by route, queue wait, engine time and work by backend, a few gauges.
 *
 * Every recorder takes one mutex for a handful of additions; that is far
 * cheaper than the request it describes, so finer locking or atomics would
 * buy nothing but subtlety. Rendering copies the state under the lock and
 * formats outside it, so a slow scrape never stalls the threads that record;
 * the text is proto/prom.h's, as every other family of /metrics is.
 * Label values come only from fixed tables or bounded sets, whatever clients
 * send, so the number of series cannot grow without bound.
 */
#include "metrics.h"
#include "prom.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  /* the route table's labels (routes.c has ten) and "other" */
  N_ROUTES = ATTND_METRICS_MAX_ROUTES + 1,
  MAX_CODES = 64,        /* distinct status codes kept per route */
  MAX_MODEL_SERIES = 16, /* (route, model) pairs, the last kept for model "other" */
  N_SERIES = N_ROUTES + MAX_MODEL_SERIES,
  MODEL_CAP = 48,
  MAX_BACKENDS = 8,
  MAX_ERROR_CODES = 64, /* distinct error codes; the lists hold about 50 */
  N_BUCKETS = 17        /* 16 finite bounds and +Inf */
};

/* Bounds and their printed form side by side: printing the doubles would
 * need care to come out as "0.0005" rather than "0.00050000000000000001".
 * The last bucket, above every bound, is +Inf (the writer's). */
static const double bucket_bounds[N_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};
static const char *const bucket_les[N_BUCKETS - 1] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
    "0.25",   "0.5",   "1",      "2.5",   "5",    "10",    "30",   "60",
};

typedef struct histogram {
  uint64_t buckets[N_BUCKETS]; /* per bucket; made cumulative when rendered */
  uint64_t count;
  double sum;
} histogram;

typedef struct code_count {
  int code;
  uint64_t n;
} code_count;

/* One route, or one (route, model) pair. */
typedef struct route_stats {
  int route;
  char model[MODEL_CAP]; /* "" for the route's requests that name no model */
  code_count codes[MAX_CODES];
  int ncodes;
  uint64_t other_codes; /* statuses past the first MAX_CODES distinct ones */
  histogram duration;
} route_stats;

typedef struct backend_stats {
  char *name; /* owned; set once, freed only with the metrics */
  double seconds;
  double flops;
} backend_stats;

typedef struct state {
  /* The route table's labels, then "other" (static strings). */
  const char *route_names[N_ROUTES];
  int nroutes; /* with "other", the last */
  /* The first nroutes are the routes without a model, in route order;
   * pairs with a model follow as they are first seen. */
  route_stats routes[N_SERIES];
  int nseries;
  histogram queue_wait;
  uint64_t tiny_jobs; /* computed on the HTTP thread (tiny.h) */
  backend_stats backends[MAX_BACKENDS];
  int nbackends;
  backend_stats overflow; /* backends past the first MAX_BACKENDS, as "other" */
  int64_t gauges[ATTND_GAUGE_COUNT];
  uint64_t bytes_in, bytes_out;
  uint64_t canceled[ATTND_CANCEL_REASONS][ATTND_STAGES];
  const char *error_codes[MAX_ERROR_CODES]; /* static strings, in first-seen order */
  uint64_t errors[MAX_ERROR_CODES];
  int nerrors;
  uint64_t other_errors; /* codes past the first MAX_ERROR_CODES distinct ones */
  /* The API keys' names, fixed before the threads start (so read without
   * the lock), and their requests. */
  char key_names[ATTND_METRICS_MAX_KEYS][ATTND_METRICS_KEY_CAP];
  uint64_t key_requests[ATTND_METRICS_MAX_KEYS];
  int nkeys;
} state;

struct attnd_metrics {
  pthread_mutex_t mu;
  state s;
};

attnd_metrics *attnd_metrics_new(const char *const *labels, int n) {
  if (n < 0 || n > ATTND_METRICS_MAX_ROUTES)
    return NULL;
  attnd_metrics *m = calloc(1, sizeof *m);
  if (!m)
    return NULL;
  if (pthread_mutex_init(&m->mu, NULL) != 0) {
    free(m);
    return NULL;
  }
  for (int r = 0; r < n; r++)
    m->s.route_names[r] = labels[r];
  m->s.route_names[n] = "other";
  m->s.nroutes = n + 1;
  for (int r = 0; r < m->s.nroutes; r++)
    m->s.routes[r].route = r;
  m->s.nseries = m->s.nroutes;
  return m;
}

void attnd_metrics_free(attnd_metrics *m) {
  if (!m)
    return;
  for (int i = 0; i < m->s.nbackends; i++)
    free(m->s.backends[i].name);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

/* The query string is not part of the route; matching is exact otherwise,
 * so "/attention/" is "other" just as the router treats it. */
static int route_index(const state *s, const char *path) {
  int other = s->nroutes - 1;
  if (!path)
    return other;
  size_t n = strcspn(path, "?");
  for (int i = 0; i < other; i++)
    if (strlen(s->route_names[i]) == n && memcmp(s->route_names[i], path, n) == 0)
      return i;
  return other;
}

/* Durations come from a monotonic clock, so a NaN, infinite or negative one
 * is a caller's bug; it still counts as an observation (the count must match
 * attnd_requests_total) but as 0, so it cannot poison _sum for good. */
static void histogram_observe(histogram *h, double v) {
  if (!isfinite(v) || v < 0)
    v = 0;
  int i = 0;
  while (i < N_BUCKETS - 1 && v > bucket_bounds[i])
    i++;
  h->buckets[i]++;
  h->count++;
  h->sum += v;
}

/* The series of (route, model), with the lock held: added when new and
 * there is room, else the pair (route, "other"), else (no room even for
 * that) the route's own. */
static route_stats *series_of(state *s, int route, const char *model) {
  if (!model || !*model)
    return &s->routes[route];
  for (int pass = 0; pass < 2; pass++) {
    for (int i = s->nroutes; i < s->nseries; i++)
      if (s->routes[i].route == route && !strcmp(s->routes[i].model, model))
        return &s->routes[i];
    /* the last slot is kept for "other", so the overflow has a series */
    bool room = s->nseries < s->nroutes + MAX_MODEL_SERIES - (pass == 0);
    if (room && strlen(model) < MODEL_CAP) {
      route_stats *rs = &s->routes[s->nseries++];
      rs->route = route;
      snprintf(rs->model, sizeof rs->model, "%s", model);
      return rs;
    }
    model = "other";
  }
  return &s->routes[route];
}

void attnd_metrics_request(attnd_metrics *m, const char *path, int status, double seconds,
                           uint64_t bytes_in, uint64_t bytes_out) {
  attnd_metrics_request_model(m, path, NULL, status, seconds, bytes_in, bytes_out);
}

void attnd_metrics_request_model(attnd_metrics *m, const char *path, const char *model, int status,
                                 double seconds, uint64_t bytes_in, uint64_t bytes_out) {
  attnd_metrics_request_series(m, route_index(&m->s, path), model, status, seconds, bytes_in,
                               bytes_out);
}

void attnd_metrics_request_series(attnd_metrics *m, int r, const char *model, int status,
                                  double seconds, uint64_t bytes_in, uint64_t bytes_out) {
  if (r < 0 || r >= m->s.nroutes - 1) /* nroutes is fixed once made */
    r = m->s.nroutes - 1;
  if (status < 100 || status > 599)
    status = 0;
  pthread_mutex_lock(&m->mu);
  route_stats *rs = series_of(&m->s, r, model);
  int i = 0;
  while (i < rs->ncodes && rs->codes[i].code != status)
    i++;
  if (i < rs->ncodes) {
    rs->codes[i].n++;
  } else if (rs->ncodes < MAX_CODES) {
    rs->codes[rs->ncodes].code = status;
    rs->codes[rs->ncodes].n = 1;
    rs->ncodes++;
  } else {
    rs->other_codes++;
  }
  histogram_observe(&rs->duration, seconds);
  m->s.bytes_in += bytes_in;
  m->s.bytes_out += bytes_out;
  pthread_mutex_unlock(&m->mu);
}

int attnd_metrics_keys(attnd_metrics *m, const char *const *names, int n) {
  m->s.nkeys = 0;
  if (n < 0 || n > ATTND_METRICS_MAX_KEYS)
    return -1;
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) >= ATTND_METRICS_KEY_CAP)
      return -1;
  for (int i = 0; i < n; i++)
    snprintf(m->s.key_names[i], ATTND_METRICS_KEY_CAP, "%s", names[i]);
  m->s.nkeys = n;
  return 0;
}

void attnd_metrics_request_key(attnd_metrics *m, const char *name) {
  /* a few names at most 64: a scan costs less than the request did */
  for (int i = 0; i < m->s.nkeys; i++)
    if (!strcmp(m->s.key_names[i], name)) {
      pthread_mutex_lock(&m->mu);
      m->s.key_requests[i]++;
      pthread_mutex_unlock(&m->mu);
      return;
    }
}

void attnd_metrics_queue_wait(attnd_metrics *m, double seconds) {
  pthread_mutex_lock(&m->mu);
  histogram_observe(&m->s.queue_wait, seconds);
  pthread_mutex_unlock(&m->mu);
}

void attnd_metrics_tiny(attnd_metrics *m) {
  pthread_mutex_lock(&m->mu);
  histogram_observe(&m->s.queue_wait, 0);
  m->s.tiny_jobs++;
  pthread_mutex_unlock(&m->mu);
}

/* Called with the lock held. A backend literally named "other" absorbs the
 * overflow, so the output never holds two series with the same labels. */
static backend_stats *backend_slot(state *s, const char *name) {
  if (!name)
    name = "other";
  for (int i = 0; i < s->nbackends; i++)
    if (strcmp(s->backends[i].name, name) == 0)
      return &s->backends[i];
  if (s->nbackends < MAX_BACKENDS) {
    char *copy = strdup(name);
    if (copy) {
      backend_stats *b = &s->backends[s->nbackends++];
      b->name = copy;
      return b;
    }
  }
  for (int i = 0; i < s->nbackends; i++)
    if (strcmp(s->backends[i].name, "other") == 0)
      return &s->backends[i];
  return &s->overflow;
}

void attnd_metrics_engine(attnd_metrics *m, const char *backend, double seconds, double flops) {
  pthread_mutex_lock(&m->mu);
  backend_stats *b = backend_slot(&m->s, backend);
  /* Counters must never go down or turn NaN, or rate() breaks. */
  if (isfinite(seconds) && seconds > 0)
    b->seconds += seconds;
  if (isfinite(flops) && flops > 0)
    b->flops += flops;
  pthread_mutex_unlock(&m->mu);
}

const char *attnd_cancel_reason_name(attnd_cancel_reason why) {
  static const char *const names[ATTND_CANCEL_REASONS] = {"timeout", "client_closed",
                                                          "shutting_down"};
  return (unsigned)why < ATTND_CANCEL_REASONS ? names[why] : "other";
}

void attnd_metrics_canceled(attnd_metrics *m, attnd_cancel_reason why, attnd_cancel_stage stage) {
  if ((unsigned)why >= ATTND_CANCEL_REASONS || (unsigned)stage >= ATTND_STAGES)
    return;
  pthread_mutex_lock(&m->mu);
  m->s.canceled[why][stage]++;
  pthread_mutex_unlock(&m->mu);
}

void attnd_metrics_error(attnd_metrics *m, const char *code) {
  if (!code)
    return;
  pthread_mutex_lock(&m->mu);
  state *s = &m->s;
  int i = 0;
  while (i < s->nerrors && strcmp(s->error_codes[i], code) != 0)
    i++;
  if (i < s->nerrors)
    s->errors[i]++;
  else if (s->nerrors < MAX_ERROR_CODES) {
    s->error_codes[s->nerrors] = code;
    s->errors[s->nerrors++] = 1;
  } else {
    s->other_errors++;
  }
  pthread_mutex_unlock(&m->mu);
}

void attnd_metrics_gauge_add(attnd_metrics *m, attnd_gauge g, int64_t delta) {
  if ((unsigned)g >= ATTND_GAUGE_COUNT)
    return;
  pthread_mutex_lock(&m->mu);
  m->s.gauges[g] += delta;
  pthread_mutex_unlock(&m->mu);
}

int64_t attnd_metrics_gauge(attnd_metrics *m, attnd_gauge g) {
  if ((unsigned)g >= ATTND_GAUGE_COUNT)
    return 0;
  pthread_mutex_lock(&m->mu);
  int64_t v = m->s.gauges[g];
  pthread_mutex_unlock(&m->mu);
  return v;
}

/* ---- rendering ----------------------------------------------------------- */

static void render_histogram(attn_sbuf *b, const char *name, const attn_prom_label *l, int n,
                             const histogram *h) {
  attn_prom_hist ph = {
      .les = bucket_les, .counts = h->buckets, .nbounds = N_BUCKETS - 1, .sum = h->sum};
  attn_prom_histogram(b, name, l, n, &ph);
}

static int code_cmp(const void *a, const void *b) {
  int x = ((const code_count *)a)->code, y = ((const code_count *)b)->code;
  return (x > y) - (x < y);
}

static void render_backend(attn_sbuf *b, const char *name, const backend_stats *bs, int flops) {
  attn_prom_label l = {"backend", bs->name ? bs->name : "other"};
  attn_prom_sample_f64(b, name, &l, 1, flops ? bs->flops : bs->seconds);
}

static void render_backends(attn_sbuf *b, const state *s, const char *name, int flops) {
  for (int i = 0; i < s->nbackends; i++)
    render_backend(b, name, &s->backends[i], flops);
  if (s->overflow.seconds > 0 || s->overflow.flops > 0)
    render_backend(b, name, &s->overflow, flops);
}

/* path, and model for a series with one: a route series' labels; the
 * caller's code label, when it has one, goes after them (l has room). */
static int series_labels(const state *s, const route_stats *rs, attn_prom_label l[3]) {
  int n = 0;
  l[n++] = (attn_prom_label){"path", s->route_names[rs->route]};
  if (rs->model[0])
    l[n++] = (attn_prom_label){"model", rs->model};
  return n;
}

static void render_requests(attn_sbuf *b, state *s) {
  attn_prom_family(b, "attnd_requests_total", "counter",
                   "HTTP requests finished, by route, model (routes that serve one) and status "
                   "code.");
  for (int r = 0; r < s->nseries; r++) {
    route_stats *rs = &s->routes[r];
    attn_prom_label l[3];
    int n = series_labels(s, rs, l);
    char code[16];
    l[n] = (attn_prom_label){"code", code};
    qsort(rs->codes, (size_t)rs->ncodes, sizeof rs->codes[0], code_cmp);
    for (int i = 0; i < rs->ncodes; i++) {
      snprintf(code, sizeof code, "%d", rs->codes[i].code);
      attn_prom_sample_u64(b, "attnd_requests_total", l, n + 1, rs->codes[i].n);
    }
    if (rs->other_codes) {
      snprintf(code, sizeof code, "other");
      attn_prom_sample_u64(b, "attnd_requests_total", l, n + 1, rs->other_codes);
    }
  }
  attn_prom_family(b, "attnd_request_duration_seconds", "histogram",
                   "Time spent handling HTTP requests, by route and model.");
  for (int r = 0; r < s->nseries; r++) {
    if (!s->routes[r].duration.count)
      continue;
    attn_prom_label l[3];
    int n = series_labels(s, &s->routes[r], l);
    render_histogram(b, "attnd_request_duration_seconds", l, n, &s->routes[r].duration);
  }
}

/* Only the caller's own series (key; NULL: every key's): no API key learns
 * another's name or how much it asks. */
static void render_keys(attn_sbuf *b, const state *s, const char *key) {
  if (!s->nkeys)
    return;
  attn_prom_family(b, "attnd_requests_by_key_total", "counter",
                   "HTTP requests finished that authenticated with an API key, by the key's "
                   "name.");
  for (int i = 0; i < s->nkeys; i++) {
    if (key && strcmp(key, s->key_names[i]))
      continue;
    attn_prom_label l = {"key", s->key_names[i]};
    attn_prom_sample_u64(b, "attnd_requests_by_key_total", &l, 1, s->key_requests[i]);
  }
}

static void render_jobs(attn_sbuf *b, const state *s) {
  attn_prom_family(b, "attnd_queue_wait_seconds", "histogram",
                   "Time jobs waited between admission and the engine.");
  render_histogram(b, "attnd_queue_wait_seconds", NULL, 0, &s->queue_wait);
  attn_prom_counter(b, "attnd_jobs_on_http_thread_total",
                    "Jobs computed on the HTTP thread that read them, without the queue "
                    "(--tiny-flops).",
                    s->tiny_jobs);
  attn_prom_family(b, "attnd_engine_seconds_total", "counter",
                   "Engine time spent on completed jobs, by backend.");
  render_backends(b, s, "attnd_engine_seconds_total", 0);
  attn_prom_family(b, "attnd_flops_total", "counter",
                   "Floating-point operations of completed jobs, by backend.");
  render_backends(b, s, "attnd_flops_total", 1);
  attn_prom_family(b, "attnd_jobs_canceled_total", "counter",
                   "Jobs cut short (deadline, client gone, shutdown), by reason and by where "
                   "they were: dropped from the queue, or stopped in the engine.");
  for (int why = 0; why < ATTND_CANCEL_REASONS; why++)
    for (int st = 0; st < ATTND_STAGES; st++) {
      attn_prom_label l[] = {{"reason", attnd_cancel_reason_name((attnd_cancel_reason)why)},
                             {"stage", st == ATTND_STAGE_QUEUED ? "queued" : "running"}};
      attn_prom_sample_u64(b, "attnd_jobs_canceled_total", l, 2, s->canceled[why][st]);
    }
}

static void render_errors(attn_sbuf *b, const state *s) {
  attn_prom_family(b, "attnd_errors_total", "counter",
                   "Error replies by error code (client_closed: a client that closed or reset "
                   "before its reply, logged and never answered).");
  for (int i = 0; i < s->nerrors; i++) {
    attn_prom_label l = {"code", s->error_codes[i]};
    attn_prom_sample_u64(b, "attnd_errors_total", &l, 1, s->errors[i]);
  }
  if (s->other_errors) {
    attn_prom_label l = {"code", "other"};
    attn_prom_sample_u64(b, "attnd_errors_total", &l, 1, s->other_errors);
  }
}

static void render_gauges(attn_sbuf *b, const state *s) {
  static const struct {
    attnd_gauge g;
    const char *name, *help;
  } gauges[] = {
      {ATTND_GAUGE_QUEUE_DEPTH, "attnd_queue_depth", "Jobs admitted, not yet started."},
      {ATTND_GAUGE_INFLIGHT, "attnd_inflight", "Jobs running in the engine."},
      {ATTND_GAUGE_CONNECTIONS, "attnd_connections", "Open HTTP connections."},
      {ATTND_GAUGE_UPLOADS, "attnd_uploads",
       "POST requests whose headers arrived and whose body is still being read."},
  };
  for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++)
    attn_prom_gauge(b, gauges[i].name, gauges[i].help, s->gauges[gauges[i].g]);
  attn_prom_counter(b, "attnd_bytes_received_total", "Bytes of HTTP requests received.",
                    s->bytes_in);
  attn_prom_counter(b, "attnd_bytes_sent_total", "Bytes of HTTP responses sent.", s->bytes_out);
}

char *attnd_metrics_render(attnd_metrics *m, size_t *plen) {
  return attnd_metrics_render_for(m, NULL, plen);
}

char *attnd_metrics_render_for(attnd_metrics *m, const char *key, size_t *plen) {
  /* On the heap: the snapshot is some 30 KiB, too much for small thread
   * stacks. Backend names may be shared: they never change once set. */
  state *s = malloc(sizeof *s);
  if (!s)
    return NULL;
  pthread_mutex_lock(&m->mu);
  *s = m->s;
  pthread_mutex_unlock(&m->mu);
  attn_sbuf b = {0};
  render_requests(&b, s);
  render_keys(&b, s, key);
  render_jobs(&b, s);
  render_errors(&b, s);
  render_gauges(&b, s);
  free(s);
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  if (plen)
    *plen = b.len;
  return b.p;
}
