/*
 * metrics.h — attnd's counters, gauges and histograms, rendered in the
 * Prometheus text exposition format (version 0.0.4) for GET /metrics.
 *
 * Every function is thread-safe: the HTTP thread, the libuv loop and engine
 * completion threads all record. Label values are bounded: `path` is one of
 * the routes or "other", `code` an HTTP status (of requests) or an error
 * code of the fixed lists (of errors, at most 64 distinct), `backend` an
 * engine backend name (at most 8 distinct), so the number of series is
 * bounded whatever clients send. `model` appears only on the requests of
 * routes that serve a named model (the /v2 front): its series are the pairs
 * (path, model) first seen, at most 16, then model="other"; requests without
 * a model (/attention) have no model label. Server-wide series (build and
 * backend info, connections) are rendered by the HTTP front.
 *
 * `key` is the name of an API key (attnd_metrics_keys): the set is fixed
 * at start-up, and the family is absent on a server without keys; GET
 * /metrics shows each caller its own key's series only.
 *
 * Series:
 *   attnd_requests_total{path,[model,]code}    counter
 *   attnd_requests_by_key_total{key}           counter
 *   attnd_request_duration_seconds{path[,model]} histogram
 *   attnd_queue_wait_seconds                   histogram
 *   attnd_engine_seconds_total{backend}        counter
 *   attnd_flops_total{backend}                 counter
 *   attnd_jobs_canceled_total{reason,stage}    counter
 *   attnd_errors_total{code}                   counter
 *   attnd_queue_depth                          gauge
 *   attnd_inflight                             gauge
 *   attnd_uploads                              gauge
 *   attnd_connections                          gauge
 *   attnd_bytes_received_total                 counter
 *   attnd_bytes_sent_total                     counter
 */
#ifndef ATTND_METRICS_H
#define ATTND_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct attnd_metrics attnd_metrics;

typedef enum attnd_gauge {
  ATTND_GAUGE_QUEUE_DEPTH, /* jobs admitted, not yet started */
  ATTND_GAUGE_INFLIGHT,    /* jobs running in the engine */
  ATTND_GAUGE_CONNECTIONS, /* open HTTP connections */
  ATTND_GAUGE_UPLOADS,     /* POST bodies being read (headers in, body not) */
  ATTND_GAUGE_COUNT
} attnd_gauge;

/* The most route labels attnd_metrics_new() keeps a series for, and the
 * most API key names attnd_metrics_keys() takes (and their size). */
enum { ATTND_METRICS_MAX_ROUTES = 24, ATTND_METRICS_MAX_KEYS = 64, ATTND_METRICS_KEY_CAP = 64 };

/* A series for each of the n labels (the route table's: attnd_route_labels;
 * static strings) and one for "other". NULL when out of memory or n is over
 * ATTND_METRICS_MAX_ROUTES. */
attnd_metrics *attnd_metrics_new(const char *const *labels, int n);
void attnd_metrics_free(attnd_metrics *m);

/* One finished HTTP request: counts it under (path, status), observes its
 * duration, adds its bytes. path is the request's path; anything that is not
 * a known route is counted as "other". */
void attnd_metrics_request(attnd_metrics *m, const char *path, int status, double seconds,
                           uint64_t bytes_in, uint64_t bytes_out);
/* The same for a request that served model (NULL or "": none, as above). */
void attnd_metrics_request_model(attnd_metrics *m, const char *path, const char *model, int status,
                                 double seconds, uint64_t bytes_in, uint64_t bytes_out);
/* The same by the series' handle: the place of its label among those given
 * to attnd_metrics_new() (attnd_route_series), found once rather than by
 * comparing paths per request; any other number is "other". */
void attnd_metrics_request_series(attnd_metrics *m, int series, const char *model, int status,
                                  double seconds, uint64_t bytes_in, uint64_t bytes_out);
/* The names of the server's API keys (copied), each a series of
 * attnd_requests_by_key_total from 0. Called once, before any thread
 * records. -1 (and no keys) when n is over ATTND_METRICS_MAX_KEYS or a
 * name does not fit ATTND_METRICS_KEY_CAP. */
int attnd_metrics_keys(attnd_metrics *m, const char *const *names, int n);
/* One finished request that authenticated with the key of this name; a
 * name not given to attnd_metrics_keys() is not counted. */
void attnd_metrics_request_key(attnd_metrics *m, const char *name);
/* Time a job waited between admission and the engine. */
void attnd_metrics_queue_wait(attnd_metrics *m, double seconds);
/* A job computed on the HTTP thread that read it (tiny.h): counted, and
 * its wait (none) observed as queue_wait's. */
void attnd_metrics_tiny(attnd_metrics *m);
/* A job the engine completed. */
void attnd_metrics_engine(attnd_metrics *m, const char *backend, double seconds, double flops);
/* Why a job was canceled, and where it was then. */
typedef enum attnd_cancel_reason {
  ATTND_CANCEL_TIMEOUT,       /* past --timeout */
  ATTND_CANCEL_CLIENT_CLOSED, /* the client reset the connection */
  ATTND_CANCEL_SHUTDOWN,      /* past --drain-timeout */
  ATTND_CANCEL_REASONS
} attnd_cancel_reason;
typedef enum attnd_cancel_stage {
  ATTND_STAGE_QUEUED,  /* dropped from the queue: never started */
  ATTND_STAGE_RUNNING, /* stopped by the engine before its end */
  ATTND_STAGES
} attnd_cancel_stage;
/* A job cut short: counted once, when it ends. */
void attnd_metrics_canceled(attnd_metrics *m, attnd_cancel_reason why, attnd_cancel_stage stage);
/* "timeout", "client_closed", "shutting_down". */
const char *attnd_cancel_reason_name(attnd_cancel_reason why);

/* An error reply (or a close for a client that reset) with this code.
 * code must be a static string from the error lists (server/errors.h,
 * proto/errors.c): it is kept, not copied, and the set stays bounded. */
void attnd_metrics_error(attnd_metrics *m, const char *code);

void attnd_metrics_gauge_add(attnd_metrics *m, attnd_gauge g, int64_t delta);
int64_t attnd_metrics_gauge(attnd_metrics *m, attnd_gauge g);

/* The text exposition, malloc'd and NUL-terminated; NULL when out of
 * memory. attnd_metrics_render_for is what a caller that authenticated
 * with the key named key sees: of attnd_requests_by_key_total, its own
 * series only, never another key's name or count (GET /metrics);
 * attnd_metrics_render has every key's. */
char *attnd_metrics_render(attnd_metrics *m, size_t *plen);
char *attnd_metrics_render_for(attnd_metrics *m, const char *key, size_t *plen);

#endif
