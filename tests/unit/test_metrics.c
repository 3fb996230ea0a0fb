/*
 * test_metrics.c — the /metrics exposition: exact series for what was
 * recorded, bounded labels whatever the input, well-formed histograms and
 * text, and no lost updates when many threads record at once.
 */
#include "metrics.h"
#include "routes.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Made with the route table's labels, as attnd makes them (test_routes.c
 * holds the table to the API's list). */
static attnd_metrics *metrics_new(void) {
  const char *labels[ATTND_METRICS_MAX_ROUTES];
  return attnd_metrics_new(labels, attnd_route_labels(labels, ATTND_METRICS_MAX_ROUTES));
}

static char *render(attnd_metrics *m) {
  size_t len = 0;
  char *out = attnd_metrics_render(m, &len);
  cr_assert_not_null(out);
  cr_assert_eq(len, strlen(out), "reported length %zu, strlen %zu", len, strlen(out));
  cr_assert(len > 0 && out[len - 1] == '\n', "output must end with a newline");
  return out;
}

/* Whether `line` is one whole line of `out`. */
static int has_line(const char *out, const char *line) {
  size_t n = strlen(line);
  for (const char *p = out; (p = strstr(p, line)) != NULL; p++)
    if ((p == out || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0'))
      return 1;
  return 0;
}

#define expect_line(out, line) cr_expect(has_line(out, line), "missing line: %s", line)

/* The value of the sample whose name and labels are exactly `series`. */
static double value_of(const char *out, const char *series) {
  size_t n = strlen(series);
  for (const char *p = out; (p = strstr(p, series)) != NULL; p++)
    if ((p == out || p[-1] == '\n') && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  cr_assert_fail("no sample %s", series);
  return NAN;
}

static size_t count_prefix(const char *out, const char *prefix) {
  size_t k = 0, n = strlen(prefix);
  for (const char *p = out; *p; p = strchr(p, '\n') + 1) {
    if (strncmp(p, prefix, n) == 0)
      k++;
    if (!strchr(p, '\n'))
      break;
  }
  return k;
}

static const char *const les[] = {"0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
                                  "0.05",   "0.1",   "0.25",   "0.5",   "1",    "2.5",
                                  "5",      "10",    "30",     "60",    "+Inf"};
#define N_LES (sizeof les / sizeof les[0])

/* Checks a histogram's whole shape and returns its cumulative buckets.
 * labels: "" or `k="v",` (with the trailing comma, as it precedes le). */
static void check_histogram(const char *out, const char *name, const char *labels,
                            double want_count, double want_sum, double *cum) {
  char series[256];
  double prev = 0;
  for (size_t i = 0; i < N_LES; i++) {
    snprintf(series, sizeof series, "%s_bucket{%sle=\"%s\"}", name, labels, les[i]);
    double v = value_of(out, series);
    cr_expect(v >= prev, "%s: %g below the previous bucket %g", series, v, prev);
    prev = v;
    if (cum)
      cum[i] = v;
  }
  char bare[128];
  snprintf(bare, sizeof bare, "%.*s", (int)(strlen(labels) ? strlen(labels) - 1 : 0), labels);
  snprintf(series, sizeof series, *bare ? "%s_count{%s}" : "%s_count%s", name, bare);
  double count = value_of(out, series);
  snprintf(series, sizeof series, *bare ? "%s_sum{%s}" : "%s_sum%s", name, bare);
  double sum = value_of(out, series);
  cr_expect_eq(count, want_count, "%s _count %g, want %g", name, count, want_count);
  cr_expect_eq(prev, count, "%s +Inf bucket %g, _count %g", name, prev, count);
  cr_expect(fabs(sum - want_sum) <= 1e-9, "%s _sum %.17g, want %.17g", name, sum, want_sum);
  snprintf(series, sizeof series, "%s_bucket{%sle=", name, labels);
  cr_expect_eq(count_prefix(out, series), N_LES, "%s: wrong number of buckets", name);
}

Test(metrics, requests_by_route_and_code) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_request(m, "/attention", 200, 0.01, 100, 1000);
  attnd_metrics_request(m, "/attention", 200, 0.02, 100, 1000);
  attnd_metrics_request(m, "/attention?verbose=1", 200, 0.03, 100, 1000);
  attnd_metrics_request(m, "/attention", 429, 0.001, 50, 10);
  attnd_metrics_request(m, "/attention/plan?heads=8", 200, 0.001, 1, 2);
  attnd_metrics_request(m, "/healthz", 200, 0.0001, 0, 3);
  attnd_metrics_request(m, "/v1/info", 200, 0.0001, 0, 4);
  attnd_metrics_request(m, "/nope", 404, 0.0001, 5, 6);
  attnd_metrics_request(m, "/attention/", 404, 0.0001, 0, 0); /* not a route */
  attnd_metrics_request(m, "/Attention", 404, 0.0001, 0, 0);  /* case matters */
  attnd_metrics_request(m, NULL, 400, 0.0001, 0, 0);
  attnd_metrics_request(m, "/readyz", 42, 0.0001, 0, 0);  /* out of range */
  attnd_metrics_request(m, "/readyz", 600, 0.0001, 0, 0); /* out of range */
  attnd_metrics_request(m, "/readyz", -1, 0.0001, 0, 0);  /* out of range */
  attnd_metrics_request(m, "/readyz", 503, 0.0001, 0, 0);
  attnd_metrics_request(m, "/metrics", 599, 0.0001, 0, 0);
  attnd_metrics_request(m, "/metrics", 100, 0.0001, 0, 0);

  char *out = render(m);
  expect_line(out, "attnd_requests_total{path=\"/attention\",code=\"200\"} 3");
  expect_line(out, "attnd_requests_total{path=\"/attention\",code=\"429\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/attention/plan\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/healthz\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/v1/info\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"other\",code=\"404\"} 3");
  expect_line(out, "attnd_requests_total{path=\"other\",code=\"400\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/readyz\",code=\"0\"} 3");
  expect_line(out, "attnd_requests_total{path=\"/readyz\",code=\"503\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/metrics\",code=\"599\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/metrics\",code=\"100\"} 1");
  cr_expect_eq(count_prefix(out, "attnd_requests_total{"), 11);
  cr_expect_null(strstr(out, "nope"), "unknown path leaked into a label");
  cr_expect_null(strstr(out, "verbose"), "query string leaked into a label");
  cr_expect_null(strstr(out, "/Attention"), "unknown path leaked into a label");
  expect_line(out, "attnd_bytes_received_total 356");
  expect_line(out, "attnd_bytes_sent_total 3025");
  /* Codes come out in order within a route, whatever order they arrived. */
  const char *c100 = strstr(out, "path=\"/metrics\",code=\"100\"");
  const char *c599 = strstr(out, "path=\"/metrics\",code=\"599\"");
  cr_expect(c100 && c599 && c100 < c599, "codes out of order");
  check_histogram(out, "attnd_request_duration_seconds", "path=\"/attention\",", 4, 0.061, NULL);
  check_histogram(out, "attnd_request_duration_seconds", "path=\"other\",", 4, 0.0004, NULL);
  /* A route that saw no request has no duration series. */
  cr_expect_null(strstr(out, "attnd_request_duration_seconds_count{path=\"/healthz\"} 0"));
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, codes_past_the_table_fold_into_other) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  for (int code = 100; code < 170; code++) /* 70 distinct codes */
    attnd_metrics_request(m, "/healthz", code, 0.001, 0, 0);
  attnd_metrics_request(m, "/healthz", 169, 0.001, 0, 0);
  attnd_metrics_request(m, "/healthz", 100, 0.001, 0, 0);
  char *out = render(m);
  cr_expect_eq(count_prefix(out, "attnd_requests_total{path=\"/healthz\""), 65);
  expect_line(out, "attnd_requests_total{path=\"/healthz\",code=\"100\"} 2");
  expect_line(out, "attnd_requests_total{path=\"/healthz\",code=\"163\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/healthz\",code=\"other\"} 7");
  cr_expect_null(strstr(out, "code=\"164\""));
  check_histogram(out, "attnd_request_duration_seconds", "path=\"/healthz\",", 72, 0.072, NULL);
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, duration_buckets_are_cumulative_with_inclusive_bounds) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  const double v[] = {0.0001, 0.0005, 0.003, 0.7, 1, 60, 100};
  double sum = 0;
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    attnd_metrics_request(m, "/attention", 200, v[i], 0, 0);
    sum += v[i];
  }
  char *out = render(m);
  double cum[N_LES];
  check_histogram(out, "attnd_request_duration_seconds", "path=\"/attention\",", 7, sum, cum);
  /* le:  .0005 .001 .0025 .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10 30 60 +Inf */
  const double want[N_LES] = {2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 5, 5, 5, 5, 5, 6, 7};
  for (size_t i = 0; i < N_LES; i++)
    cr_expect_eq(cum[i], want[i], "le=%s: %g, want %g", les[i], cum[i], want[i]);
  expect_line(out, "attnd_request_duration_seconds_bucket{path=\"/attention\",le=\"0.0005\"} 2");
  expect_line(out, "attnd_request_duration_seconds_bucket{path=\"/attention\",le=\"+Inf\"} 7");
  expect_line(out, "attnd_request_duration_seconds_count{path=\"/attention\"} 7");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, queue_wait_histogram) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char *out = render(m);
  check_histogram(out, "attnd_queue_wait_seconds", "", 0, 0, NULL);
  expect_line(out, "attnd_queue_wait_seconds_sum 0");
  free(out);

  double sum = 0;
  for (int i = 0; i < 1000; i++) {
    double w = i / 1e4; /* i = 5 is exactly the bound 0.0005 */
    attnd_metrics_queue_wait(m, w);
    sum += w;
  }
  out = render(m);
  double cum[N_LES];
  check_histogram(out, "attnd_queue_wait_seconds", "", 1000, sum, cum);
  cr_expect_eq(cum[0], 6);   /* 0 .. 0.0005 */
  cr_expect_eq(cum[4], 101); /* 0 .. 0.01 */
  cr_expect_eq(cum[7], 1000);
  expect_line(out, "attnd_queue_wait_seconds_count 1000");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, bad_durations_count_as_zero) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_queue_wait(m, NAN);
  attnd_metrics_queue_wait(m, -1);
  attnd_metrics_queue_wait(m, INFINITY);
  attnd_metrics_queue_wait(m, 0.25);
  char *out = render(m);
  double cum[N_LES];
  check_histogram(out, "attnd_queue_wait_seconds", "", 4, 0.25, cum);
  cr_expect_eq(cum[0], 3);
  free(out);
  attnd_metrics_free(m);
}

