/*
 * metrics.c — the numbers behind GET /metrics: request counts and latencies
 * by route, queue wait, engine time and work by backend, a few gauges.
 *
 * Every recorder takes one mutex for a handful of additions; that is far
 * cheaper than the request it describes, so finer locking or atomics would
 * buy nothing but subtlety. Rendering copies the state under the lock and
 * formats outside it, so a slow scrape never stalls the threads that record.
 * Label values come only from fixed tables or bounded sets, whatever clients
 * send, so the number of series cannot grow without bound.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
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
 * need care to come out as "0.0005" rather than "0.00050000000000000001". */
static const double bucket_bounds[N_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
};
static const char *const bucket_les[N_BUCKETS] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",  "0.25",
    "0.5",    "1",     "2.5",    "5",     "10",   "30",    "60",   "+Inf",
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

typedef struct buf {
  char *p;
  size_t len, cap;
  int oom;
} buf;

static int buf_reserve(buf *b, size_t extra) {
  if (b->oom)
    return 0;
  if (b->len + extra + 1 <= b->cap)
    return 1;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return 0;
  }
  b->p = p;
  b->cap = cap;
  return 1;
}

__attribute__((format(printf, 2, 3))) static void buf_printf(buf *b, const char *fmt, ...) {
  if (!buf_reserve(b, 64))
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = 1;
    return;
  }
  if ((size_t)n >= b->cap - b->len) {
    if (!buf_reserve(b, (size_t)n))
      return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
}

static void buf_put(buf *b, const char *s) {
  size_t n = strlen(s);
  if (!buf_reserve(b, n))
    return;
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
}

/* The exposition format's escapes for label values. */
static void buf_put_label_value(buf *b, const char *s) {
  for (; *s; s++) {
    const char *esc = *s == '\\' ? "\\\\" : *s == '"' ? "\\\"" : *s == '\n' ? "\\n" : NULL;
    if (esc) {
      buf_put(b, esc);
    } else if (buf_reserve(b, 1)) {
      b->p[b->len++] = *s;
      b->p[b->len] = '\0';
    }
  }
}

/* Shortest form that reads back as the same double, so sums survive the
 * trip through the scraper exactly without printing 17 noisy digits. */
static void buf_put_double(buf *b, double v) {
  if (isnan(v)) {
    buf_put(b, "NaN");
    return;
  }
  if (isinf(v)) {
    buf_put(b, v > 0 ? "+Inf" : "-Inf");
    return;
  }
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%.15g", v);
  if (strtod(tmp, NULL) != v)
    snprintf(tmp, sizeof tmp, "%.17g", v);
  buf_put(b, tmp);
}

