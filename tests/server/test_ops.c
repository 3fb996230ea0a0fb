/*
 * test_ops.c — the operations metrics through the real attnd (attnd_build_info
 * and errors counted by code) and --help listing the operations flags; the
 * features have their own suites (test_request_ids.c, test_api_key.c,
 * test_tls.c, test_cors.c, test_compression.c).
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(ops, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"

Test(ops, metrics_build_info_and_errors_by_code) {
  srv_start(&S, NULL);
  http_res r;
  http_call(&S, "POST", "/attention", (const char *[]){JSON_CT, "Content-Encoding: gzip", NULL},
            "xx", 2, &r);
  http_res_free(&r);
  /* counted as it ends, which may come after the client read the reply */
  const char *rl[] = {"path=/attention", "code=400", NULL};
  srv_wait_metric_ge(&S, "attnd_requests_total", rl, 1, 60);
  http_call(&S, "GET", "/metrics", NULL, NULL, 0, &r);
#ifdef ATTN_HAVE_CUDA
  const char *bl[] = {"backends=cuda,cpu,reference", NULL}; /* compiled in, device or not */
#else
  const char *bl[] = {"backends=cpu,reference", NULL};
#endif
  int n = 0;
  cr_expect_eq(prom_sum(r.body, "attnd_build_info", bl, &n), 1, "%s", r.body);
  cr_expect_eq(n, 1);
  cr_expect(strstr(r.body, "attnd_build_info{version=\""), "version label");
  const char *el[] = {"code=bad_request", NULL};
  cr_expect_eq(prom_sum(r.body, "attnd_errors_total", el, NULL), 1, "bad gzip counted");
  cr_expect_eq(prom_sum(r.body, "attnd_requests_total", rl, NULL), 1);
  cr_expect(!strstr(r.body, "model=\""), "no model label on /attention:\n%s", r.body);
  http_res_free(&r);
}

Test(ops, help_lists_the_new_flags) {
  const char *args[] = {"--help", NULL};
  char *out = NULL;
  cr_expect_eq(run_attnd(args, NULL, 10, &out, NULL), 0);
  static const char *const want[] = {
      "--api-key KEY",         "ATTND_API_KEY]",
      "--api-key-file FILE",   "ATTND_API_KEY_FILE",
      "--tls-cert FILE",       "ATTND_TLS_CERT",
      "--tls-key FILE",        "ATTND_TLS_KEY",
      "--cors-origin ORIGIN",  "ATTND_CORS_ORIGIN",
      "ATTND_LOG_FORMAT",      "--tls-priorities STRING",
      "ATTND_TLS_PRIORITIES",  "SIGHUP and SIGUSR1 are logged and ignored",
      "--trusted-proxy LIST",  "ATTND_TRUSTED_PROXY",
      "--drain-delay SECONDS", "ATTND_DRAIN_DELAY"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(out && strstr(out, want[i]), "--help lacks %s:\n%s", want[i], out);
  free(out);
}