/* A job on the HTTP thread: counted, and its (no) wait in the histogram. */
Test(metrics, jobs_on_the_http_thread_are_counted_and_waited_nothing) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char *out = render(m);
  expect_line(out, "attnd_jobs_on_http_thread_total 0");
  free(out);
  for (int i = 0; i < 3; i++)
    attnd_metrics_tiny(m);
  attnd_metrics_queue_wait(m, 0.25);
  out = render(m);
  expect_line(out, "attnd_jobs_on_http_thread_total 3");
  double cum[N_LES];
  check_histogram(out, "attnd_queue_wait_seconds", "", 4, 0.25, cum);
  cr_expect_eq(cum[0], 3, "the three waited nothing");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, engine_counters_by_backend) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_engine(m, "cpu", 0.5, 1e9);
  attnd_metrics_engine(m, "cuda", 0.125, 2.5e12);
  attnd_metrics_engine(m, "cpu", 0.25, 3e9);
  attnd_metrics_engine(m, "cuda", 0.125, 0.5e12);
  attnd_metrics_engine(m, "cpu", -1, NAN); /* counters never go down */
  attnd_metrics_engine(m, "cpu", 0.1, 0.1);
  char *out = render(m);
  expect_line(out, "attnd_engine_seconds_total{backend=\"cuda\"} 0.25");
  expect_line(out, "attnd_flops_total{backend=\"cpu\"} 4000000000.1");
  expect_line(out, "attnd_flops_total{backend=\"cuda\"} 3000000000000");
  cr_expect(fabs(value_of(out, "attnd_engine_seconds_total{backend=\"cpu\"}") - 0.85) < 1e-12);
  cr_expect_eq(count_prefix(out, "attnd_engine_seconds_total{"), 2);
  cr_expect_eq(count_prefix(out, "attnd_flops_total{"), 2);
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, backends_past_eight_fold_into_other) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char name[16];
  for (int i = 0; i < 11; i++) {
    snprintf(name, sizeof name, "b%d", i);
    attnd_metrics_engine(m, name, 1, 10);
  }
  char *out = render(m);
  cr_expect_eq(count_prefix(out, "attnd_engine_seconds_total{"), 9);
  cr_expect_eq(count_prefix(out, "attnd_flops_total{"), 9);
  expect_line(out, "attnd_engine_seconds_total{backend=\"b7\"} 1");
  expect_line(out, "attnd_engine_seconds_total{backend=\"other\"} 3");
  expect_line(out, "attnd_flops_total{backend=\"other\"} 30");
  cr_expect_null(strstr(out, "\"b8\""));
  free(out);
  attnd_metrics_free(m);

  /* A real backend called "other" takes the overflow: one series, not two. */
  m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_engine(m, "other", 1, 1);
  for (int i = 0; i < 9; i++) {
    snprintf(name, sizeof name, "b%d", i);
    attnd_metrics_engine(m, name, 1, 1);
  }
  out = render(m);
  cr_expect_eq(count_prefix(out, "attnd_engine_seconds_total{"), 8);
  expect_line(out, "attnd_engine_seconds_total{backend=\"other\"} 3");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, label_values_are_escaped) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_engine(m, "we\"ird\\name\nx", 2, 4);
  char *out = render(m);
  expect_line(out, "attnd_engine_seconds_total{backend=\"we\\\"ird\\\\name\\nx\"} 2");
  expect_line(out, "attnd_flops_total{backend=\"we\\\"ird\\\\name\\nx\"} 4");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, gauges) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_QUEUE_DEPTH, 3);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_QUEUE_DEPTH, -1);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_CONNECTIONS, 5);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_CONNECTIONS, -5);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_INFLIGHT, -1); /* not clamped */
  cr_expect_eq(attnd_metrics_gauge(m, ATTND_GAUGE_QUEUE_DEPTH), 2);
  cr_expect_eq(attnd_metrics_gauge(m, ATTND_GAUGE_CONNECTIONS), 0);
  cr_expect_eq(attnd_metrics_gauge(m, ATTND_GAUGE_INFLIGHT), -1);
  char *out = render(m);
  expect_line(out, "attnd_queue_depth 2");
  expect_line(out, "attnd_connections 0");
  expect_line(out, "attnd_inflight -1");
  free(out);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_INFLIGHT, INT64_C(1) << 40);
  cr_expect_eq(attnd_metrics_gauge(m, ATTND_GAUGE_INFLIGHT), (INT64_C(1) << 40) - 1);
  attnd_metrics_free(m);
}

