/*
 * log.c — request lines and notes, as text or JSON (log.h).
 */
#include "log.h"
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void attnd_log_time(char *out, size_t cap) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, cap, "%s.%06ldZ", day, ts.tv_nsec / 1000);
}

/* The start every JSON line shares: {"ts": ..., "level": ... */
static void json_head(attn_sbuf *b, attnd_level level) {
  char ts[48];
  attnd_log_time(ts, sizeof ts);
  attn_sbuf_printf(b, "{\"ts\": \"%s\", \"level\": \"%s\"", ts, level);
}

/* Writes a finished line whole, under the log lock. */
static void emit(attnd_server *s, attn_sbuf *b) {
  if (!b->oom) {
    pthread_mutex_lock(&s->log_mu);
    fwrite(b->p, 1, b->len, stderr);
    pthread_mutex_unlock(&s->log_mu);
  }
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

void attnd_log_request(attnd_server *s, const attnd_req *r, double total) {
  double queue = r->t_started > 0 ? r->t_started - r->t_admitted : 0;
  double compute = r->t_done > 0 && r->t_started > 0 ? r->t_done - r->t_started : 0;
  const char *id = r->id[0] ? r->id : "-";
  attn_sbuf b = {0};
  if (s->cfg->log_json) {
    json_head(&b, level_of(r->status));
    json_field(&b, "request_id", id);
    json_field(&b, "method", r->method);
    json_field(&b, "path", r->path);
    if (r->model[0])
      json_field(&b, "model", r->model);
    attn_sbuf_printf(&b,
                     ", \"status\": %d, \"bytes_in\": %zu, \"bytes_out\": %llu, "
                     "\"queue_us\": %.0f, \"compute_us\": %.0f, \"total_us\": %.0f}\n",
                     r->status, r->len, (unsigned long long)r->bytes_out, queue * 1e6,
                     compute * 1e6, total * 1e6);
  } else {
    char method[80], path[560];
    attn_quote(method, sizeof method, r->method, strlen(r->method));
    attn_quote(path, sizeof path, r->path, strlen(r->path));
    attn_sbuf_printf(&b,
                     "attnd: %s %s %d in=%zu out=%llu queue_us=%.0f compute_us=%.0f "
                     "total_us=%.0f id=%s\n",
                     method, path, r->status, r->len, (unsigned long long)r->bytes_out, queue * 1e6,
                     compute * 1e6, total * 1e6, id);
  }
  emit(s, &b);
}

void attnd_log_ended(attnd_server *s, const attnd_req *r) {
  double total = attn_now() - r->t_received;
  attnd_metrics_request_model(s->metrics, attnd_req_route_label(r), r->model, r->status, total,
                              r->len, r->bytes_out);
  attnd_log_request(s, r, total);
}
