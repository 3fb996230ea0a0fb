/*
 * log.c — request lines and notes, as text or JSON (log.h).
 */
#include "log.h"
#include "request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- numbers without printf ----------------------------------------------- */

/* A line being written into a fixed buffer, cut (never overrun) at its
 * end. Request lines are formatted here rather than with printf: one goes
 * out for every request, and printf of doubles was most of its cost. */
typedef struct line {
  char *p;
  size_t len, cap;
} line;

static void put(line *l, const char *s, size_t n) {
  if (n > l->cap - l->len)
    n = l->cap - l->len;
  memcpy(l->p + l->len, s, n);
  l->len += n;
}

static void puts_(line *l, const char *s) { put(l, s, strlen(s)); }

/* v in decimal, as "%llu" writes it. */
static void put_u64(line *l, unsigned long long v) {
  char d[24];
  size_t i = sizeof d;
  do
    d[--i] = (char)('0' + v % 10);
  while (v /= 10);
  put(l, d + i, sizeof d - i);
}

static void put_int(line *l, long long v) {
  if (v < 0)
    put(l, "-", 1);
  put_u64(l, v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v);
}

size_t attnd_fmt_fixed(char *out, size_t cap, double v, int decimals) {
  static const double scale[7] = {1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6};
  if (!cap)
    return 0;
  decimals = decimals < 0 ? 0 : decimals > 6 ? 6 : decimals;
  double scaled = v * scale[decimals], units = nearbyint(scaled);
  /* NaN, infinite or huge: printf's words. On a tie of the scaled double
   * too: v itself may lie on either side of it, which printf rounds by. */
  if (!(fabs(units) < 1e18) || fabs(scaled - units) == 0.5) {
    int n = snprintf(out, cap, "%.*f", decimals, v);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
  }
  unsigned long long u = (unsigned long long)fabs(units);
  char d[32];
  int i = (int)sizeof d;
  for (int k = 0; k < decimals; k++, u /= 10)
    d[--i] = (char)('0' + u % 10);
  if (decimals)
    d[--i] = '.';
  do
    d[--i] = (char)('0' + u % 10);
  while (u /= 10);
  if (signbit(units))
    d[--i] = '-';
  line l = {out, 0, cap - 1};
  put(&l, d + i, sizeof d - (size_t)i);
  out[l.len] = 0;
  return l.len;
}

/* seconds as whole microseconds, as "%.0f" of seconds * 1e6 writes it. */
static void put_us(line *l, double seconds) {
  char t[400];
  put(l, t, attnd_fmt_fixed(t, sizeof t, seconds * 1e6, 0));
}

/* n as at least width digits, zero-padded. */
static void put_padded(line *l, long n, int width) {
  char d[24];
  int i = (int)sizeof d;
  unsigned long v = n < 0 ? 0 : (unsigned long)n;
  do
    d[--i] = (char)('0' + v % 10);
  while ((v /= 10) || (int)sizeof d - i < width);
  put(l, d + i, sizeof d - (size_t)i);
}

void attnd_log_time(char *out, size_t cap) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  /* strftime's "%Y-%m-%dT%H:%M:%S" and ".%06ldZ", by hand */
  char t[64];
  line l = {t, 0, sizeof t};
  put_int(&l, (long long)tm.tm_year + 1900);
  put(&l, "-", 1);
  put_padded(&l, tm.tm_mon + 1, 2);
  put(&l, "-", 1);
  put_padded(&l, tm.tm_mday, 2);
  put(&l, "T", 1);
  put_padded(&l, tm.tm_hour, 2);
  put(&l, ":", 1);
  put_padded(&l, tm.tm_min, 2);
  put(&l, ":", 1);
  put_padded(&l, tm.tm_sec, 2);
  put(&l, ".", 1);
  put_padded(&l, ts.tv_nsec / 1000, 6);
  put(&l, "Z", 1);
  if (!cap)
    return;
  size_t n = l.len < cap - 1 ? l.len : cap - 1;
  memcpy(out, t, n);
  out[n] = 0;
}

/* The start every JSON line shares: {"ts": ..., "level": ... */
static void json_head(attn_sbuf *b, attnd_level level) {
  char ts[48];
  attnd_log_time(ts, sizeof ts);
  attn_sbuf_printf(b, "{\"ts\": \"%s\", \"level\": \"%s\"", ts, level);
}

/* Writes a finished line whole, under the log lock. */
static void write_line(attnd_server *s, const char *p, size_t len) {
  pthread_mutex_lock(&s->log_mu);
  fwrite(p, 1, len, stderr);
  pthread_mutex_unlock(&s->log_mu);
}

static void emit(attnd_server *s, attn_sbuf *b) {
  if (!b->oom)
    write_line(s, b->p, b->len);
  free(b->p);
}

/* A client's string, escaped for a log line (attn_quote), as a JSON value. */
static void json_field(attn_sbuf *b, const char *key, const char *value) {
  char esc[600];
  attn_quote(esc, sizeof esc, value, strlen(value));
  attn_sbuf_printf(b, ", \"%s\": ", key);
  attn_sbuf_json_str(b, esc);
}