static void family_header(buf *b, const char *name, const char *type, const char *help) {
  buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* label is "" or `key="value"` already escaped, without braces. */
static void render_histogram(buf *b, const char *name, const char *label, const histogram *h) {
  const char *sep = *label ? "," : "";
  uint64_t cum = 0;
  for (int i = 0; i < N_BUCKETS; i++) {
    cum += h->buckets[i];
    buf_printf(b, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, label, sep, bucket_les[i], cum);
  }
  if (*label)
    buf_printf(b, "%s_sum{%s} ", name, label);
  else
    buf_printf(b, "%s_sum ", name);
  buf_put_double(b, h->sum);
  if (*label)
    buf_printf(b, "\n%s_count{%s} %" PRIu64 "\n", name, label, h->count);
  else
    buf_printf(b, "\n%s_count %" PRIu64 "\n", name, h->count);
}

static int code_cmp(const void *a, const void *b) {
  int x = ((const code_count *)a)->code, y = ((const code_count *)b)->code;
  return (x > y) - (x < y);
}

static void render_backend_counter(buf *b, const char *name, const backend_stats *bs, double v) {
  buf_printf(b, "%s{backend=\"", name);
  buf_put_label_value(b, bs->name ? bs->name : "other");
  buf_put(b, "\"} ");
  buf_put_double(b, v);
  buf_put(b, "\n");
}

static void render_backends(buf *b, const state *s, const char *name, int flops) {
  for (int i = 0; i < s->nbackends; i++)
    render_backend_counter(b, name, &s->backends[i],
                           flops ? s->backends[i].flops : s->backends[i].seconds);
  if (s->overflow.seconds > 0 || s->overflow.flops > 0)
    render_backend_counter(b, name, &s->overflow, flops ? s->overflow.flops : s->overflow.seconds);
}

/* path="/attention", plus ,model="..." for a series with a model (escaped
 * as a label value). */
static void series_label(const state *s, const route_stats *rs, char *out, size_t cap) {
  buf b = {0};
  buf_printf(&b, "path=\"%s\"", s->route_names[rs->route]);
  if (rs->model[0]) {
    buf_put(&b, ",model=\"");
    buf_put_label_value(&b, rs->model);
    buf_put(&b, "\"");
  }
  snprintf(out, cap, "%s", b.oom || !b.p ? "path=\"other\"" : b.p);
  free(b.p);
}

static void render_requests(buf *b, state *s) {
  family_header(b, "attnd_requests_total", "counter",
                "HTTP requests finished, by route, model (routes that serve one) and status code.");
  for (int r = 0; r < s->nseries; r++) {
    route_stats *rs = &s->routes[r];
    char label[160];
    series_label(s, rs, label, sizeof label);
    qsort(rs->codes, (size_t)rs->ncodes, sizeof rs->codes[0], code_cmp);
    for (int i = 0; i < rs->ncodes; i++)
      buf_printf(b, "attnd_requests_total{%s,code=\"%d\"} %" PRIu64 "\n", label, rs->codes[i].code,
                 rs->codes[i].n);
    if (rs->other_codes)
      buf_printf(b, "attnd_requests_total{%s,code=\"other\"} %" PRIu64 "\n", label,
                 rs->other_codes);
  }
  family_header(b, "attnd_request_duration_seconds", "histogram",
                "Time spent handling HTTP requests, by route and model.");
  for (int r = 0; r < s->nseries; r++) {
    if (!s->routes[r].duration.count)
      continue;
    char label[160];
    series_label(s, &s->routes[r], label, sizeof label);
    render_histogram(b, "attnd_request_duration_seconds", label, &s->routes[r].duration);
  }
}

/* Only the caller's own series (key; NULL: every key's): no API key learns
 * another's name or how much it asks. */
static void render_keys(buf *b, const state *s, const char *key) {
  if (!s->nkeys)
    return;
  family_header(b, "attnd_requests_by_key_total", "counter",
                "HTTP requests finished that authenticated with an API key, by the key's name.");
  for (int i = 0; i < s->nkeys; i++) {
    if (key && strcmp(key, s->key_names[i]))
      continue;
    buf_put(b, "attnd_requests_by_key_total{key=\"");
    buf_put_label_value(b, s->key_names[i]);
    buf_printf(b, "\"} %" PRIu64 "\n", s->key_requests[i]);
  }
}

static void render_jobs(buf *b, const state *s) {
  family_header(b, "attnd_queue_wait_seconds", "histogram",
                "Time jobs waited between admission and the engine.");
  render_histogram(b, "attnd_queue_wait_seconds", "", &s->queue_wait);
  family_header(b, "attnd_engine_seconds_total", "counter",
                "Engine time spent on completed jobs, by backend.");
  render_backends(b, s, "attnd_engine_seconds_total", 0);
  family_header(b, "attnd_flops_total", "counter",
                "Floating-point operations of completed jobs, by backend.");
  render_backends(b, s, "attnd_flops_total", 1);
  family_header(b, "attnd_jobs_canceled_total", "counter",
                "Jobs cut short (deadline, client gone, shutdown), by reason and by where "
                "they were: dropped from the queue, or stopped in the engine.");
  for (int why = 0; why < ATTND_CANCEL_REASONS; why++)
    for (int st = 0; st < ATTND_STAGES; st++)
      buf_printf(b, "attnd_jobs_canceled_total{reason=\"%s\",stage=\"%s\"} %" PRIu64 "\n",
                 attnd_cancel_reason_name((attnd_cancel_reason)why),
                 st == ATTND_STAGE_QUEUED ? "queued" : "running", s->canceled[why][st]);
}

static void render_errors(buf *b, const state *s) {
  family_header(b, "attnd_errors_total", "counter",
                "Error replies by error code (client_closed: a client that closed or reset "
                "before its reply, logged and never answered).");
  for (int i = 0; i < s->nerrors; i++) {
    buf_put(b, "attnd_errors_total{code=\"");
    buf_put_label_value(b, s->error_codes[i]);
    buf_printf(b, "\"} %" PRIu64 "\n", s->errors[i]);
  }
  if (s->other_errors)
    buf_printf(b, "attnd_errors_total{code=\"other\"} %" PRIu64 "\n", s->other_errors);
}

static void render_gauges(buf *b, const state *s) {
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
  for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) {
    family_header(b, gauges[i].name, "gauge", gauges[i].help);
    buf_printf(b, "%s %" PRId64 "\n", gauges[i].name, s->gauges[gauges[i].g]);
  }
  family_header(b, "attnd_bytes_received_total", "counter", "Bytes of HTTP requests received.");
  buf_printf(b, "attnd_bytes_received_total %" PRIu64 "\n", s->bytes_in);
  family_header(b, "attnd_bytes_sent_total", "counter", "Bytes of HTTP responses sent.");
  buf_printf(b, "attnd_bytes_sent_total %" PRIu64 "\n", s->bytes_out);
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
  buf b = {0};
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
