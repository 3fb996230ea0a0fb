/*
 * routes.c — the route table (routes.h), and the words of its 404 and 405
 * replies.
 *
 * The inference protocol's routes (KServe v2, as Triton serves them) sit
 * beside attnd's own, so that tritonclient and perf_analyzer work against
 * attnd unchanged:
 *
 *   /v2                                  server metadata
 *   /v2/health/live, /v2/health/ready    as /healthz and /readyz
 *   /v2/models/{model}[/versions/1]      model metadata
 *     .../ready, .../config, .../infer   readiness, Triton's config, inference
 */
#include "routes.h"
#include "errors.h"
#include "kind.h"
#include "sessions.h"
#include "v1.h"
#include "v2.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The order is the 404 text's: attnd's own routes, then /v2's, then the
 * console. Probes are open, or a restart loop follows a key rotation; the
 * console holds no data and asks for the key its API calls send. */
static const attnd_route table[] = {
    {.methods = ATTND_POST,
     .pattern = "/attention",
     .kind = &attnd_kind_forward,
     .label = "/attention",
     .hint = "POST /attention"},
    {.methods = ATTND_POST,
     .pattern = "/attention/backward",
     .kind = &attnd_kind_backward,
     .label = "/attention/backward",
     .hint = "POST /attention/backward"},
    {.methods = ATTND_GET,
     .pattern = "/attention/plan",
     .label = "/attention/plan",
     .hint = "GET /attention/plan",
     .answer = attnd_v1_plan},
    {.methods = ATTND_GET,
     .pattern = "/healthz",
     .open = true,
     .label = "/healthz",
     .hint = "/healthz",
     .answer = attnd_v1_healthz},
    {.methods = ATTND_GET,
     .pattern = "/readyz",
     .open = true,
     .label = "/readyz",
     .hint = "/readyz",
     .answer = attnd_v1_readyz},
    {.methods = ATTND_GET,
     .pattern = "/metrics",
     .label = "/metrics",
     .hint = "/metrics",
     .answer = attnd_v1_metrics},
    {.methods = ATTND_GET,
     .pattern = "/v1/info",
     .label = "/v1/info",
     .hint = "/v1/info",
     .answer = attnd_v1_info},
    {.methods = ATTND_GET,
     .pattern = "/v1/sessions",
     .label = "/v1/sessions",
     .hint = "/v1/sessions/...",
     .answer = attnd_sessions_list},
    {.methods = ATTND_POST,
     .pattern = "/v1/sessions/_batch",
     .kind = &attnd_kind_session_batch,
     .label = "/v1/sessions/_batch"},
    {.methods = ATTND_GET | ATTND_PUT | ATTND_DELETE,
     .pattern = "/v1/sessions/{session}",
     .label = "/v1/sessions/{id}",
     .answer = attnd_sessions_resource,
     .after_body = attnd_sessions_resource,
     .body_methods = ATTND_PUT},
    {.methods = ATTND_POST,
     .pattern = "/v1/sessions/{session}/attention",
     .kind = &attnd_kind_session,
     .label = "/v1/sessions/{id}/attention"},
    {.methods = ATTND_POST,
     .pattern = "/v1/sessions/{session}/truncate",
     .label = "/v1/sessions/{id}/truncate",
     .after_body = attnd_sessions_truncate,
     .body_methods = ATTND_POST},
    {.methods = ATTND_POST,
     .pattern = "/v1/sessions/{session}/fork",
     .label = "/v1/sessions/{id}/fork",
     .after_body = attnd_sessions_fork,
     .body_methods = ATTND_POST},
    {.methods = ATTND_GET,
     .pattern = "/v1/sessions/{session}/export",
     .label = "/v1/sessions/{id}/export",
     .answer = attnd_sessions_export},
    {.methods = ATTND_PUT,
     .pattern = "/v1/sessions/{session}/import",
     .label = "/v1/sessions/{id}/import",
     .after_body = attnd_sessions_import,
     .body_methods = ATTND_PUT},
    {.methods = ATTND_GET,
     .pattern = "/v2",
     .label = "/v2/*",
     .hint = "GET /v2",
     .answer = attnd_v2_server},
    {.methods = ATTND_GET,
     .pattern = "/v2/health/live",
     .open = true,
     .label = "/v2/*",
     .hint = "/v2/health/live",
     .answer = attnd_v2_live},
    {.methods = ATTND_GET,
     .pattern = "/v2/health/ready",
     .open = true,
     .label = "/v2/*",
     .hint = "/v2/health/ready",
     .answer = attnd_v2_ready},
    {.methods = ATTND_GET,
     .pattern = "/v2/models/{model}",
     .label = "/v2/*",
     .hint = "/v2/models/{model}[/versions/1][/ready|/config]",
     .answer = attnd_v2_model},
    {.methods = ATTND_GET,
     .pattern = "/v2/models/{model}/ready",
     .label = "/v2/*",
     .answer = attnd_v2_model_ready},
    {.methods = ATTND_GET,
     .pattern = "/v2/models/{model}/config",
     .label = "/v2/*",
     .answer = attnd_v2_config},
    {.methods = ATTND_POST,
     .pattern = "/v2/models/{model}/infer",
     .kind = &attnd_kind_v2,
     .label = "/v2/models/*/infer",
     .hint = "POST /v2/models/{model}[/versions/1]/infer"},
    {.methods = ATTND_GET,
     .pattern = "{console}",
     .open = true,
     .hint = "/ for the web console",
     .answer = attnd_v1_console},
};
enum { N_ROUTES = sizeof table / sizeof *table };

