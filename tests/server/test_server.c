/*
 * test_server.c — attnd's small endpoints (healthz, readyz, metrics,
 * v1/info, attention/plan), routing (404, 405), logs and the command line
 * (flags, environment fallbacks, exit statuses).
 */
#include "harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

TestSuite(server, .fini = teardown, .timeout = 60);

static cJSON *get_json(const char *path, long want_status) {
  http_res r;
  http_get(&S, path, &r);
  cr_assert_eq(r.status, want_status, "GET %s: status %ld, want %ld; body %s", path, r.status,
               want_status, r.body);
  char ct[128] = "";
  http_header(&r, "Content-Type", ct, sizeof ct);
  cr_expect(!strncasecmp(ct, "application/json", 16), "GET %s: Content-Type \"%s\"", path, ct);
  cJSON *j = cJSON_ParseWithLength(r.body, r.len);
  cr_assert(cJSON_IsObject(j), "GET %s: body is not a JSON object: %s", path, r.body);
  http_res_free(&r);
  return j;
}

static double jnum(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* ---- healthz, readyz --------------------------------------------------- */

Test(server, healthz_and_readyz) {
  srv_start(&S, NULL);
  cJSON *j = get_json("/healthz", 200);
  cr_expect_str_eq(jstr(j, "status") ? jstr(j, "status") : "(none)", "ok");
  cJSON_Delete(j);
  j = get_json("/readyz", 200);
  cr_expect_str_eq(jstr(j, "status") ? jstr(j, "status") : "(none)", "ready");
  cJSON_Delete(j);
  /* A query string does not change the route. */
  j = get_json("/healthz?verbose=1", 200);
  cJSON_Delete(j);
  cr_expect_eq(srv_stop(&S, 10), 0, "exit status after SIGTERM");
}

Test(server, sigint_exits_zero) {
  srv_start(&S, NULL);
  kill(S.pid, SIGINT);
  cr_expect_eq(srv_wait(&S, 10), 0, "exit status after SIGINT (status %d)", S.status);
}

/* ---- v1/info ------------------------------------------------------------- */

Test(server, info_fields_and_limits) {
  srv_start(&S, "--max-body", "2M", "--max-queue", "7", "--timeout", "9", "--idle-timeout", "11",
            "--max-connections", "50", "--drain-timeout", "13", "--gpu-self-check", "off",
            "--deterministic", "off", NULL);
  cJSON *j = get_json("/v1/info", 200);
  const char *ver = jstr(j, "version");
  cr_expect(ver && *ver, "version missing");
  cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backends");
  cr_assert(cJSON_IsArray(be) && cJSON_GetArraySize(be) >= 1, "backends is not a non-empty array");
  bool cpu_ok = false;
  cJSON *b;
  cJSON_ArrayForEach(b, be) {
    cr_expect(jstr(b, "name"), "backend without a name");
    cr_expect(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(b, "available")),
              "backend without a boolean available");
    cr_expect(jstr(b, "detail"), "backend without a detail string");
    cr_expect(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(b, "disabled")),
              "backend without a disabled list");
    if (jstr(b, "name") && !strcmp(jstr(b, "name"), "cpu") &&
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "available")))
      cpu_ok = true;
  }
  cr_expect(cpu_ok, "the cpu backend is not listed as available");
  cJSON *lim = cJSON_GetObjectItemCaseSensitive(j, "limits");
  cr_assert(cJSON_IsObject(lim), "limits is not an object");
  cr_expect_eq(jnum(lim, "max_body"), 2.0 * 1024 * 1024, "limits.max_body %g",
               jnum(lim, "max_body"));
  cr_expect_eq(jnum(lim, "max_queue"), 7, "limits.max_queue %g", jnum(lim, "max_queue"));
  cr_expect_eq(jnum(lim, "timeout"), 9, "limits.timeout %g", jnum(lim, "timeout"));
  cr_expect_eq(jnum(lim, "idle_timeout"), 11, "limits.idle_timeout %g", jnum(lim, "idle_timeout"));
  cr_expect_eq(jnum(lim, "max_connections"), 50, "limits.max_connections %g",
               jnum(lim, "max_connections"));
  cr_expect_eq(jnum(lim, "drain_timeout"), 13, "limits.drain_timeout %g",
               jnum(lim, "drain_timeout"));
  cJSON *build = cJSON_GetObjectItemCaseSensitive(j, "build");
  cr_expect(cJSON_IsObject(build), "build is not an object");
  cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(build, "deterministic")),
            "--deterministic off: build.deterministic should be false");
  /* --version prints the same version. */
  const char *args[] = {"--version", NULL};
  char *out = NULL, *err = NULL;
  int st = run_attnd(args, NULL, 10, &out, &err);
  cr_expect_eq(st, 0, "--version exit status %d", st);
  cr_expect(ver && out && strstr(out, ver), "--version printed \"%s\", /v1/info says \"%s\"", out,
            ver);
  free(out);
  free(err);
  cJSON_Delete(j);
}