Test(metrics, errors_by_code) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char *out = render(m);
  cr_expect_eq(count_prefix(out, "attnd_errors_total{"), 0);
  free(out);
  attnd_metrics_error(m, "queue_full");
  attnd_metrics_error(m, "not_found");
  attnd_metrics_error(m, "queue_full");
  attnd_metrics_error(m, NULL); /* ignored */
  out = render(m);
  expect_line(out, "attnd_errors_total{code=\"queue_full\"} 2");
  expect_line(out, "attnd_errors_total{code=\"not_found\"} 1");
  cr_expect_eq(count_prefix(out, "attnd_errors_total{"), 2);
  free(out);
  /* the label set is bounded: codes past the table fold into "other" */
  static char names[70][8];
  for (int i = 0; i < 70; i++) {
    snprintf(names[i], sizeof names[i], "c%d", i);
    attnd_metrics_error(m, names[i]);
  }
  out = render(m);
  cr_expect_eq(count_prefix(out, "attnd_errors_total{"), 65);
  expect_line(out, "attnd_errors_total{code=\"other\"} 8");
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, every_family_has_help_and_type) {
  static const struct {
    const char *name, *type;
  } fam[] = {
      {"attnd_requests_total", "counter"},
      {"attnd_request_duration_seconds", "histogram"},
      {"attnd_queue_wait_seconds", "histogram"},
      {"attnd_jobs_on_http_thread_total", "counter"},
      {"attnd_engine_seconds_total", "counter"},
      {"attnd_flops_total", "counter"},
      {"attnd_queue_depth", "gauge"},
      {"attnd_inflight", "gauge"},
      {"attnd_connections", "gauge"},
      {"attnd_uploads", "gauge"},
      {"attnd_jobs_canceled_total", "counter"},
      {"attnd_errors_total", "counter"},
      {"attnd_bytes_received_total", "counter"},
      {"attnd_bytes_sent_total", "counter"},
  };
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  for (int pass = 0; pass < 2; pass++) {
    char *out = render(m);
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
      char line[128];
      snprintf(line, sizeof line, "# TYPE %s %s", fam[i].name, fam[i].type);
      expect_line(out, line);
      snprintf(line, sizeof line, "# TYPE %s ", fam[i].name);
      cr_expect_eq(count_prefix(out, line), 1, "%s typed more than once", fam[i].name);
      snprintf(line, sizeof line, "# HELP %s ", fam[i].name);
      cr_expect_eq(count_prefix(out, line), 1, "HELP for %s", fam[i].name);
    }
    cr_expect_eq(count_prefix(out, "# TYPE "), sizeof fam / sizeof fam[0]);
    free(out);
    attnd_metrics_request(m, "/attention", 200, 0.1, 1, 1);
    attnd_metrics_queue_wait(m, 0.1);
    attnd_metrics_engine(m, "cpu", 0.1, 1);
  }
  attnd_metrics_free(m);
}