#define MODEL "{model}"
#define SESSION "{session}"
#define MODELS "/v2/models/"

bool attnd_route_v2(const char *path) {
  return !strncmp(path, "/v2", 3) && (!path[3] || path[3] == '/');
}

/* The part of p up to the next '/' (or its end): its length. */
static size_t segment(const char *p) { return strcspn(p, "/"); }

/* {model}[/versions/{version}]{rest}: the model's index (-1 for none such),
 * whether the version is one there is ("1", or none given), and the
 * rest. */
static const char *split_model(const char *p, int *model, bool *version_ok) {
  size_t n = segment(p);
  *model = attn_proto_v2_model(p, n);
  *version_ok = true;
  p += n;
  if (!strncmp(p, "/versions/", 10)) {
    size_t v = segment(p + 10);
    *version_ok = v == 1 && p[10] == '1';
    p += 10 + v;
  }
  return p;
}

/* Whether path matches pattern; *model is set at a "{model}". */
static bool match(const char *pattern, const char *path, int *model,
                  const attnd_console_asset **asset) {
  if (!strcmp(pattern, "{console}"))
    return (*asset = attnd_console_find(path)) != NULL;
  const char *sid = strstr(pattern, SESSION);
  if (sid) { /* one non-empty segment, then the rest exactly */
    size_t pre = (size_t)(sid - pattern);
    if (strncmp(pattern, path, pre))
      return false;
    size_t n = segment(path + pre);
    return n > 0 && !strcmp(path + pre + n, sid + strlen(SESSION));
  }
  const char *m = strstr(pattern, MODEL);
  if (!m)
    return !strcmp(pattern, path);
  size_t pre = (size_t)(m - pattern);
  if (strncmp(pattern, path, pre))
    return false;
  bool version_ok;
  const char *rest = split_model(path + pre, model, &version_ok);
  if (*model >= 0 && version_ok && !strcmp(rest, m + strlen(MODEL)))
    return true;
  *model = -1;
  return false;
}

const attnd_route *attnd_route_find(const char *path, int *model,
                                    const attnd_console_asset **asset) {
  int m = -1;
  const attnd_console_asset *a = NULL;
  const attnd_route *found = NULL;
  for (int i = 0; i < N_ROUTES && !found; i++)
    if (match(table[i].pattern, path, &m, &a))
      found = &table[i];
  if (model)
    *model = found ? m : -1;
  if (asset)
    *asset = a;
  return found;
}

void attnd_route_of(attnd_req *r) {
  int model;
  r->route = attnd_route_find(r->path, &model, &r->asset);
  r->series = attnd_route_series(r->route);
  if (!attnd_route_v2(r->path))
    return;
  r->v2 = true;
  r->v2_model = model;
  r->v2_json_len = SIZE_MAX;
  if (model >= 0) /* the metrics' and the log line's model label */
    snprintf(r->model, sizeof r->model, "%s", attn_proto_v2_model_name(model));
}

int attnd_route_labels(const char **out, int cap) {
  int n = 0;
  for (int i = 0; i < N_ROUTES; i++) {
    const char *l = table[i].label;
    bool seen = !l;
    for (int j = 0; j < i && !seen; j++)
      seen = table[j].label && !strcmp(table[j].label, l);
    if (!seen && n++ < cap)
      out[n - 1] = l;
  }
  return n;
}

/* Each row's place among the distinct labels, as attnd_route_labels()
 * lists them: a function of the constant table, worked out once. */
static int row_series[N_ROUTES];
static pthread_once_t series_once = PTHREAD_ONCE_INIT;

static void number_series(void) {
  int n = 0;
  for (int i = 0; i < N_ROUTES; i++) {
    row_series[i] = -1;
    for (int j = 0; j < i && row_series[i] < 0; j++)
      if (table[i].label && table[j].label && !strcmp(table[j].label, table[i].label))
        row_series[i] = row_series[j];
    if (table[i].label && row_series[i] < 0)
      row_series[i] = n++;
  }
}

int attnd_route_series(const attnd_route *route) {
  if (!route || route < table || route >= table + N_ROUTES)
    return -1;
  pthread_once(&series_once, number_series);
  return row_series[route - table];
}

static const struct {
  unsigned bit;
  const char *name;
} methods[] = {
    {ATTND_GET, "GET"}, {ATTND_PUT, "PUT"}, {ATTND_POST, "POST"}, {ATTND_DELETE, "DELETE"}};