Test(server, info_default_limits) {
  srv_start(&S, NULL);
  cJSON *j = get_json("/v1/info", 200);
  cJSON *lim = cJSON_GetObjectItemCaseSensitive(j, "limits");
  cr_assert(cJSON_IsObject(lim));
  cr_expect_eq(jnum(lim, "max_body"), 1024.0 * 1024 * 1024, "default max_body %g",
               jnum(lim, "max_body"));
  cr_expect_eq(jnum(lim, "max_queue"), 64, "default max_queue %g", jnum(lim, "max_queue"));
  /* the contract's head dims: q and k, and v */
  cr_expect_eq(jnum(lim, "max_head_dim"), 576, "max_head_dim %g", jnum(lim, "max_head_dim"));
  cr_expect_eq(jnum(lim, "max_head_dim_v"), 512, "max_head_dim_v %g", jnum(lim, "max_head_dim_v"));
  cr_expect_eq(jnum(lim, "min_upload_rate"), 1024, "default min_upload_rate %g",
               jnum(lim, "min_upload_rate"));
  cr_expect_eq(jnum(lim, "max_running"), 2, "the CPU backend's running slots %g",
               jnum(lim, "max_running"));
  cr_expect_eq(jnum(lim, "max_running_per_client"), 1, "default max_running_per_client %g",
               jnum(lim, "max_running_per_client"));
  cr_expect_eq(jnum(lim, "max_pairs"), 0, "default max_pairs %g", jnum(lim, "max_pairs"));
  cr_expect_eq(jnum(lim, "idle_timeout"), 30, "default idle_timeout %g", jnum(lim, "idle_timeout"));
  cr_expect_eq(jnum(lim, "max_connections"), 1024, "default max_connections %g",
               jnum(lim, "max_connections"));
  cr_expect_eq(jnum(lim, "drain_timeout"), 30, "default drain_timeout %g",
               jnum(lim, "drain_timeout"));
  cJSON_Delete(j);
}

/* ---- attention/plan ------------------------------------------------------ */

static void check_plan(const char *query, const attn_plan_params *pp) {
  char path[512];
  snprintf(path, sizeof path, "/attention/plan?%s", query);
  cJSON *j = get_json(path, 200);
  attn_plan pl;
  attn_status st;
  cr_assert_eq(attn_plan_compute(pp, &pl, &st), 0, "%s", st.message);
  cr_expect_eq(jnum(j, "batch"), (double)pp->batch, "%s: batch", query);
  cr_expect_eq(jnum(j, "heads_q"), (double)pp->heads_q, "%s: heads_q", query);
  cr_expect_eq(jnum(j, "heads_kv"), (double)(pp->heads_kv ? pp->heads_kv : pp->heads_q),
               "%s: heads_kv", query);
  cr_expect_eq(jnum(j, "seq_q"), (double)pp->seq_q, "%s: seq_q", query);
  cr_expect_eq(jnum(j, "seq_kv"), (double)pp->seq_kv, "%s: seq_kv", query);
  cr_expect_eq(jnum(j, "head_dim"), (double)pp->head_dim, "%s: head_dim", query);
  const char *dt = jstr(j, "dtype");
  cr_expect(dt && !strcmp(dt, attn_dtype_name(pp->dtype)), "%s: dtype %s", query, dt);
  cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "bytes");
  cJSON *ra = cJSON_GetObjectItemCaseSensitive(j, "ratios");
  cr_assert(cJSON_IsObject(by) && cJSON_IsObject(ra), "%s: bytes or ratios missing", query);
  struct {
    const char *k;
    uint64_t v;
  } f[] = {{"q", pl.q},
           {"k", pl.k},
           {"v", pl.v},
           {"o", pl.o},
           {"s", pl.s},
           {"p", pl.p},
           {"s_plus_p", pl.s_plus_p},
           {"m", pl.m},
           {"l", pl.l}};
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    cr_expect_eq(jnum(by, f[i].k), (double)f[i].v, "%s: bytes.%s is %.17g, want %llu", query,
                 f[i].k, jnum(by, f[i].k), (unsigned long long)f[i].v);
  cr_expect_eq(jnum(ra, "s_over_q"), pl.s_over_q, "%s: s_over_q %.17g, want %.17g", query,
               jnum(ra, "s_over_q"), pl.s_over_q);
  /* The workspace depends on the server's threads: per thread x threads. */
  double thr = jnum(j, "threads"), wpt = jnum(by, "workspace_per_thread");
  if (!isnan(thr) && !isnan(wpt))
    cr_expect_eq(jnum(by, "workspace"), wpt * thr, "%s: workspace", query);
  double ft = jnum(by, "flash_total"), stt = jnum(by, "standard_total");
  cr_expect_eq(stt, (double)(pl.q + pl.k + pl.v + pl.o + pl.s + pl.p), "%s: standard_total", query);
  if (!isnan(ft) && !isnan(stt))
    cr_expect(fabs(jnum(ra, "standard_over_flash") - stt / ft) <= 1e-9 * stt / ft,
              "%s: standard_over_flash", query);
  cJSON_Delete(j);
}

