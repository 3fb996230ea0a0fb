/*
 * test_openapi.c — proto/openapi.yaml against the running server: every
 * path it documents is routed (not 404) and answers one of the statuses the
 * spec lists for it; every path the server routes is documented. A session
 * path is tried on a session made first, so that its routing is seen apart
 * from a 404 for an unknown id.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;

static void teardown(void) { srv_cleanup(&S); }

Test(openapi, paths_match_the_server, .fini = teardown, .timeout = 60) {
  FILE *f = fopen("proto/openapi.yaml", "r");
  cr_assert(f, "run from the repository root");
  srv_start(&S, "--session-memory", "16M", NULL);
  char line[256];
  bool in_paths = false;
  int n = 0;
  char documented[32][64];
  static const char create[] = "{\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", "
                               "\"max_tokens\": 8}";
  http_res made;
  cr_assert_eq(http_call(&S, "PUT", "/v1/sessions/openapi",
                         (const char *const[]){"Content-Type: application/json", NULL}, create,
                         strlen(create), &made),
               201);
  http_res_free(&made);
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "paths:", 6)) {
      in_paths = true;
      continue;
    }
    if (in_paths && line[0] != ' ' && line[0] != '\n')
      break; /* the next top-level key */
    char path[64];
    if (!in_paths || sscanf(line, "  %63[^: ]:", path) != 1 || path[0] != '/' || line[2] != '/')
      continue;
    cr_assert_lt(n, 32);
    snprintf(documented[n++], sizeof documented[0], "%s", path);
    http_res rs;
    /* a templated path is tried with the first value of its parameter */
    char target[96];
    const char *model = strstr(path, "{model}"), *id = strstr(path, "{id}");
    if (model)
      snprintf(target, sizeof target, "%.*sattention%s", (int)(model - path), path, model + 7);
    else if (id)
      snprintf(target, sizeof target, "%.*sopenapi%s", (int)(id - path), path, id + 4);
    else
      snprintf(target, sizeof target, "%s", path);
    bool post = !strcmp(path, "/attention") || !strcmp(path, "/attention/backward") ||
                strstr(path, "/infer") || strstr(path, "/v1/sessions/");
    if (id && !strcmp(id, "{id}")) /* PUT, GET, DELETE: the GET */
      post = false;
    int rc = post ? http_post(&S, target, "application/json", "{}", 2, &rs)
                  : http_get(&S,
                             !strcmp(path, "/attention/plan") ? "/attention/plan?seq_q=8&head_dim=8"
                                                              : target,
                             &rs);
    cr_assert_eq(rc, 0);
    cr_expect_neq(rs.status, 404, "%s is documented but not routed", path);
    /* the status must be one the spec lists under this path */
    char key[16];
    snprintf(key, sizeof key, "'%ld'", rs.status);
    long here = ftell(f);
    bool listed = false;
    while (fgets(line, sizeof line, f) && (line[0] == ' ' && strncmp(line, "  /", 3)))
      if (strstr(line, key))
        listed = true;
    fseek(f, here, SEEK_SET);
    cr_expect(listed, "%s answered %ld, which openapi.yaml does not list for it", path, rs.status);
    http_res_free(&rs);
  }
  fclose(f);
  cr_expect_eq(n, 23, "openapi.yaml documents %d paths", n);
  static const char *const routed[] = {"/",
                                       "/attention",
                                       "/attention/backward",
                                       "/attention/plan",
                                       "/healthz",
                                       "/readyz",
                                       "/metrics",
                                       "/v1/info",
                                       "/v1/sessions",
                                       "/v1/sessions/{id}",
                                       "/v1/sessions/{id}/attention",
                                       "/v1/sessions/{id}/truncate",
                                       "/v1/sessions/{id}/fork",
                                       "/v1/sessions/{id}/export",
                                       "/v1/sessions/{id}/import",
                                       "/v1/sessions/_batch",
                                       "/v2",
                                       "/v2/health/live",
                                       "/v2/health/ready",
                                       "/v2/models/{model}",
                                       "/v2/models/{model}/ready",
                                       "/v2/models/{model}/config",
                                       "/v2/models/{model}/infer"};
  for (size_t i = 0; i < sizeof routed / sizeof *routed; i++) {
    bool found = false;
    for (int j = 0; j < n; j++)
      found |= !strcmp(routed[i], documented[j]);
    cr_expect(found, "%s is routed but not in openapi.yaml", routed[i]);
  }
  cr_expect_eq(srv_stop(&S, 10), 0);
}
