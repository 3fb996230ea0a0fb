/*
 * test_tls.c — HTTPS through the real attnd with a throwaway certificate:
 * a round trip, TLS 1.2 and 1.3 with AEAD suites only unless
 * --tls-priorities widens them (checked with openssl s_client), and the
 * certificate, key and priority mistakes refused.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(tls, .fini = teardown, .timeout = 120);

#define ST_CT "Content-Type: application/octet-stream"

typedef struct grow {
  char *p;
  size_t n;
} grow;

static size_t on_data(char *d, size_t sz, size_t nm, void *ud) {
  grow *g = ud;
  char *p = realloc(g->p, g->n + sz * nm + 1);
  if (!p)
    return 0;
  memcpy(p + g->n, d, sz * nm);
  g->n += sz * nm;
  p[g->n] = 0;
  g->p = p;
  return sz * nm;
}

/* One request over HTTPS to 127.0.0.1:port, trusting ca; r as http_do
 * fills it (status 0 when no reply). */
static void tls_do(int port, const char *ca, const char *path, const char *ctype, const void *body,
                   size_t len, http_res *r) {
  memset(r, 0, sizeof *r);
  char url[128];
  snprintf(url, sizeof url, "https://127.0.0.1:%d%s", port, path);
  CURL *h = curl_easy_init();
  grow b = {0}, hd = {0};
  struct curl_slist *hl = NULL;
  if (ctype)
    hl = curl_slist_append(hl, ctype);
  hl = curl_slist_append(hl, "Expect:");
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CAINFO, ca);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &hd);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->error);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  }
  r->curl_rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  r->body = b.p ? b.p : strdup("");
  r->len = b.n;
  r->hdrs = hd.p ? hd.p : strdup("");
  r->hlen = hd.n;
  curl_slist_free_all(hl);
  curl_easy_cleanup(h);
}

/* A self-signed certificate for 127.0.0.1 and its key, made with openssl
 * (Debian's openssl package, in DEPS). */
static void make_cert(const char *dir, const char *name) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
           "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout %s/%s.key "
           "-out %s/%s.pem >/dev/null 2>&1",
           dir, name, dir, name);
  cr_assert_eq(system(cmd), 0, "openssl could not make a certificate: %s", cmd);
}

/* A fresh directory with srv.pem and srv.key made in it; cert and key get
 * their paths. */
static void make_srv_cert(char cert[128], char key[128]) {
  char *dir = make_tmpdir();
  make_cert(dir, "srv");
  snprintf(cert, 128, "%s/srv.pem", dir);
  snprintf(key, 128, "%s/srv.key", dir);
}

/* Starts S over HTTPS with cert and key (and --tls-priorities prio unless
 * NULL) and waits until GET /healthz answers over TLS. */
static void tls_start(const char *cert, const char *key, const char *prio) {
  const char *args[] = {"--tls-cert", cert, "--tls-key", key, prio ? "--tls-priorities" : NULL,
                        prio,         NULL};
  srv_spawn(&S, args, NULL, true);
  http_res r = {0};
  for (int i = 0; i < 200 && r.status != 200; i++) { /* up to ~20 s for the start */
    http_res_free(&r);
    sleep_s(0.1);
    tls_do(S.port, cert, "/healthz", NULL, NULL, 0, &r);
  }
  cr_assert_eq(r.status, 200, "GET /healthz over HTTPS: %s", r.error);
  http_res_free(&r);
}

Test(tls, tls_round_trip) {
  char cert[128], key[128];
  make_srv_cert(cert, key);
  tls_start(cert, key, NULL);
  http_res r = {0};

  tprob p = tprob_make(1, 2, 2, 13, 17, 64, ATTN_BF16);
  tcase c;
  tcase_init(&c, &p, 21);
  size_t len;
  char *sb = st_body(&c, 3, NULL, &len);
  tls_do(S.port, cert, "/attention", ST_CT, sb, len, &r);
  expect_correct(&r, &c, 3, true, "POST over HTTPS");
  char v[128] = "";
  cr_expect(http_header(&r, "X-Request-Id", v, sizeof v) && made_id(v), "id over HTTPS: %s", v);
  http_res_free(&r);
  free(sb);
  tcase_free(&c);

  tls_do(S.port, cert, "/v1/info", NULL, NULL, 0, &r);
  cJSON *j = cJSON_Parse(r.body);
  cJSON *sec = cJSON_GetObjectItemCaseSensitive(j, "security");
  cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sec, "tls")), "%s", r.body);
  cJSON_Delete(j);
  http_res_free(&r);

  /* plain HTTP to the HTTPS port gets no HTTP reply */
  http_get(&S, "/healthz", &r);
  cr_expect_neq(r.status, 200, "plain HTTP answered on the HTTPS port");
  http_res_free(&r);
  srv_wait_log(&S, "listening on https://", 30); /* may follow the first reply */
  char *log = srv_log(&S);
  cr_expect(strstr(log, "listening on https://"), "%s", log);
  free(log);
  cr_expect_eq(srv_stop(&S, 10), 0);
}

/* One handshake with openssl s_client (opts: its protocol and cipher
 * flags) against S; whether it was established. out gets s_client's
 * output, for messages. */
static bool handshake(const char *opts, char *out, size_t cap) {
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "timeout 30 openssl s_client -connect 127.0.0.1:%d -brief %s </dev/null 2>&1", S.port,
           opts);
  FILE *p = popen(cmd, "r");
  cr_assert(p, "cannot run %s", cmd);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return st == 0 && strstr(out, "CONNECTION ESTABLISHED");
}