Test(server, plan_numbers) {
  srv_start(&S, NULL);
  /* The seed's exercise 1: S is 64 times Q. */
  cJSON *j = get_json("/attention/plan?batch=1&heads=1&seq_q=4096&head_dim=64&dtype=F32", 200);
  cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "bytes");
  cJSON *ra = cJSON_GetObjectItemCaseSensitive(j, "ratios");
  cr_expect_eq(jnum(by, "q"), 1048576, "q %g", jnum(by, "q"));
  cr_expect_eq(jnum(by, "s"), 67108864, "s %g", jnum(by, "s"));
  cr_expect_eq(jnum(by, "s_plus_p"), 134217728, "s_plus_p %g", jnum(by, "s_plus_p"));
  cr_expect_eq(jnum(ra, "s_over_q"), 64, "s_over_q %g", jnum(ra, "s_over_q"));
  cr_expect_eq(jnum(j, "seq_kv"), 4096, "seq_kv defaults to seq_q");
  cJSON_Delete(j);
  attn_plan_params p1 = {1, 1, 0, 4096, 4096, 64, ATTN_F32, 0, ATTN_FORWARD};
  check_plan("seq_q=4096&head_dim=64", &p1); /* defaults */
  attn_plan_params p2 = {2, 8, 2, 100, 300, 128, ATTN_F16, 0, ATTN_FORWARD};
  check_plan("batch=2&heads=8&heads_kv=2&seq_q=100&seq_kv=300&head_dim=128&dtype=F16", &p2);
  attn_plan_params p3 = {3, 4, 1, 1, 77, 256, ATTN_BF16, 0, ATTN_FORWARD};
  check_plan("head_dim=256&seq_kv=77&seq_q=1&heads=4&heads_kv=1&batch=3&dtype=BF16", &p3);
}

/* ?pass=backward: the backward fields match the library's plan. */
Test(server, plan_backward) {
  srv_start(&S, NULL);
  cJSON *j = get_json("/attention/plan?seq_q=512&seq_kv=1024&head_dim=32&heads=4&heads_kv=2"
                      "&dtype=BF16&pass=backward",
                      200);
  attn_plan_params pp = {.batch = 1,
                         .heads_q = 4,
                         .heads_kv = 2,
                         .seq_q = 512,
                         .seq_kv = 1024,
                         .head_dim = 32,
                         .dtype = ATTN_BF16,
                         .threads = (int)jnum(j, "threads"),
                         .pass = ATTN_BACKWARD};
  attn_plan pl;
  attn_status st;
  cr_assert_eq(attn_plan_compute(&pp, &pl, &st), 0, "%s", st.message);
  const char *pass = jstr(j, "pass");
  cr_expect(pass && !strcmp(pass, "backward"), "pass %s", pass);
  cJSON *bw = cJSON_GetObjectItemCaseSensitive(j, "backward_bytes");
  cr_assert(cJSON_IsObject(bw), "backward_bytes missing");
  struct {
    const char *k;
    uint64_t v;
  } f[] = {{"do", pl.dout}, {"dq", pl.dq},       {"dk", pl.dk},
           {"dv", pl.dv},   {"dp", pl.dp},       {"ds", pl.ds},
           {"lse", pl.lse}, {"delta", pl.delta}, {"dq_accum", pl.dq_accum}};
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    cr_expect_eq(jnum(bw, f[i].k), (double)f[i].v, "backward_bytes.%s is %.17g, want %llu", f[i].k,
                 jnum(bw, f[i].k), (unsigned long long)f[i].v);
  cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "bytes");
  cr_expect_eq(jnum(by, "standard_total"), (double)pl.standard_total);
  cr_expect_eq(jnum(by, "flash_total"), (double)pl.flash_total);
  cJSON_Delete(j);
  j = get_json("/attention/plan?seq_q=8&head_dim=8&pass=sideways", 422);
  cJSON_Delete(j);
}

Test(server, plan_errors) {
  srv_start(&S, NULL);
  struct {
    const char *q;
    long status;
    const char *code;
  } c[] = {
      {"head_dim=64", 422, "invalid_option"}, /* seq_q missing */
      {"seq_q=64", 422, "invalid_option"},    /* head_dim missing */
      {"", 422, "invalid_option"},            /* both missing */
      {"seq_q=abc&head_dim=64", 422, "invalid_option"},
      {"seq_q=64&head_dim=6.5", 422, "invalid_option"},
      {"seq_q=64&head_dim=", 422, "invalid_option"},
      {"seq_q=-4&head_dim=64", 422, NULL},
      {"seq_q=0&head_dim=64", 422, NULL},
      {"seq_q=64&head_dim=64&dtype=F64", 422, "invalid_option"},
      {"seq_q=64&head_dim=64&batch=x", 422, "invalid_option"},
      {"seq_q=64&head_dim=64&foo=1", 422, "unknown_option"},
      {"seq_q=64&head_dim=64&causal=true", 422, "unknown_option"},
      {"seq_q=64&head_dim=64&heads=6&heads_kv=4", 422, NULL},
      {"seq_q=64&head_dim=577", 422, NULL},
      {"seq_q=99999999999999999999999&head_dim=64", 422, NULL},
      {"batch=1073741824&heads=1073741824&seq_q=1073741824&head_dim=256", 413, "too_large"},
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    char path[256], what[300];
    snprintf(path, sizeof path, "/attention/plan?%s", c[i].q);
    snprintf(what, sizeof what, "GET %s", path);
    http_res r;
    http_get(&S, path, &r);
    expect_error(&r, c[i].status, c[i].code, what);
    http_res_free(&r);
  }
  expect_healthy(&S, "plan errors");
}