/* ---- the text grammar ----------------------------------------------------- */

static const char *scan_name(const char *p) {
  if (!(isalpha((unsigned char)*p) || *p == '_' || *p == ':'))
    return NULL;
  while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
    p++;
  return p;
}

/* Returns NULL, with why, if the line is not a comment or a sample; for a
 * sample sets its metric name into name. */
static const char *check_line(const char *line, char *name, size_t name_cap) {
  name[0] = '\0';
  if (line[0] == '#') {
    if (strncmp(line, "# HELP ", 7) && strncmp(line, "# TYPE ", 7))
      return "comment is neither HELP nor TYPE";
    const char *e = scan_name(line + 7);
    if (!e || (*e != ' '))
      return "bad metric name in comment";
    if (line[2] == 'T' && strcmp(e + 1, "counter") && strcmp(e + 1, "gauge") &&
        strcmp(e + 1, "histogram") && strcmp(e + 1, "summary") && strcmp(e + 1, "untyped"))
      return "bad type";
    return line;
  }
  const char *p = scan_name(line);
  if (!p)
    return "bad metric name";
  snprintf(name, name_cap, "%.*s", (int)(p - line), line);
  if (*p == '{') {
    p++;
    while (*p != '}') {
      const char *e = scan_name(p);
      if (!e || e[0] != '=' || e[1] != '"')
        return "bad label name";
      if (*p == ':')
        return "label name with a colon";
      p = e + 2;
      while (*p != '"') {
        if (*p == '\0')
          return "unterminated label value";
        if (*p == '\\') {
          if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
            return "bad escape";
          p++;
        }
        p++;
      }
      p++;
      if (*p == ',')
        p++;
      else if (*p != '}')
        return "labels not separated by commas";
    }
    p++;
  }
  if (*p != ' ')
    return "no space before the value";
  p++;
  if (!strcmp(p, "+Inf") || !strcmp(p, "-Inf") || !strcmp(p, "NaN"))
    return line;
  char *end;
  strtod(p, &end);
  if (end == p || *end != '\0' || isspace((unsigned char)*p))
    return "bad value";
  return line;
}

