/*
 * test_routes.c — the route table (server/routes.c) against an expectation
 * written out here: every route of the API resolves to its row, which are
 * open without a key, which compute (and their kinds' ops are whole) and
 * which pass, their metrics labels, and the 404 and 405 replies of paths and methods there are none
 * for, word for word as the API has always given them.
 */
#include "auth.h"
#include "kind.h"
#include "routes.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One route as the API documents it. */
typedef struct expected {
  const char *method, *path;
  bool open, computes;
  attn_pass pass;
  const char *label;
  const char *model; /* the /v2 model it names, or NULL */
} expected;

static const expected api[] = {
    {"POST", "/attention", false, true, ATTN_FORWARD, "/attention", NULL},
    {"POST", "/attention/backward", false, true, ATTN_BACKWARD, "/attention/backward", NULL},
    {"GET", "/attention/plan", false, false, ATTN_FORWARD, "/attention/plan", NULL},
    {"GET", "/healthz", true, false, ATTN_FORWARD, "/healthz", NULL},
    {"HEAD", "/healthz", true, false, ATTN_FORWARD, "/healthz", NULL},
    {"GET", "/readyz", true, false, ATTN_FORWARD, "/readyz", NULL},
    {"GET", "/metrics", false, false, ATTN_FORWARD, "/metrics", NULL},
    {"GET", "/v1/info", false, false, ATTN_FORWARD, "/v1/info", NULL},
    {"GET", "/", true, false, ATTN_FORWARD, "/", NULL},
    {"GET", "/console/console.css", true, false, ATTN_FORWARD, "/console/console.css", NULL},
    {"GET", "/console/console.js", true, false, ATTN_FORWARD, "/console/console.js", NULL},
    {"GET", "/v2", false, false, ATTN_FORWARD, "/v2/*", NULL},
    {"GET", "/v2/health/live", true, false, ATTN_FORWARD, "/v2/*", NULL},
    {"GET", "/v2/health/ready", true, false, ATTN_FORWARD, "/v2/*", NULL},
    {"GET", "/v2/models/attention", false, false, ATTN_FORWARD, "/v2/*", "attention"},
    {"GET", "/v2/models/attention/versions/1", false, false, ATTN_FORWARD, "/v2/*", "attention"},
    {"GET", "/v2/models/attention_fp16/ready", false, false, ATTN_FORWARD, "/v2/*",
     "attention_fp16"},
    {"GET", "/v2/models/attention_bf16/versions/1/config", false, false, ATTN_FORWARD, "/v2/*",
     "attention_bf16"},
    {"POST", "/v2/models/attention/infer", false, true, ATTN_FORWARD, "/v2/models/*/infer",
     "attention"},
    {"POST", "/v2/models/attention_fp16/versions/1/infer", false, true, ATTN_FORWARD,
     "/v2/models/*/infer", "attention_fp16"},
};

/* A server with only what routing and error replies touch. */
static attnd_server srv;
static attnd_config cfg;

static void setup(void) {
  memset(&srv, 0, sizeof srv);
  memset(&cfg, 0, sizeof cfg);
  srv.cfg = &cfg;
  const char *labels[ATTND_METRICS_MAX_ROUTES];
  srv.metrics = attnd_metrics_new(labels, attnd_route_labels(labels, ATTND_METRICS_MAX_ROUTES));
  cr_assert_not_null(srv.metrics);
  attnd_reqid_init(&srv.ids);
}

static void teardown(void) { attnd_metrics_free(srv.metrics); }

/* A request for method and path, routed. */
static attnd_req *routed(const char *method, const char *path) {
  attnd_req *r = attnd_req_new(&srv);
  cr_assert_not_null(r);
  snprintf(r->method, sizeof r->method, "%s", method);
  snprintf(r->path, sizeof r->path, "%s", path);
  attnd_route_of(r);
  return r;
}

/* The reply body holds text, JSON-escaped: each '"' as \". */
static void expect_body_says(const attnd_req *r, const char *text) {
  char want[1024];
  size_t n = 0;
  for (const char *p = text; *p && n + 2 < sizeof want; p++) {
    if (*p == '"')
      want[n++] = '\\';
    want[n++] = *p;
  }
  want[n] = 0;
  cr_assert_not_null(r->resp);
  char *body = strndup(r->resp, r->resp_len);
  cr_expect(strstr(body, want), "%s %s: the reply\n  %s\ndoes not say\n  %s", r->method, r->path,
            body, text);
  free(body);
}

TestSuite(routes, .init = setup, .fini = teardown);