/* ---- routing ------------------------------------------------------------- */

static bool allow_has(const char *allow, const char *m) {
  char b[256];
  snprintf(b, sizeof b, "%s", allow);
  for (char *t = strtok(b, ", "); t; t = strtok(NULL, ", "))
    if (!strcasecmp(t, m))
      return true;
  return false;
}

Test(server, not_found_and_method_not_allowed) {
  srv_start(&S, NULL);
  /* (GET / is the web console: tests/server/test_console.c) */
  const char *paths404[] = {"/index.html", "/nope",     "/healthz/x",        "/v1",
                            "/v1/info/x",  "/metricsx", "/attention/plan/x", "/ATTENTION"};
  for (size_t i = 0; i < sizeof paths404 / sizeof *paths404; i++) {
    http_res r;
    char what[128];
    snprintf(what, sizeof what, "GET %s", paths404[i]);
    http_get(&S, paths404[i], &r);
    expect_error(&r, 404, "not_found", what);
    http_res_free(&r);
  }
  struct {
    const char *method, *path, *allow;
  } m[] = {{"GET", "/attention", "POST"},      {"DELETE", "/attention", "POST"},
           {"POST", "/healthz", "GET"},        {"PUT", "/readyz", "GET"},
           {"POST", "/metrics", "GET"},        {"DELETE", "/v1/info", "GET"},
           {"POST", "/attention/plan", "GET"}, {"OPTIONS", "/attention", "POST"}};
  for (size_t i = 0; i < sizeof m / sizeof *m; i++) {
    const char *hdrs[] = {"Content-Type: application/json", NULL};
    http_req rq = {.method = m[i].method, .path = m[i].path, .headers = hdrs};
    if (!strcmp(m[i].method, "POST") || !strcmp(m[i].method, "PUT")) {
      rq.body = "{}";
      rq.len = 2;
    }
    http_res r;
    char what[128], allow[256] = "";
    snprintf(what, sizeof what, "%s %s", m[i].method, m[i].path);
    http_do(&S, &rq, &r);
    if (!strcmp(m[i].method, "OPTIONS") && r.status != 405) {
      /* OPTIONS may be answered (204/200) with Allow; accept that too. */
      cr_expect(r.status == 200 || r.status == 204, "%s: status %ld", what, r.status);
    } else {
      expect_error(&r, 405, "method_not_allowed", what);
    }
    cr_expect(http_header(&r, "Allow", allow, sizeof allow), "%s: no Allow header", what);
    cr_expect(allow_has(allow, m[i].allow), "%s: Allow \"%s\" lacks %s", what, allow, m[i].allow);
    http_res_free(&r);
  }
  expect_healthy(&S, "404 and 405");
}

/* ---- metrics ------------------------------------------------------------- */

