/*
 * harness.h — black-box tests of attnd: start the real server binary as a
 * child process on a free port, talk HTTP to it (libcurl, or raw sockets for
 * what curl cannot do), build request bodies from the unit tests' random
 * problems (tests/lib/helpers.h) and check replies against the float64
 * reference.
 *
 * Its codecs (json_body, st_body, parse_*_reply) are deliberately its own,
 * not proto's: an oracle that shared proto's code would share its bugs.
 *
 * The server binary is $ATTND_BIN (default build/attnd). $ATTND_START_TIMEOUT
 * (seconds, default 10) bounds the wait for /healthz after a start.
 */
#ifndef ATTND_TEST_HARNESS_H
#define ATTND_TEST_HARNESS_H

#include "helpers.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- the server process ------------------------------------------------ */

typedef struct srv {
  pid_t pid; /* 0 once reaped */
  int port;
  char log[128]; /* file holding the server's stderr */
  char out[128]; /* file holding its stdout */
  char url[64];  /* http://127.0.0.1:PORT */
  int status;    /* exit status once reaped: code, or 128 + signal */
} srv;

/* $ATTND_BIN or build/attnd. */
const char *srv_bin(void);

/* A port nobody listens on now (bind 127.0.0.1:0, getsockname, close). */
int free_port(void);

/* Starts attnd --listen 127.0.0.1:PORT plus the NULL-terminated flags, waits
 * until GET /healthz answers 200 and cr_asserts that it does. */
void srv_start(srv *s, ...);
/* The same with an argument vector and extra environment ("NAME=value"
 * strings; either may be NULL). With listen false no --listen is passed (the
 * test sets ATTND_LISTEN itself, with s->port from free_port()). */
void srv_startv(srv *s, const char *const *args, const char *const *env, bool listen);
/* Spawns without waiting for health; returns the pid. */
pid_t srv_spawn(srv *s, const char *const *args, const char *const *env, bool listen);

/* SIGTERM, then waits up to timeout_s for the exit; returns the status
 * (exit code, 128 + signal), or -1 when it had to be killed. */
int srv_stop(srv *s, double timeout_s);
/* Waits up to timeout_s for an exit; -1 when still running. */
int srv_wait(srv *s, double timeout_s);
/* SIGKILL and reap. */
void srv_kill(srv *s);
/* Teardown: srv_kill, then removes the log files (kept when $ATTND_KEEP_LOGS
 * is set). */
void srv_cleanup(srv *s);
bool srv_running(srv *s);
/* The server's stderr so far, malloc'd. */
char *srv_log(const srv *s);
/* Waits up to timeout_s for needle in the server's stderr (a line may be
 * written just after the event a test saw); whether it came. */
bool srv_wait_log(const srv *s, const char *needle, double timeout_s);

/* Runs attnd with args to completion (at most timeout_s, then kills it).
 * Returns the exit status (-1: killed on timeout); *out and *err (optional)
 * receive stdout and stderr, malloc'd. */
int run_attnd(const char *const *args, const char *const *env, double timeout_s, char **out,
              char **err);

/* Kills every server this process started (also registered with atexit). */
void srv_kill_all(void);

/* ---- HTTP with libcurl ------------------------------------------------- */

typedef struct http_res {
  long status;     /* 0: no response (curl error) */
  int curl_rc;     /* CURLcode */
  char error[256]; /* curl's error text */
  char *body;      /* NUL-terminated */
  size_t len;
  char *hdrs; /* the final response's header block, NUL-terminated */
  size_t hlen;
  double secs; /* total time */
} http_res;

typedef struct http_req {
  const char *method;         /* default GET, or POST when a body is given */
  const char *path;           /* "/attention?causal=true" */
  const char *const *headers; /* NULL-terminated; "Name:" removes curl's own */
  const void *body;           /* NULL: none */
  size_t len;
  bool chunked;    /* Transfer-Encoding: chunked, 64 KiB pieces */
  long timeout_ms; /* default 30000 */
} http_req;

/* One request on a fresh connection; returns 0, or -1 with rs->error set. */
int http_do(const srv *s, const http_req *rq, http_res *rs);
/* The same on handle h (void * to keep curl.h out; from http_handle), whose
 * connection is reused across calls. */
void *http_handle(void);
void http_handle_free(void *h);
int http_do_h(void *h, const srv *s, const http_req *rq, http_res *rs);

int http_get(const srv *s, const char *path, http_res *rs);
/* POST with a Content-Type (NULL: none at all). */
int http_post(const srv *s, const char *path, const char *ctype, const void *body, size_t len,
              http_res *rs);
/* The value of a header of the response (case-insensitive name), trimmed,
 * into buf; false when absent. */
bool http_header(const http_res *rs, const char *name, char *buf, size_t cap);
void http_res_free(http_res *rs);

/* Checks with cr_expect that rs is an error reply: the status, Content-Type
 * application/json and {"error": {"code": code, "message": non-empty}}.
 * Returns whether everything held. what names the request in messages. */