void attnd_log_note(attnd_server *s, attnd_level level, const char *source, const char *id,
                    const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  attn_sbuf b = {0};
  if (!s->cfg->log_json) {
    attn_sbuf_printf(&b, "attnd: %s%s%s\n", source ? source : "", source ? ": " : "", msg);
  } else {
    json_head(&b, level);
    if (source)
      json_field(&b, "source", source);
    if (id)
      json_field(&b, "request_id", id);
    attn_sbuf_puts(&b, ", \"message\": "); /* escaped for a log by the caller */
    attn_sbuf_json_str(&b, msg);
    attn_sbuf_puts(&b, "}\n");
  }
  emit(s, &b);
}

static attnd_level level_of(int status) {
  return status >= 500 ? ATTND_ERROR : status >= 400 ? ATTND_WARN : ATTND_INFO;
}

/* The numbers of a request line, as ", \"key\": value" (JSON) or " key=value"
 * (text). */
static void put_numbers(line *l, const attnd_req *r, bool json, double queue, double compute,
                        double total) {
  const char *keys[2][5] = {{" in=", " out=", " queue_us=", " compute_us=", " total_us="},
                            {", \"bytes_in\": ", ", \"bytes_out\": ", ", \"queue_us\": ",
                             ", \"compute_us\": ", ", \"total_us\": "}};
  const char *const *k = keys[json];
  puts_(l, k[0]);
  put_u64(l, r->len);
  puts_(l, k[1]);
  put_u64(l, (unsigned long long)r->bytes_out);
  puts_(l, k[2]);
  put_us(l, queue);
  puts_(l, k[3]);
  put_us(l, compute);
  puts_(l, k[4]);
  put_us(l, total);
}

/* The JSON request line; "key" (the key's name, null for none) only on a
 * server with keys. */
static void log_request_json(attnd_server *s, const attnd_req *r, const char *id, double queue,
                             double compute, double total) {
  char nums[256];
  attn_sbuf b = {0};
  json_head(&b, level_of(r->status));
  json_field(&b, "request_id", id);
  json_field(&b, "method", r->method);
  json_field(&b, "path", r->path);
  if (r->model[0])
    json_field(&b, "model", r->model);
  json_field(&b, "client", r->client[0] ? r->client : "-");
  if (s->cfg->keys.n && r->tenant[0])
    json_field(&b, "key", r->tenant);
  else if (s->cfg->keys.n)
    attn_sbuf_puts(&b, ", \"key\": null");
  line l = {nums, 0, sizeof nums};
  puts_(&l, ", \"status\": ");
  put_int(&l, r->status);
  put_numbers(&l, r, true, queue, compute, total);
  put(&l, "}\n", 2);
  attn_sbuf_put(&b, nums, l.len);
  emit(s, &b);
}

void attnd_log_request(attnd_server *s, const attnd_req *r, double total) {
  double queue = r->t_started > 0 ? r->t_started - r->t_admitted : 0;
  double compute = r->t_done > 0 && r->t_started > 0 ? r->t_done - r->t_started : 0;
  const char *id = r->id[0] ? r->id : "-";
  if (s->cfg->log_json) {
    log_request_json(s, r, id, queue, compute, total);
    return;
  }
  /* text: on the stack, without the heap: the most it holds is some 1080
   * bytes (quoted method and path, a key's name, an id of ATTND_REQID_MAX) */
  char method[80], path[560], text[1280];
  attn_quote(method, sizeof method, r->method, strlen(r->method));
  attn_quote(path, sizeof path, r->path, strlen(r->path));
  line l = {text, 0, sizeof text};
  puts_(&l, "attnd: ");
  puts_(&l, method);
  put(&l, " ", 1);
  puts_(&l, path);
  put(&l, " ", 1);
  put_int(&l, r->status);
  put_numbers(&l, r, false, queue, compute, total);
  puts_(&l, " client="); /* an address: nothing in it to quote */
  puts_(&l, r->client[0] ? r->client : "-");
  if (s->cfg->keys.n) { /* the key's name, never the key; "-": none (a 401, an open route) */
    puts_(&l, " key=");
    puts_(&l, r->tenant[0] ? r->tenant : "-");
  }
  puts_(&l, " id=");
  puts_(&l, id);
  put(&l, "\n", 1);
  write_line(s, text, l.len);
}

void attnd_log_ended(attnd_server *s, const attnd_req *r) {
  double total = attn_now() - r->t_received;
  int series = attnd_req_series(r);
  if (series >= 0) /* its route's series, by its handle */
    attnd_metrics_request_series(s->metrics, series, r->model, r->status, total, r->len,
                                 r->bytes_out);
  else
    attnd_metrics_request_model(s->metrics, attnd_req_route_label(r), r->model, r->status, total,
                                r->len, r->bytes_out);
  if (r->tenant[0])
    attnd_metrics_request_key(s->metrics, r->tenant);
  attnd_log_request(s, r, total);
}