Test(server, metrics_after_requests) {
  srv_start(&S, NULL);
  http_res r;
  for (int i = 0; i < 3; i++) {
    http_get(&S, "/v1/info", &r);
    cr_expect_eq(r.status, 200);
    http_res_free(&r);
  }
  /* One good job (4 * B*H*Nq*Nkv*D flops = 4*1*2*64*64*32) and one refused. */
  tprob p = tprob_make(1, 2, 2, 64, 64, 32, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 7);
  size_t len;
  char *body = st_body(&c, 4, NULL, &len);
  http_post(&S, "/attention", "application/octet-stream", body, len, &r);
  expect_correct(&r, &c, 4, true, "the metrics job");
  size_t sent = len;
  http_res_free(&r);
  http_post(&S, "/attention?causal=maybe", "application/octet-stream", body, len, &r);
  expect_error(&r, 422, "invalid_option", "causal=maybe");
  sent += len;
  http_res_free(&r);
  http_get(&S, "/no-such-path-xyzzy", &r);
  cr_expect_eq(r.status, 404);
  http_res_free(&r);
  /* A request is counted as it ends, which with several HTTP threads may
   * come after its client read the reply: wait for each count first. */
  const char *info200[] = {"path=/v1/info", "code=200", NULL};
  const char *att200[] = {"path=/attention", "code=200", NULL};
  const char *att422[] = {"path=/attention", "code=422", NULL};
  const char *other[] = {"code=404", NULL};
  srv_wait_metric_ge(&S, "attnd_requests_total", info200, 3, 60);
  srv_wait_metric_ge(&S, "attnd_requests_total", att200, 1, 60);
  srv_wait_metric_ge(&S, "attnd_requests_total", att422, 1, 60);
  srv_wait_metric_ge(&S, "attnd_requests_total", other, 1, 60);

  http_get(&S, "/metrics", &r);
  cr_assert_eq(r.status, 200, "/metrics status %ld", r.status);
  char ct[128] = "";
  http_header(&r, "Content-Type", ct, sizeof ct);
  cr_expect(strstr(ct, "text/plain") && strstr(ct, "version=0.0.4"), "/metrics Content-Type \"%s\"",
            ct);
  const char *t = r.body;
  int n;
  cr_expect_eq(prom_sum(t, "attnd_requests_total", info200, &n), 3,
               "attnd_requests_total{path=\"/v1/info\",code=\"200\"} is %g (%d samples)",
               prom_sum(t, "attnd_requests_total", info200, NULL), n);
  cr_expect_eq(prom_sum(t, "attnd_requests_total", att200, NULL), 1, "attention 200 count %g",
               prom_sum(t, "attnd_requests_total", att200, NULL));
  cr_expect_eq(prom_sum(t, "attnd_requests_total", att422, NULL), 1, "attention 422 count %g",
               prom_sum(t, "attnd_requests_total", att422, NULL));
  const char *health[] = {"path=/healthz", "code=200", NULL};
  cr_expect_geq(prom_sum(t, "attnd_requests_total", health, NULL), 1, "healthz count");
  cr_expect_geq(prom_sum(t, "attnd_requests_total", other, NULL), 1, "404 count");
  cr_expect(!strstr(t, "xyzzy"), "an unknown path became a label value (unbounded series)");
  cr_expect(strstr(t, "# TYPE attnd_requests_total counter") != NULL, "no TYPE for requests_total");
  cr_expect(strstr(t, "# TYPE attnd_request_duration_seconds histogram") != NULL,
            "no TYPE histogram for request_duration_seconds");
  const char *inf[] = {"le=+Inf", NULL};
  cr_expect_geq(prom_sum(t, "attnd_request_duration_seconds_bucket", inf, &n), 5,
                "duration +Inf buckets");
  cr_expect_geq(n, 1, "no attnd_request_duration_seconds_bucket{le=\"+Inf\"}");
  cr_expect_eq(prom_sum(t, "attnd_request_duration_seconds_bucket", inf, NULL),
               prom_sum(t, "attnd_request_duration_seconds_count", NULL, NULL),
               "+Inf bucket != _count");
  prom_sum(t, "attnd_request_duration_seconds_sum", NULL, &n);
  cr_expect_geq(n, 1, "no attnd_request_duration_seconds_sum");
  cr_expect_geq(prom_sum(t, "attnd_queue_wait_seconds_count", NULL, NULL), 1,
                "queue_wait_seconds_count");
  cr_expect_gt(prom_sum(t, "attnd_engine_seconds_total", NULL, NULL), 0, "engine_seconds_total");
  double flops = prom_sum(t, "attnd_flops_total", NULL, NULL);
  cr_expect(fabs(flops - 4.0 * 2 * 64 * 64 * 32) < 1, "attnd_flops_total %g, want %g", flops,
            4.0 * 2 * 64 * 64 * 32);
  prom_sum(t, "attnd_queue_depth", NULL, &n);
  cr_expect_eq(n, 1, "attnd_queue_depth samples %d", n);
  cr_expect_eq(prom_sum(t, "attnd_queue_depth", NULL, NULL), 0, "queue depth at rest");
  cr_expect_eq(prom_sum(t, "attnd_inflight", NULL, NULL), 0, "inflight at rest");
  cr_expect_geq(prom_sum(t, "attnd_connections", NULL, &n), 1, "connections gauge");
  cr_expect_eq(n, 1, "attnd_connections samples %d", n);
  cr_expect_geq(prom_sum(t, "attnd_bytes_received_total", NULL, NULL), (double)sent,
                "bytes_received_total < the %zu body bytes sent", sent);
  cr_expect_gt(prom_sum(t, "attnd_bytes_sent_total", NULL, NULL), 0, "bytes_sent_total");
  http_res_free(&r);
  free(body);
  tcase_free(&c);
}

/* ---- logs ---------------------------------------------------------------- */

static int count_lines(const char *log, const char *needle, const char *needle2) {
  int n = 0;
  for (const char *p = log; p && *p;) {
    const char *e = strchr(p, '\n');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    char *line = strndup(p, l);
    if (strstr(line, needle) && (!needle2 || strstr(line, needle2)))
      n++;
    free(line);
    p = e ? e + 1 : p + l;
  }
  return n;
}

Test(server, one_log_line_per_request) {
  srv_start(&S, NULL);
  http_res r;
  for (int i = 0; i < 3; i++) {
    http_get(&S, "/v1/info", &r);
    http_res_free(&r);
  }
  http_get(&S, "/nope-logged", &r);
  http_res_free(&r);
  cr_expect_eq(srv_stop(&S, 10), 0);
  char *log = srv_log(&S);
  cr_expect_eq(count_lines(log, "/v1/info", "200"), 3, "log lines for GET /v1/info:\n%s", log);
  cr_expect_eq(count_lines(log, "/nope-logged", "404"), 1, "log lines for the 404:\n%s", log);
  cr_expect_eq(count_lines(log, "/v1/info", "GET"), 3, "method in the log lines");
  free(log);
}