bool expect_error(const http_res *rs, long status, const char *code, const char *what);

/* GET /healthz answers 200 (cr_expect); returns whether it did. */
bool expect_healthy(const srv *s, const char *after);

/* ---- raw sockets ------------------------------------------------------- */

/* Connected TCP socket to 127.0.0.1:port, or -1 (errno set). */
int raw_connect(int port);
/* The same from a source address of the loopback net (127.0.0.2, ...), so
 * that the server sees another client; NULL: the default. */
int raw_connect_from(int port, const char *source);
/* Sends everything (MSG_NOSIGNAL); 0 or -1. */
int raw_send(int fd, const void *buf, size_t len);
int raw_sends(int fd, const char *s);
/* Reads one response (headers, then Content-Length bytes of body, or until
 * close) within timeout_ms. Returns the status, or -1 on timeout or when the
 * peer closed before a status line; rs is filled as by http_do. */
int raw_response(int fd, int timeout_ms, http_res *rs);
/* Waits for the peer to close (recv() == 0 or a reset), discarding any data.
 * Returns the seconds it took, or -1 when still open after timeout_ms. */
double raw_wait_close(int fd, int timeout_ms);

/* ---- bodies ------------------------------------------------------------ */

/* Tensor shapes of rank 2 ([N, D], B = H = 1), 3 ([H, N, D], B = 1) or 4. */
void shape_of(const tprob *p, bool kv, int rank, int64_t out[4]);

/* JSON request {"q": {"shape", "dtype", "data"}, "k", "v" <extra>} where
 * extra is appended verbatim after v (e.g. ",\"causal\":true"); malloc'd. */
char *json_body(const tcase *c, int rank, const char *extra, size_t *plen);
/* JSON request with nested arrays (F32 only), shape inferred. */
char *json_nested_body(const tcase *c, int rank, const char *extra, size_t *plen);
/* safetensors request of rank 2-4 with an optional __metadata__ object text. */
char *st_body(const tcase *c, int rank, const char *metadata, size_t *plen);

/* Parse a reply into c->o (and c->m, c->l, c->lse when c->p.stats), checking
 * the shapes (q's shape at rank) and dtypes; stats present iff c->p.stats.
 * Return 0 or -1 with a message in err. */
int parse_json_reply(const char *body, size_t len, tcase *c, int rank, char *err, size_t cap);
int parse_st_reply(const void *body, size_t len, tcase *c, int rank, char *err, size_t cap);

/* Checks (cr_expect) that rs is a 200 reply of the expected codec whose
 * outputs match the float64 reference of c within ttol(dtype) (stats 1e-5,
 * fully masked rows exact). Returns whether all held. */
bool expect_correct(const http_res *rs, tcase *c, int rank, bool st_reply, const char *what);
/* The same without criterion (for worker threads): returns NULL when right,
 * else a message in err. */
const char *check_correct(const http_res *rs, tcase *c, int rank, bool st_reply, char *err,
                          size_t cap);

/* ---- Prometheus text ----------------------------------------------------- */

/* Sum of the samples named name whose labels include every "key=value" of
 * labels (NULL-terminated, may be NULL); *n (optional) gets how many
 * samples matched. */
double prom_sum(const char *text, const char *name, const char *const *labels, int *n);

/* ---- waiting for events -------------------------------------------------- */

/* Tests wait for what they need (a gauge, a closed socket, an exit) within a
 * generous deadline and never assert how long it took: the machine may be
 * loaded (make test must pass beside CPU hogs). Durations belong in
 * tests/bench/. */

/* A metric from GET /metrics, summed over the series matching labels (as
 * prom_sum); -1 when /metrics did not answer. */
double srv_metric(const srv *s, const char *name, const char *const *labels);
/* Poll until the metric is >= (ge) or <= (le) want; false after timeout_s. */
bool srv_wait_metric_ge(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s);
bool srv_wait_metric_le(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s);
/* attnd_queue_depth + attnd_inflight, or -1. */
int srv_jobs(const srv *s);
/* Poll until srv_jobs is >= want (at_least) or <= want; false after timeout_s. */
bool srv_wait_jobs(const srv *s, int want, bool at_least, double timeout_s);
/* Poll until a connect to s->port fails (a drain has closed the listener). */
bool srv_wait_listener_closed(const srv *s, double timeout_s);

/* Closes fd with a reset (SO_LINGER 0): the server cancels its job. */
void raw_reset(int fd);
/* A raw connection that has sent a whole POST /attention, or -1. */
int raw_post(int port, const char *ctype, const void *body, size_t len);

/* ---- misc ---------------------------------------------------------------- */

double now_s(void);
void sleep_s(double s);
/* Slow job bodies: backend=reference on H heads of N x 64 (F32,
 * safetensors), about H * N^2 * 64 * 4 flops of scalar float64 work. */
char *slow_body(tcase *c, int heads, int n, size_t *plen);
/* Reading a file whole; NULL if it cannot be read. */
char *read_file_all(const char *path, size_t *plen);

#endif