static void check_grammar(const char *out) {
  char family[128] = "", type[16] = "";
  const char *p = out;
  int lineno = 0;
  while (*p) {
    const char *nl = strchr(p, '\n');
    cr_assert_not_null(nl, "last line unterminated");
    char line[512], name[128];
    cr_assert_lt((size_t)(nl - p), sizeof line);
    snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
    lineno++;
    const char *why = check_line(line, name, sizeof name);
    cr_expect_eq(why, line, "line %d \"%s\": %s", lineno, line, why == line ? "" : why);
    if (!strncmp(line, "# TYPE ", 7))
      sscanf(line + 7, "%127s %15s", family, type);
    /* Samples sit under their family's TYPE, all together. */
    if (name[0]) {
      size_t fl = strlen(family);
      int ok = !strcmp(name, family);
      if (!strcmp(type, "histogram"))
        ok = !strncmp(name, family, fl) &&
             (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
              !strcmp(name + fl, "_count"));
      cr_expect(ok, "line %d: %s outside its family (under %s)", lineno, name, family);
    }
    p = nl + 1;
  }
}

Test(metrics, output_follows_the_exposition_grammar) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char *out = render(m);
  check_grammar(out);
  free(out);
  attnd_metrics_request(m, "/attention?a=\"b\"\n", 200, 0.003, 10, 20);
  attnd_metrics_request(m, "/weird\"path\\\n", 404, 1e-7, 1, 2);
  attnd_metrics_request(m, "/readyz", 1000, 12.5, 0, 0);
  attnd_metrics_queue_wait(m, 0.3);
  attnd_metrics_engine(m, "cpu", 1e-300, 1e300);
  attnd_metrics_engine(m, "a\"\\\n{}=,# ", 1, 1);
  attnd_metrics_gauge_add(m, ATTND_GAUGE_INFLIGHT, INT64_MIN);
  out = render(m);
  check_grammar(out);
  free(out);
  attnd_metrics_free(m);
}