Test(server, json_log_format) {
  srv_start(&S, "--log-format", "json", NULL);
  http_res r;
  http_get(&S, "/v1/info", &r);
  http_res_free(&r);
  cr_expect_eq(srv_stop(&S, 10), 0);
  char *log = srv_log(&S);
  int found = 0;
  for (char *p = log; p && *p;) {
    char *e = strchr(p, '\n');
    if (e)
      *e = 0;
    if (strstr(p, "/v1/info")) {
      found++;
      cJSON *j = cJSON_Parse(p);
      cr_expect(cJSON_IsObject(j), "log line is not a JSON object: %s", p);
      char *txt = cJSON_PrintUnformatted(j);
      cr_expect(txt && strstr(txt, "GET") && strstr(txt, "200"), "log line lacks GET or 200: %s",
                p);
      free(txt);
      cJSON_Delete(j);
    }
    p = e ? e + 1 : p + strlen(p);
  }
  cr_expect_eq(found, 1, "log lines for /v1/info: %d\n%s", found, log);
  free(log);
}

/* ---- the command line ---------------------------------------------------- */

static int nlines(const char *s) {
  int n = 0;
  for (; s && *s; s++)
    n += *s == '\n';
  return n;
}

Test(server, help_and_version) {
  const char *h[] = {"--help", NULL};
  char *out = NULL, *err = NULL;
  int st = run_attnd(h, NULL, 10, &out, &err);
  cr_expect_eq(st, 0, "--help exit status %d", st);
  cr_expect(out && strstr(out, "--listen") && strstr(out, "--max-body") &&
                strstr(out, "--max-queue") && strstr(out, "--timeout"),
            "--help usage lacks flags: %s", out);
  static const char *const sessions[] = {
      "--session-memory BYTES",    "ATTND_SESSION_MEMORY]",      "--session-dir DIR",
      "ATTND_SESSION_DIR]",        "--session-batch on|off",     "ATTND_SESSION_BATCH]",
      "--session-ttl-max SECONDS", "ATTND_SESSION_TTL_MAX]",     "--handover URL",
      "ATTND_HANDOVER]",           "--handover-timeout SECONDS", "ATTND_HANDOVER_TIMEOUT]"};
  for (size_t i = 0; out && i < sizeof sessions / sizeof *sessions; i++)
    cr_expect(strstr(out, sessions[i]), "--help lacks %s", sessions[i]);
  free(out);
  free(err);
  const char *v[] = {"--version", NULL};
  st = run_attnd(v, NULL, 10, &out, &err);
  cr_expect_eq(st, 0, "--version exit status %d", st);
  cr_expect(out && strlen(out) > 0, "--version printed nothing");
  free(out);
  free(err);
}

Test(server, bad_flags_exit_2_with_one_line) {
  const char *cases[][4] = {
      {"--bogus", NULL},
      {"--threads", "abc", NULL},
      {"--threads", "-1", NULL},
      {"--max-body", "12Q", NULL},
      {"--max-body", "-5", NULL},
      {"--max-queue", "0x", NULL},
      {"--timeout", "soon", NULL},
      {"--idle-timeout", "-3", NULL},
      {"--listen", "nonsense", NULL},
      {"--listen", "127.0.0.1:99999", NULL},
      {"--log-format", "xml", NULL},
      {"--backend", "tpu", NULL},
      {"--devices", "0,x", NULL},
      {"--devices", "1,1", NULL},
      {"--devices", "-1", NULL},
      {"--devices", "", NULL},
      {"--streams", "0", NULL},
      {"--http-threads", "0", NULL},
      {"--http-threads", "many", NULL},
      {"--http-threads", "", NULL},
      {"--gpu-self-check", "maybe", NULL},
      {"--deterministic", "maybe", NULL},
      {"--max-connections", "", NULL},
      {"--isa", "mmx", NULL},
      {"--cpu-tune", "zen", NULL},
      {"--isa", "", NULL},
      {"--session-memory", "12Q", NULL},
      {"--session-memory", "-1", NULL},
      {"--session-dir", "/nonexistent/attnd-sessions", NULL},
      {"--session-dir", "/etc/passwd", NULL},
      {"--session-batch", "maybe", NULL},
      {"--session-ttl-max", "0", NULL},
      {"--threads", NULL},
      {"extra-positional", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *out = NULL, *err = NULL;
    int st = run_attnd(cases[i], NULL, 5, &out, &err);
    char what[128];
    snprintf(what, sizeof what, "attnd %s %s", cases[i][0], cases[i][1] ? cases[i][1] : "");
    cr_expect_eq(st, 2, "%s: exit status %d (-1: still running after 5 s), stderr: %s", what, st,
                 err);
    cr_expect_eq(nlines(err), 1, "%s: %d stderr lines, want 1:\n%s", what, nlines(err), err);
    free(out);
    free(err);
  }
}

/* A bad boolean names the flag and the values it takes. */
Test(server, bad_deterministic_value_says_on_or_off) {
  const char *args[] = {"--deterministic", "maybe", NULL};
  char *err = NULL;
  int st = run_attnd(args, NULL, 5, NULL, &err);
  cr_expect_eq(st, 2, "exit status %d", st);
  cr_expect(err && strstr(err, "--deterministic expects on or off (got \"maybe\")"), "%s", err);
  free(err);
}

Test(server, backend_cuda_without_a_device_exits_2) {
  if (tcuda_available())
    cr_skip_test("a CUDA device is present: --backend cuda serves");
  int port = free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  const char *args[] = {"--backend", "cuda", "--listen", listen, NULL};
  char *err = NULL;
  int st = run_attnd(args, NULL, 10, NULL, &err);
  cr_expect_eq(st, 2, "exit status %d, stderr %s", st, err);
  cr_expect_eq(nlines(err), 1, "%d stderr lines:\n%s", nlines(err), err);
  cr_expect(err && strstr(err, "no CUDA device was found"), "%s", err);
  free(err);
}

Test(server, auto_without_a_device_says_it_uses_the_cpu) {
  if (tcuda_available())
    cr_skip_test("a CUDA device is present: auto picks it");
  memset(&S, 0, sizeof S);
  srv_start(&S, NULL);
  http_res rs;
  cr_assert_eq(http_get(&S, "/v1/info", &rs), 0);
  cJSON *j = cJSON_Parse(rs.body);
  cr_assert(j);
  const char *backend = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "backend"));
  cr_expect(backend && !strncmp(backend, "cpu", 3), "backend %s", backend);
  cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backends"), *b;
  bool listed = false;
  cJSON_ArrayForEach(b, be) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "name"));
    if (!name || strcmp(name, "cuda"))
      continue;
    listed = true;
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(b, "available")));
    const char *detail = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(b, "detail"));
    cr_expect(detail && (strstr(detail, "no CUDA device") || strstr(detail, "not compiled")),
              "cuda detail: %s", detail);
  }
  cr_expect(listed, "/v1/info does not list the cuda backend");
  cJSON_Delete(j);
  http_res_free(&rs);
  srv_wait_log(&S, "using the CPU", 30); /* the startup line may follow the first reply */
  char *log = srv_log(&S);
  cr_expect(log && strstr(log, "using the CPU"), "startup log: %s", log);
  free(log);
  srv_stop(&S, 10);
  srv_cleanup(&S);
}

