/* harness_prom.c — see harness_prom.h. */
#define _GNU_SOURCE
#include "harness_prom.h"

#include "harness_http.h"
#include "harness_raw.h"
#include "harness_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Does the label block [p, e) hold key="value"? */
static bool has_label(const char *p, const char *e, const char *kv) {
  const char *eq = strchr(kv, '=');
  size_t kl = (size_t)(eq - kv);
  const char *val = eq + 1;
  while (p < e) {
    while (p < e && (*p == ',' || *p == ' '))
      p++;
    const char *k = p;
    while (p < e && *p != '=')
      p++;
    size_t klen = (size_t)(p - k);
    if (p >= e)
      return false;
    p++; /* = */
    if (*p != '"')
      return false;
    p++;
    char v[256];
    size_t vl = 0;
    while (p < e && *p != '"') {
      if (*p == '\\' && p + 1 < e)
        p++;
      if (vl < sizeof v - 1)
        v[vl++] = *p;
      p++;
    }
    v[vl] = 0;
    p++; /* closing quote */
    if (klen == kl && !strncmp(k, kv, kl) && !strcmp(v, val))
      return true;
  }
  return false;
}

double prom_sum(const char *text, const char *name, const char *const *labels, int *pn) {
  double sum = 0;
  int n = 0;
  size_t nl = strlen(name);
  for (const char *p = text; p && *p;) {
    const char *eol = strchr(p, '\n');
    if (!eol)
      eol = p + strlen(p);
    if (*p != '#' && (size_t)(eol - p) > nl && !strncmp(p, name, nl) &&
        (p[nl] == '{' || p[nl] == ' ')) {
      const char *lb = p + nl, *le = lb, *v;
      bool ok = true;
      if (*lb == '{') {
        le = memchr(lb, '}', (size_t)(eol - lb));
        if (!le)
          ok = false;
        v = le ? le + 1 : eol;
        for (int i = 0; ok && labels && labels[i]; i++)
          ok = has_label(lb + 1, le, labels[i]);
      } else {
        v = lb;
        ok = !labels || !labels[0];
      }
      if (ok) {
        sum += strtod(v, NULL);
        n++;
      }
    }
    p = *eol ? eol + 1 : eol;
  }
  if (pn)
    *pn = n;
  return sum;
}

double srv_metric(const srv *s, const char *name, const char *const *labels) {
  http_res r;
  http_req rq = {.path = "/metrics", .timeout_ms = 30000};
  double v = -1;
  if (http_do(s, &rq, &r) == 0 && r.status == 200)
    v = prom_sum(r.body, name, labels, NULL);
  http_res_free(&r);
  return v;
}

/* Polls rather than sleeping a guessed time: the machine may be loaded, so
 * only the event counts, and the deadline is there to turn a hang into a
 * failure. */
static bool wait_metric_cmp(const srv *s, const char *name, const char *const *labels, double want,
                            bool at_least, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    double v = srv_metric(s, name, labels);
    if (v >= 0 && (at_least ? v >= want : v <= want))
      return true;
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}

bool srv_wait_metric_ge(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s) {
  return wait_metric_cmp(s, name, labels, want, true, timeout_s);
}

bool srv_wait_metric_le(const srv *s, const char *name, const char *const *labels, double want,
                        double timeout_s) {
  return wait_metric_cmp(s, name, labels, want, false, timeout_s);
}

double srv_metric_reach(const srv *s, const char *name, const char *const *labels, double want) {
  srv_wait_metric_ge(s, name, labels, want, 60);
  return srv_metric(s, name, labels);
}

int srv_jobs(const srv *s) {
  double q = srv_metric(s, "attnd_queue_depth", NULL);
  double f = srv_metric(s, "attnd_inflight", NULL);
  return q < 0 || f < 0 ? -1 : (int)(q + f);
}

bool srv_wait_jobs(const srv *s, int want, bool at_least, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int n = srv_jobs(s);
    if (n >= 0 && (at_least ? n >= want : n <= want))
      return true;
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}

bool srv_wait_listener_closed(const srv *s, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int fd = raw_connect(s->port);
    if (fd < 0)
      return true;
    close(fd);
    if (now_s() >= deadline)
      return false;
    sleep_s(0.02);
  }
}