/* ---- concurrency ----------------------------------------------------------- */

enum { N_THREADS = 8, PER_THREAD = 10000 };

typedef struct worker_arg {
  attnd_metrics *m;
  int id;
} worker_arg;

static const char *const worker_paths[] = {"/attention", "/healthz", "/nope?x=1"};

static void *worker(void *p) {
  worker_arg *a = p;
  char backend[8];
  snprintf(backend, sizeof backend, "be%d", a->id % 2);
  for (int i = 0; i < PER_THREAD; i++) {
    attnd_metrics_gauge_add(a->m, ATTND_GAUGE_INFLIGHT, 1);
    attnd_metrics_request(a->m, worker_paths[a->id % 3], i % 2 ? 200 : 503, 0.25, 3, 5);
    attnd_metrics_queue_wait(a->m, 0.5);
    attnd_metrics_engine(a->m, backend, 0.125, 2);
    attnd_metrics_gauge_add(a->m, ATTND_GAUGE_INFLIGHT, -1);
    attnd_metrics_gauge_add(a->m, ATTND_GAUGE_CONNECTIONS, 1);
  }
  return NULL;
}

static void *scraper(void *p) {
  for (int i = 0; i < 50; i++)
    free(attnd_metrics_render(p, NULL));
  return NULL;
}