/* The cpu backend's start-up self-check of the amx kernel, forced to fail
 * (ATTN_TEST_CPU_SELF_CHECK=fail, a test-only switch): attnd starts on the
 * avx512bf16 kernel, says why on stderr, and /v1/info and /readyz say amx
 * is disabled and why. Needs a CPU with AMX (attnd has no emulated one). */
Test(server, amx_self_check_failure_is_reported, .fini = teardown) {
  attn_engine *e = topen_isa("amx", 1); /* prints "skipped: ..." without AMX */
  if (!e)
    return;
  attn_engine_close(e);
  const char *args[] = {"--backend", "cpu", "--threads", "1", NULL};
  const char *env[] = {"ATTN_TEST_CPU_SELF_CHECK=fail", NULL};
  srv_startv(&S, args, env, true);
  cr_expect(srv_wait_log(&S, "the self-check disabled the amx kernel: o error", 30));
  cJSON *j = get_json("/v1/info", 200), *b;
  const char *detail = jstr(j, "backend");
  cr_expect(detail && strstr(detail, "avx512bf16 kernel"), "backend: %s", detail);
  bool listed = false;
  cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "backends")) {
    if (!jstr(b, "name") || strcmp(jstr(b, "name"), "cpu"))
      continue;
    const cJSON *off = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b, "disabled"), 0);
    listed = off && jstr(off, "kernel") && !strcmp(jstr(off, "kernel"), "amx") &&
             jstr(off, "why") && strstr(jstr(off, "why"), "o error");
  }
  cr_expect(listed, "/v1/info does not list amx as disabled by the cpu backend");
  cJSON_Delete(j);
  j = get_json("/readyz", 200);
  detail = jstr(j, "detail");
  cr_expect(detail && strstr(detail, "the cpu self-check disabled amx"), "readyz: %s", detail);
  cJSON_Delete(j);
  cr_expect_eq(srv_stop(&S, 10), 0);
}

Test(server, bad_env_exits_2) {
  const char *env[] = {"ATTND_MAX_QUEUE=lots", NULL};
  char *err = NULL;
  int port = free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  const char *args[] = {"--listen", listen, NULL};
  int st = run_attnd(args, env, 5, NULL, &err);
  cr_expect_eq(st, 2, "ATTND_MAX_QUEUE=lots: exit status %d, stderr %s", st, err);
  cr_expect_eq(nlines(err), 1, "%d stderr lines:\n%s", nlines(err), err);
  free(err);
}

Test(server, port_in_use_exits_2) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  cr_assert(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &al) == 0);
  char listen_arg[64];
  snprintf(listen_arg, sizeof listen_arg, "127.0.0.1:%d", ntohs(a.sin_port));
  const char *args[] = {"--listen", listen_arg, NULL};
  char *err = NULL;
  int st = run_attnd(args, NULL, 5, NULL, &err);
  cr_expect_eq(st, 2, "port in use: exit status %d, stderr %s", st, err);
  cr_expect_eq(nlines(err), 1, "port in use: %d stderr lines:\n%s", nlines(err), err);
  close(fd);
  free(err);
}