/* A handshake that must succeed with protocol version want (TLSv1.2...). */
static void expect_handshake(const char *opts, const char *want) {
  char out[8192], line[64];
  bool ok = handshake(opts, out, sizeof out);
  snprintf(line, sizeof line, "Protocol version: %s\n", want);
  cr_expect(ok && strstr(out, line), "s_client %s: want %s, got:\n%s", opts, want, out);
}

static void expect_refused(const char *opts) {
  char out[8192];
  cr_expect(!handshake(opts, out, sizeof out), "s_client %s was accepted:\n%s", opts, out);
}

/* OpenSSL's own refusals, before it sends a hello: no verdict on the
 * server. */
static bool client_refused(const char *out) {
  return strstr(out, "no protocols available") || strstr(out, "unsupported protocol") ||
         strstr(out, "legacy sigalg disallowed");
}

/* The default is TLS 1.2 and 1.3 with AEAD suites only; SECLEVEL=0 lets
 * this OpenSSL offer the old versions, so the refusal is the server's. */
Test(tls, tls_modern_protocols_only) {
  char cert[128], key[128];
  make_srv_cert(cert, key);
  tls_start(cert, key, NULL);
  expect_refused("-tls1 -cipher DEFAULT@SECLEVEL=0");
  expect_refused("-tls1_1 -cipher DEFAULT@SECLEVEL=0");
  expect_refused("-tls1_2 -cipher ECDHE-ECDSA-AES256-SHA");
  expect_refused("-tls1_2 -cipher ECDHE-ECDSA-AES128-SHA256");
  expect_handshake("-tls1_2 -cipher ECDHE-ECDSA-AES128-GCM-SHA256", "TLSv1.2");
  expect_handshake("-tls1_2 -cipher ECDHE-ECDSA-CHACHA20-POLY1305", "TLSv1.2");
  expect_handshake("-tls1_3", "TLSv1.3");
  cr_expect_eq(srv_stop(&S, 10), 0);

  /* --tls-priorities replaces the default: NORMAL takes TLS 1.1 again. */
  tls_start(cert, key, "NORMAL");
  char out[8192];
  if (handshake("-tls1_1 -cipher DEFAULT@SECLEVEL=0", out, sizeof out))
    cr_expect(strstr(out, "Protocol version: TLSv1.1\n"), "%s", out);
  else if (client_refused(out))
    printf("skipped: this OpenSSL refuses TLS 1.1 itself, even at SECLEVEL=0:\n%s", out);
  else
    cr_expect(false, "--tls-priorities NORMAL: TLS 1.1 refused:\n%s", out);
  expect_handshake("-tls1_3", "TLSv1.3");
  cr_expect_eq(srv_stop(&S, 10), 0);
}

/* A priority string GnuTLS does not parse is one line quoting where it
 * stops; one given without --tls-cert is a mistake too (plain HTTP is not
 * what it asks for). */
Test(tls, tls_priorities_errors) {
  char cert[128], key[128];
  make_srv_cert(cert, key);
  struct {
    const char *args[9], *says[2];
  } cases[] = {
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities", "NORMAL:+BOGUS:-VERS-ALL", NULL},
       {"--tls-priorities", "\"+BOGUS\""}},
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities", "NORMAL:-VERS-ALL", NULL},
       {"--tls-priorities", "NORMAL:-VERS-ALL"}},
      {{"--tls-priorities", "NORMAL", NULL}, {"--tls-priorities", "--tls-cert"}},
      {{"--tls-cert", cert, "--tls-key", key, "--tls-priorities=", NULL},
       {"--tls-priorities", "empty"}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *argv[12] = {"--listen", "127.0.0.1:0"};
    for (int k = 0; cases[i].args[k]; k++)
      argv[2 + k] = cases[i].args[k];
    char *err = NULL;
    int st = run_attnd(argv, NULL, 20, NULL, &err);
    const char *nl = err ? strchr(err, '\n') : NULL;
    cr_expect_eq(st, 2, "case %zu: exit %d (-1: it served): %s", i, st, err);
    cr_expect(err && strstr(err, cases[i].says[0]) && strstr(err, cases[i].says[1]) && nl && !nl[1],
              "case %zu: want one line with %s and %s, got: %s", i, cases[i].says[0],
              cases[i].says[1], err);
    free(err);
  }
}

Test(tls, tls_errors) {
  char *dir = make_tmpdir(), cert[128], key[128], other_key[128], junk[128];
  make_cert(dir, "a");
  make_cert(dir, "b");
  snprintf(cert, sizeof cert, "%s/a.pem", dir);
  snprintf(key, sizeof key, "%s/a.key", dir);
  snprintf(other_key, sizeof other_key, "%s/b.key", dir);
  snprintf(junk, sizeof junk, "%s/junk.pem", dir);
  write_file(junk, "not a certificate\n");
  struct {
    const char *args[5], *says;
  } cases[] = {
      {{"--tls-cert", cert, NULL}, "without --tls-key"},
      {{"--tls-key", key, NULL}, "without --tls-cert"},
      {{"--tls-cert", "/nonexistent.pem", "--tls-key", key, NULL}, "cannot read"},
      {{"--tls-cert", junk, "--tls-key", key, NULL}, "not a PEM file"},
      {{"--tls-cert", cert, "--tls-key", junk, NULL}, "not a PEM file"},
      {{"--tls-cert", cert, "--tls-key", other_key, NULL}, "--tls-key"},
      {{"--tls-cert", key, "--tls-key", key, NULL}, "--tls-cert"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *err = NULL;
    cr_expect_eq(run_attnd(cases[i].args, NULL, 20, NULL, &err), 2, "case %zu", i);
    cr_expect(err && strstr(err, cases[i].says), "case %zu: want \"%s\" in: %s", i, cases[i].says,
              err);
    free(err);
  }
}