Test(routes, every_route_of_the_api_resolves_to_its_row) {
  for (size_t i = 0; i < sizeof api / sizeof *api; i++) {
    const expected *e = &api[i];
    attnd_req *r = routed(e->method, e->path);
    cr_assert_not_null(r->route, "%s %s: no route", e->method, e->path);
    cr_expect(attnd_route_allows(r->route, e->method), "%s %s: refused", e->method, e->path);
    cr_expect_eq(r->route->open, e->open, "%s %s: open", e->method, e->path);
    cr_expect_eq(attnd_auth_open(e->path), e->open, "%s: auth", e->path);
    cr_expect_eq(attnd_req_computes(r), e->computes, "%s %s: computes", e->method, e->path);
    cr_expect_eq(r->route->answer == NULL, e->computes, "%s: a handler, or the loop", e->path);
    const attnd_kind *k = r->route->kind;
    cr_expect_eq(k ? k->pass : ATTN_FORWARD, e->pass, "%s: pass", e->path);
    cr_expect(!k || (k->need && k->too_large && k->decode && k->submit && k->encode &&
                     (!k->reply_header == !k->reply_value)),
              "%s: its kind lacks an op the pipeline calls", e->path);
    cr_expect_str_eq(attnd_req_route_label(r), e->label, "%s: label", e->path);
    cr_expect_eq(r->v2, !strncmp(e->path, "/v2", 3), "%s: the inference protocol's", e->path);
    cr_expect_eq(r->asset != NULL, !strcmp(e->path, "/") || !strncmp(e->path, "/console/", 9),
                 "%s: a console file", e->path);
    if (e->model) {
      cr_expect_str_eq(r->model, e->model, "%s: model", e->path);
      cr_expect_str_eq(attn_proto_v2_model_name(r->v2_model), e->model);
    } else {
      cr_expect_str_eq(r->model, "", "%s: no model", e->path);
    }
    attnd_req_unref(r);
  }
}

Test(routes, unknown_paths_are_404_with_the_routes_there_are) {
  static const char *const paths[] = {"/nope", "/attention/", "/Attention", "/healthz/",
                                      "/v1",   "/v1/info/x",  "/console/x", "/v2x"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    attnd_req *r = routed("GET", paths[i]);
    cr_expect_null(r->route, "%s", paths[i]);
    cr_expect(!attnd_auth_open(paths[i]), "%s", paths[i]);
    cr_expect_str_eq(attnd_req_route_label(r), paths[i]);
    attnd_route_not_found(r);
    cr_expect_eq(r->status, 404);
    char msg[400];
    snprintf(msg, sizeof msg,
             "no such path \"%s\" (try POST /attention, POST /attention/backward, GET "
             "/attention/plan, /healthz, /readyz, /metrics, /v1/info, /v1/sessions/..., /v2, or / "
             "for the web "
             "console)",
             paths[i]);
    expect_body_says(r, msg);
    attnd_req_unref(r);
  }
}