Test(server, env_fallbacks) {
  /* ATTND_LISTEN instead of --listen, ATTND_MAX_BODY instead of --max-body. */
  memset(&S, 0, sizeof S);
  S.port = free_port();
  char listen[64];
  snprintf(listen, sizeof listen, "ATTND_LISTEN=127.0.0.1:%d", S.port);
  const char *env[] = {listen, "ATTND_MAX_BODY=1K", "ATTND_MAX_QUEUE=5", NULL};
  srv_startv(&S, NULL, env, false);
  char big[2048];
  memset(big, ' ', sizeof big);
  big[0] = '{';
  big[sizeof big - 1] = '}';
  http_res r;
  http_post(&S, "/attention", "application/json", big, sizeof big, &r);
  expect_error(&r, 413, "too_large", "2 KiB body under ATTND_MAX_BODY=1K");
  http_res_free(&r);
  cJSON *j = get_json("/v1/info", 200);
  cJSON *lim = cJSON_GetObjectItemCaseSensitive(j, "limits");
  cr_expect_eq(jnum(lim, "max_body"), 1024, "limits.max_body %g", jnum(lim, "max_body"));
  cr_expect_eq(jnum(lim, "max_queue"), 5, "limits.max_queue %g", jnum(lim, "max_queue"));
  cJSON_Delete(j);
  srv_cleanup(&S);
  /* A flag wins over its environment variable. */
  memset(&S, 0, sizeof S);
  const char *env2[] = {"ATTND_MAX_BODY=1K", NULL};
  const char *args[] = {"--max-body", "1M", NULL};
  srv_startv(&S, args, env2, true);
  http_post(&S, "/attention", "application/json", big, sizeof big, &r);
  expect_error(&r, 422, "missing_tensor", "2 KiB body under --max-body 1M, ATTND_MAX_BODY=1K");
  http_res_free(&r);
}

/* --cpu-tune: /v1/info's kernel detail says "intel tuning" under intel on
 * the AVX-512 kernels (the only ones with its wide form), never under amd. */
Test(server, cpu_tune_flag_reaches_the_kernel, .fini = teardown) {
  const char *tunes[] = {"amd", "intel"};
  for (int i = 0; i < 2; i++) {
    srv_start(&S, "--cpu-tune", tunes[i], "--threads", "1", NULL);
    http_res r;
    cr_assert_eq(http_get(&S, "/v1/info", &r), 0);
    const bool wide = strstr(r.body, "\"cpu (avx512") || strstr(r.body, "\"cpu (amx kernel");
    cr_expect_eq(strstr(r.body, "intel tuning") != NULL, i == 1 && wide, "--cpu-tune %s: %s",
                 tunes[i], r.body);
    http_res_free(&r);
    cr_expect_eq(srv_stop(&S, 30), 0);
    srv_cleanup(&S);
  }
}

/* --isa picks the CPU kernel: the startup line, /v1/info and /metrics name
 * it, and requests are computed with it. generic runs on every CPU. */
Test(server, isa_flag_names_the_kernel_everywhere, .fini = teardown) {
  srv_start(&S, "--isa", "generic", "--threads", "1", NULL);
  /* the startup line may come just after /healthz first answers */
  srv_wait_log(&S, "generic kernel", 30);
  char *log = srv_log(&S);
  cr_expect(strstr(log, "generic kernel"), "startup line: %s", log);
  free(log);
  http_res r;
  cr_assert_eq(http_get(&S, "/v1/info", &r), 0);
  cr_expect(strstr(r.body, "\"cpu (generic kernel"), "%s", r.body);
  http_res_free(&r);
  cr_assert_eq(http_get(&S, "/metrics", &r), 0);
  cr_expect(strstr(r.body, "attnd_backend_info{backend=\"cpu\",detail=\"generic kernel"), "%s",
            r.body);
  http_res_free(&r);
  const char *body = "{\"q\": [[1, 0]], \"k\": [[1, 0], [0, 1]], \"v\": [[1, 2], [3, 4]]}";
  cr_assert_eq(http_post(&S, "/attention", "application/json", body, strlen(body), &r), 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  /* float64 by hand: scores (1/sqrt 2, 0), o = p0 (1, 2) + p1 (3, 4) */
  double p0 = 1 / (1 + exp(-1 / sqrt(2.0))), want[2] = {p0 + 3 * (1 - p0), 2 * p0 + 4 * (1 - p0)};
  cJSON *j = cJSON_Parse(r.body);
  const cJSON *o =
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "o"), "data");
  cr_assert_eq(cJSON_GetArraySize(o), 2, "%s", r.body);
  for (int i = 0; i < 2; i++)
    cr_expect_lt(fabs(cJSON_GetArrayItem(o, i)->valuedouble - want[i]), 1e-6, "o[%d]: %s", i,
                 r.body);
  cJSON_Delete(j);
  http_res_free(&r);
  cr_expect_eq(srv_stop(&S, 30), 0);
}