bool attnd_route_allows(const attnd_route *route, const char *method) {
  if (route->methods & ATTND_GET && !strcmp(method, "HEAD"))
    return true;
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
    if (route->methods & methods[i].bit && !strcmp(method, methods[i].name))
      return true;
  return false;
}

bool attnd_route_body_first(const attnd_route *route, const char *method) {
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
    if (route->body_methods & methods[i].bit && !strcmp(method, methods[i].name))
      return true;
  return false;
}

/* "GET, HEAD", "POST", "GET, HEAD, PUT, DELETE": a route's methods. */
static const char *allow_text(unsigned m) {
  static const char *const texts[] = {"",
                                      "GET, HEAD",
                                      "POST",
                                      "GET, HEAD, POST",
                                      "PUT",
                                      "GET, HEAD, PUT",
                                      "POST, PUT",
                                      "GET, HEAD, POST, PUT",
                                      "DELETE",
                                      "GET, HEAD, DELETE",
                                      "POST, DELETE",
                                      "GET, HEAD, POST, DELETE",
                                      "PUT, DELETE",
                                      "GET, HEAD, PUT, DELETE",
                                      "POST, PUT, DELETE",
                                      "GET, HEAD, POST, PUT, DELETE"};
  return texts[m & 15];
}

const char *attnd_route_allow(const attnd_route *route) {
  return route ? allow_text(route->methods) : "GET, HEAD";
}

void attnd_route_not_allowed(attnd_req *r) {
  char msg[200], m[24];
  attn_quote(m, sizeof m, r->method, strlen(r->method));
  char use[40] = "";
  size_t n = 0, k = 0, total = 0;
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
    total += (r->route->methods & methods[i].bit) != 0;
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
    if (r->route->methods & methods[i].bit)
      n += (size_t)snprintf(use + n, sizeof use - n, "%s%s",
                            k++ == 0     ? ""
                            : k == total ? " or "
                                         : ", ",
                            methods[i].name);
  snprintf(msg, sizeof msg, "%s is not allowed on %.60s (use %s)", m, r->path, use);
  attnd_req_fail(r, ATTND_EMETHOD_NOT_ALLOWED, msg);
}

/* The words of every route of one part of the API (v2: the inference
 * protocol's), joined with ", " ("or " before the last for attnd's own,
 * where the whole of /v2 is one entry). */
static void route_list(bool v2, char *out, size_t cap) {
  const char *words[N_ROUTES];
  int n = 0;
  bool v2_named = false;
  for (int i = 0; i < N_ROUTES; i++) {
    bool in_v2 = attnd_route_v2(table[i].pattern);
    if (!v2 && in_v2 && !v2_named) {
      words[n++] = "/v2";
      v2_named = true;
    } else if (v2 == in_v2 && table[i].hint) {
      words[n++] = table[i].hint;
    }
  }
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < n && at < cap; i++)
    at += (size_t)snprintf(out + at, cap - at, "%s%s%s", i ? ", " : "",
                           !v2 && i == n - 1 && n > 1 ? "or " : "", words[i]);
}

/* A path under /v2 that names no route: an unknown model, a version
 * other than 1, or no such path. */
static void v2_not_found(attnd_req *r) {
  char msg[720], what[96], list[300];
  const char *p = r->path + strlen(MODELS);
  int model = -1;
  bool version_ok = true;
  bool models = !strncmp(r->path, MODELS, strlen(MODELS));
  if (models) {
    split_model(p, &model, &version_ok);
    attn_quote(what, sizeof what, p, segment(p));
  }
  if (models && model < 0)
    snprintf(msg, sizeof msg,
             "unknown model \"%s\" (models: attention, attention_fp16, attention_bf16)", what);
  else if (model >= 0 && !version_ok)
    snprintf(msg, sizeof msg, "model \"%s\" has only version 1", what);
  else {
    attn_quote(what, sizeof what, r->path, strlen(r->path));
    route_list(true, list, sizeof list);
    snprintf(msg, sizeof msg, "no such path \"%s\" (the inference protocol here: %s)", what, list);
  }
  attnd_req_fail(r, ATTND_ENOT_FOUND, msg);
}

void attnd_route_not_found(attnd_req *r) {
  if (r->v2) {
    v2_not_found(r);
    return;
  }
  char msg[512], path[96], list[200];
  attn_quote(path, sizeof path, r->path, strlen(r->path));
  route_list(false, list, sizeof list);
  snprintf(msg, sizeof msg, "no such path \"%s\" (try %s)", path, list);
  attnd_req_fail(r, ATTND_ENOT_FOUND, msg);
}

#define ESCAPED                                                                          \
  "session ids are plain characters (A-Z a-z 0-9 . _ -) and a session path must not be " \
  "percent-encoded: write /v1/sessions/ID and the routes below it without %XX escapes"

bool attnd_route_escaped(attnd_req *r) {
  const char *p = r->route ? r->route->pattern : NULL;
  if (!r->path_escaped || !p || strncmp(p, "/v1/sessions", strlen("/v1/sessions")))
    return false;
  attnd_req_fail(r, ATTN_EINVAL, ESCAPED);
  return true;
}