Test(routes, unknown_v2_paths_are_404_in_the_protocol_shape) {
  static const struct {
    const char *path, *says;
  } cases[] = {
      {"/v2/", "no such path \"/v2/\" (the inference protocol here: GET /v2, /v2/health/live, "
               "/v2/health/ready, /v2/models/{model}[/versions/1][/ready|/config], POST "
               "/v2/models/{model}[/versions/1]/infer)"},
      {"/v2/repository/index", "no such path \"/v2/repository/index\" (the inference protocol "
                               "here: GET /v2, /v2/health/live, /v2/health/ready, "
                               "/v2/models/{model}[/versions/1][/ready|/config], POST "
                               "/v2/models/{model}[/versions/1]/infer)"},
      {"/v2/models/attention/stats", "no such path \"/v2/models/attention/stats\""},
      {"/v2/models/nope/infer",
       "unknown model \"nope\" (models: attention, attention_fp16, attention_bf16)"},
      {"/v2/models/", "unknown model \"\""},
      {"/v2/models/attention/versions/2", "model \"attention\" has only version 1"},
      {"/v2/models/attention/versions/12/infer", "model \"attention\" has only version 1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attnd_req *r = routed("GET", cases[i].path);
    cr_expect_null(r->route, "%s", cases[i].path);
    cr_expect(r->v2, "%s", cases[i].path);
    cr_expect_str_eq(attnd_req_route_label(r), "/v2/*", "%s", cases[i].path);
    cr_expect_str_eq(r->model, "", "%s: no model label", cases[i].path);
    attnd_route_not_found(r);
    cr_expect_eq(r->status, 404);
    cr_expect(r->resp && !strncmp(r->resp, "{\"error\": ", 10), "%s: %.*s", cases[i].path,
              (int)r->resp_len, r->resp);
    expect_body_says(r, cases[i].says);
    attnd_req_unref(r);
  }
}

Test(routes, wrong_methods_are_405_naming_the_right_one) {
  static const struct {
    const char *method, *path, *says, *allow;
  } cases[] = {
      {"GET", "/attention", "GET is not allowed on /attention (use POST)", "POST"},
      {"DELETE", "/attention/backward", "DELETE is not allowed on /attention/backward (use POST)",
       "POST"},
      {"HEAD", "/attention", "HEAD is not allowed on /attention (use POST)", "POST"},
      {"POST", "/healthz", "POST is not allowed on /healthz (use GET)", "GET, HEAD"},
      {"PUT", "/metrics", "PUT is not allowed on /metrics (use GET)", "GET, HEAD"},
      {"POST", "/", "POST is not allowed on / (use GET)", "GET, HEAD"},
      {"GET", "/v2/models/attention/infer",
       "GET is not allowed on /v2/models/attention/infer (use POST)", "POST"},
      {"POST", "/v2/models/attention", "POST is not allowed on /v2/models/attention (use GET)",
       "GET, HEAD"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    attnd_req *r = routed(cases[i].method, cases[i].path);
    cr_assert_not_null(r->route, "%s", cases[i].path);
    cr_expect(!attnd_route_allows(r->route, cases[i].method), "%s %s", cases[i].method,
              cases[i].path);
    attnd_route_not_allowed(r);
    cr_expect_eq(r->status, 405);
    cr_expect_str_eq(attnd_route_allow(r->route), cases[i].allow);
    expect_body_says(r, cases[i].says);
    attnd_req_unref(r);
  }
  cr_expect_str_eq(attnd_route_allow(NULL), "GET, HEAD");
}

Test(routes, a_path_alone_finds_its_row) {
  int model = 7;
  const attnd_console_asset *asset = NULL;
  cr_expect_not_null(attnd_route_find("/v2/models/attention/config", &model, &asset));
  cr_expect_eq(model, attn_proto_v2_model("attention", 9));
  cr_expect_null(asset);
  cr_expect_not_null(attnd_route_find("/", &model, &asset));
  cr_expect_eq(model, -1);
  cr_expect_not_null(asset);
  cr_expect_str_eq(asset->path, "/");
  cr_expect_null(attnd_route_find("/attention?x=1", &model, NULL), "the query is not the path");
  cr_expect(attnd_route_v2("/v2") && attnd_route_v2("/v2/x") && !attnd_route_v2("/v2x"));
}

/* The series /metrics keeps: one per label, each once; the console's files
 * and unknown paths are counted as "other". */
Test(routes, the_metrics_series_are_the_tables_labels) {
  static const char *const want[] = {
      "/attention",
      "/attention/backward",
      "/attention/plan",
      "/healthz",
      "/readyz",
      "/metrics",
      "/v1/info",
      "/v1/sessions",
      "/v1/sessions/_batch",
      "/v1/sessions/{id}",
      "/v1/sessions/{id}/attention",
      "/v1/sessions/{id}/truncate",
      "/v1/sessions/{id}/fork",
      "/v1/sessions/{id}/export",
      "/v1/sessions/{id}/import",
      "/v2/*",
      "/v2/models/*/infer",
  };
  const char *got[ATTND_METRICS_MAX_ROUTES];
  int n = attnd_route_labels(got, ATTND_METRICS_MAX_ROUTES);
  cr_assert_eq(n, (int)(sizeof want / sizeof *want));
  for (int i = 0; i < n; i++)
    cr_expect_str_eq(got[i], want[i], "label %d", i);
  const char *two[2];
  cr_expect_eq(attnd_route_labels(two, 2), n, "the count, past cap");
  cr_expect_str_eq(two[1], "/attention/backward");
}

/* Each route's series handle is its label's place in that list, so the
 * metrics count it where counting by its label would. */
Test(routes, series_handles_are_the_labels_places) {
  const char *labels[ATTND_METRICS_MAX_ROUTES];
  int n = attnd_route_labels(labels, ATTND_METRICS_MAX_ROUTES);
  static const char *const paths[] = {"/attention",
                                      "/attention/backward",
                                      "/attention/plan",
                                      "/healthz",
                                      "/readyz",
                                      "/metrics",
                                      "/v1/info",
                                      "/v2",
                                      "/v2/health/live",
                                      "/v2/models/attention/ready",
                                      "/v2/models/attention/infer"};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    const attnd_route *route = attnd_route_find(paths[i], NULL, NULL);
    cr_assert_not_null(route, "%s", paths[i]);
    int k = attnd_route_series(route);
    cr_assert(k >= 0 && k < n, "%s: series %d", paths[i], k);
    cr_expect_str_eq(labels[k], route->label, "%s", paths[i]);
  }
  const attnd_console_asset *asset;
  cr_expect_eq(attnd_route_series(attnd_route_find("/", NULL, &asset)), -1, "the console's");
  cr_expect_eq(attnd_route_series(NULL), -1);
}