Test(metrics, concurrent_recording_loses_nothing) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  pthread_t t[N_THREADS], s;
  worker_arg args[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) {
    args[i] = (worker_arg){m, i};
    cr_assert_eq(pthread_create(&t[i], NULL, worker, &args[i]), 0);
  }
  cr_assert_eq(pthread_create(&s, NULL, scraper, m), 0);
  for (int i = 0; i < N_THREADS; i++)
    pthread_join(t[i], NULL);
  pthread_join(s, NULL);

  char *out = render(m);
  /* Threads 0,3,6 -> /attention; 1,4,7 -> /healthz; 2,5 -> other. */
  const char *route[] = {"/attention", "/healthz", "other"};
  const int threads[] = {3, 3, 2};
  char series[128];
  for (int r = 0; r < 3; r++) {
    double half = threads[r] * PER_THREAD / 2.0;
    snprintf(series, sizeof series, "attnd_requests_total{path=\"%s\",code=\"200\"}", route[r]);
    cr_expect_eq(value_of(out, series), half, "%s", series);
    snprintf(series, sizeof series, "attnd_requests_total{path=\"%s\",code=\"503\"}", route[r]);
    cr_expect_eq(value_of(out, series), half, "%s", series);
    snprintf(series, sizeof series, "path=\"%s\",", route[r]);
    check_histogram(out, "attnd_request_duration_seconds", series, 2 * half, 0.25 * 2 * half, NULL);
  }
  const double total = (double)N_THREADS * PER_THREAD;
  check_histogram(out, "attnd_queue_wait_seconds", "", total, 0.5 * total, NULL);
  expect_line(out, "attnd_bytes_received_total 240000");
  expect_line(out, "attnd_bytes_sent_total 400000");
  expect_line(out, "attnd_engine_seconds_total{backend=\"be0\"} 5000");
  expect_line(out, "attnd_engine_seconds_total{backend=\"be1\"} 5000");
  expect_line(out, "attnd_flops_total{backend=\"be0\"} 80000");
  expect_line(out, "attnd_flops_total{backend=\"be1\"} 80000");
  expect_line(out, "attnd_inflight 0");
  expect_line(out, "attnd_connections 80000");
  cr_expect_eq(attnd_metrics_gauge(m, ATTND_GAUGE_CONNECTIONS), 80000);
  check_grammar(out);
  free(out);
  attnd_metrics_free(m);
}

Test(metrics, free_null_is_a_no_op) { attnd_metrics_free(NULL); }

/* A model label only where a route served one; 15 (path, model) pairs,
 * then model="other"; a hostile model name is escaped. */
Test(metrics, model_label_where_it_applies) {
  attnd_metrics *m = metrics_new();
  attnd_metrics_request_model(m, "/attention", NULL, 200, 0.001, 1, 1);
  attnd_metrics_request_model(m, "/attention", "", 200, 0.001, 1, 1);
  attnd_metrics_request_model(m, "/attention", "attention", 200, 0.001, 1, 1);
  attnd_metrics_request_model(m, "/attention", "attention", 422, 0.001, 1, 1);
  attnd_metrics_request_model(m, "/attention", "attention_fp16", 200, 0.001, 1, 1);
  attnd_metrics_request_model(m, "/healthz", "a\"b\\c\nd", 200, 0.001, 1, 1);
  char name[32];
  for (int i = 0; i < 40; i++) {
    snprintf(name, sizeof name, "m%d", i);
    attnd_metrics_request_model(m, "/metrics", name, 200, 0.001, 1, 1);
  }
  attnd_metrics_request_model(m, "/v1/info", "late", 200, 0.001, 1, 1);
  char *out = render(m);
  expect_line(out, "attnd_requests_total{path=\"/attention\",code=\"200\"} 2");
  expect_line(out, "attnd_requests_total{path=\"/attention\",model=\"attention\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/attention\",model=\"attention\",code=\"422\"} 1");
  expect_line(out,
              "attnd_requests_total{path=\"/attention\",model=\"attention_fp16\",code=\"200\"} 1");
  expect_line(out,
              "attnd_request_duration_seconds_count{path=\"/attention\",model=\"attention\"} 2");
  expect_line(out,
              "attnd_requests_total{path=\"/healthz\",model=\"a\\\"b\\\\c\\nd\",code=\"200\"} 1");
  /* 3 pairs before: m0..m11 take the other 12 of 15, m12.. fold into other */
  expect_line(out, "attnd_requests_total{path=\"/metrics\",model=\"m11\",code=\"200\"} 1");
  cr_expect(!strstr(out, "model=\"m12\""), "past 15 pairs a model must fold into other");
  expect_line(out, "attnd_requests_total{path=\"/metrics\",model=\"other\",code=\"200\"} 28");
  /* no slot left even for other: the request still counts, under its path */
  expect_line(out, "attnd_requests_total{path=\"/v1/info\",code=\"200\"} 1");
  free(out);
  attnd_metrics_free(m);
}

/* The routes' series are the labels the metrics were made with; any other
 * path is "other", and a list longer than the metrics keep is refused. */
Test(metrics, the_series_are_the_labels_given) {
  static const char *const two[] = {"/a", "/b"};
  attnd_metrics *m = attnd_metrics_new(two, 2);
  cr_assert_not_null(m);
  attnd_metrics_request(m, "/b?x=1", 200, 0.01, 0, 0);
  attnd_metrics_request(m, "/attention", 200, 0.01, 0, 0);
  char *out = render(m);
  expect_line(out, "attnd_requests_total{path=\"/b\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"other\",code=\"200\"} 1");
  cr_expect_null(strstr(out, "path=\"/attention\""));
  free(out);
  attnd_metrics_free(m);
  /* by handle: the place of the label; any other number is "other" */
  m = attnd_metrics_new(two, 2);
  cr_assert_not_null(m);
  attnd_metrics_request_series(m, 1, NULL, 200, 0.01, 0, 0);
  attnd_metrics_request_series(m, 1, "x", 200, 0.01, 0, 0);
  attnd_metrics_request_series(m, 2, NULL, 200, 0.01, 0, 0);
  attnd_metrics_request_series(m, -1, NULL, 200, 0.01, 0, 0);
  out = render(m);
  expect_line(out, "attnd_requests_total{path=\"/b\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"/b\",model=\"x\",code=\"200\"} 1");
  expect_line(out, "attnd_requests_total{path=\"other\",code=\"200\"} 2");
  cr_expect_null(strstr(out, "path=\"/a\",code"));
  free(out);
  attnd_metrics_free(m);
  const char *many[ATTND_METRICS_MAX_ROUTES + 1];
  for (int i = 0; i <= ATTND_METRICS_MAX_ROUTES; i++)
    many[i] = "/x";
  cr_expect_null(attnd_metrics_new(many, ATTND_METRICS_MAX_ROUTES + 1));
}

/* The per-key counter: one series per name given, from 0, none without
 * keys; a name not given is not counted (the set stays the one fixed at
 * start-up). */
Test(metrics, requests_by_key_name) {
  attnd_metrics *m = metrics_new();
  cr_assert_not_null(m);
  char *out = render(m);
  cr_expect(!strstr(out, "attnd_requests_by_key_total"), "a keyless server has no such family");
  free(out);
  const char *names[] = {"alice", "bob.ops"};
  cr_assert_eq(attnd_metrics_keys(m, names, 2), 0);
  out = render(m);
  expect_line(out, "# TYPE attnd_requests_by_key_total counter");
  expect_line(out, "attnd_requests_by_key_total{key=\"alice\"} 0");
  expect_line(out, "attnd_requests_by_key_total{key=\"bob.ops\"} 0");
  check_grammar(out);
  free(out);
  for (int i = 0; i < 3; i++)
    attnd_metrics_request_key(m, "bob.ops");
  attnd_metrics_request_key(m, "alice");
  attnd_metrics_request_key(m, "mallory");
  attnd_metrics_request_key(m, "");
  out = render(m);
  cr_expect_eq(value_of(out, "attnd_requests_by_key_total{key=\"alice\"}"), 1);
  cr_expect_eq(value_of(out, "attnd_requests_by_key_total{key=\"bob.ops\"}"), 3);
  cr_expect_eq(count_prefix(out, "attnd_requests_by_key_total{"), 2, "%s", out);
  free(out);
  char long_name[ATTND_METRICS_KEY_CAP + 1];
  memset(long_name, 'n', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  const char *too_long[] = {long_name};
  cr_expect_eq(attnd_metrics_keys(m, too_long, 1), -1);
  cr_expect_eq(attnd_metrics_keys(m, names, ATTND_METRICS_MAX_KEYS + 1), -1);
  attnd_metrics_free(m);
}
