/*
 * test_session_handover.c — attnd --handover URL: on a graceful stop a
 * replica PUTs every session to URL/v1/sessions/{id}/import under its own
 * key. Two attnd, A handing over to B, both with the same two keys:
 * sessions of both keys (one id in both namespaces) end on B byte for
 * byte as A exported them, A exits 0 and logs the summary; an id B holds
 * already is 409, which A drops and logs; a target that refuses or never
 * answers leaves A's exit bounded by --handover-timeout, its sessions kept
 * and saved to --session-dir, as is one the inheritor has no memory for
 * (507, logged with its message) and one whose key this server no longer
 * holds; URLs attnd cannot use are refused at start.
 */
#include "harness.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static srv A, B;
static void teardown(void) {
  srv_cleanup(&A);
  srv_cleanup(&B);
  remove_tmpdir();
}
TestSuite(session_handover, .fini = teardown, .timeout = 180);

#define ALICE "Authorization: Bearer alice-key-0123456789"
#define BOB "Authorization: Bearer bob-key-9876543210"
#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"

/* A key file of alice and bob in a fresh directory; its path. */
static const char *keys_file(void) {
  static char path[256];
  snprintf(path, sizeof path, "%s/keys", make_tmpdir());
  write_file(path, "alice:alice-key-0123456789\nbob:bob-key-9876543210\n");
  return path;
}

static void create(srv *sv, const char *auth, const char *id, int layers) {
  char path[128], body[200];
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": 2, \"head_dim\": 16, \"dtype\": \"F32\", \"max_tokens\": 64, "
           "\"layers\": %d}",
           layers);
  const char *h[] = {auth, JSON_CT, NULL};
  http_res r;
  cr_assert_eq(http_call(sv, "PUT", path, h, body, strlen(body), &r), 201, "%s: %.200s", id,
               r.body);
  http_res_free(&r);
}

/* "name": [h, n, 16] of values drawn from seed. */
static void put_tensor(attn_sbuf *b, const char *name, int h, int n, uint64_t *seed) {
  attn_sbuf_printf(b, "\"%s\": {\"shape\": [%d, %d, 16], \"dtype\": \"F32\", \"data\": [", name, h,
                   n);
  for (int i = 0; i < h * n * 16; i++)
    attn_sbuf_printf(b, "%s%.6f", i ? "," : "", tuniform(seed));
  attn_sbuf_puts(b, "]}, ");
}

/* n tokens appended to layer l of id at pos (4 query heads). */
static void append(srv *sv, const char *auth, const char *id, int l, int pos, int n,
                   uint64_t seed) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "{");
  put_tensor(&b, "q", 4, n, &seed);
  put_tensor(&b, "k", 2, n, &seed);
  put_tensor(&b, "v", 2, n, &seed);
  attn_sbuf_printf(&b, "\"layer\": %d, \"pos\": %d}", l, pos);
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  const char *h[] = {auth, JSON_CT, NULL};
  http_res r;
  http_call(sv, "POST", path, h, b.p, b.len, &r);
  free(b.p);
  cr_assert_eq(r.status, 200, "%s: %ld %.300s", id, r.status, r.body);
  http_res_free(&r);
}

/* GET .../export under auth: the file (malloc'd, *len bytes), or NULL
 * with *status when it is not 200. */
static char *export_of(srv *sv, const char *auth, const char *id, size_t *len, long *status) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/export", id);
  const char *h[] = {auth, NULL};
  http_res r;
  *status = http_call(sv, "GET", path, h, NULL, 0, &r);
  char *b = NULL;
  if (*status == 200) {
    b = malloc(r.len + 1);
    memcpy(b, r.body, r.len);
    *len = r.len;
  }
  http_res_free(&r);
  return b;
}

static char *exported(srv *sv, const char *auth, const char *id, size_t *len) {
  long status;
  char *f = export_of(sv, auth, id, len, &status);
  cr_assert_eq(status, 200, "export %s: %ld", id, status);
  return f;
}

/* B's copy of id under auth is the file f, byte for byte. */
static void expect_on(srv *sv, const char *auth, const char *id, const char *f, size_t n) {
  size_t m;
  char *g = exported(sv, auth, id, &m);
  cr_expect(m == n && !memcmp(f, g, n), "%s: the export after the handover differs", id);
  free(g);
}

static void start_pair(const char *keys, const char *target, const char *timeout, const char *dir) {
  const char *args[] = {"--session-memory",
                        "16M",
                        "--api-key-file",
                        keys,
                        "--drain-delay",
                        "0.2",
                        "--handover",
                        target,
                        "--handover-timeout",
                        timeout,
                        dir ? "--session-dir" : NULL,
                        dir,
                        NULL};
  srv_startv(&A, args, NULL, true);
}

Test(session_handover, every_session_moves_under_its_key) {
  const char *keys = keys_file();
  srv_start(&B, "--session-memory", "16M", "--api-key-file", keys, NULL);
  start_pair(keys, B.url, "30", NULL);
  create(&A, ALICE, "s1", 2);
  append(&A, ALICE, "s1", 0, 0, 16, 1);
  append(&A, ALICE, "s1", 1, 0, 9, 2);
  create(&A, BOB, "s1", 1); /* the same id in bob's namespace */
  append(&A, BOB, "s1", 0, 0, 5, 3);
  create(&A, BOB, "empty", 1);
  size_t na, nb, ne;
  char *fa = exported(&A, ALICE, "s1", &na), *fb = exported(&A, BOB, "s1", &nb),
       *fe = exported(&A, BOB, "empty", &ne);
  cr_assert_eq(srv_stop(&A, 60), 0, "A exits 0 after its handover");
  char want[160];
  snprintf(want, sizeof want, "handover to %s: 3 moved (%zu bytes), 0 already there, 0 kept", B.url,
           na + nb + ne);
  char *log = srv_log(&A);
  cr_expect(strstr(log, want), "no summary \"%s\" in:\n%s", want, log);
  cr_expect(strstr(log, "handover: session s1 (key alice) moved"), "%s", log);
  free(log);
  expect_on(&B, ALICE, "s1", fa, na);
  expect_on(&B, BOB, "s1", fb, nb);
  expect_on(&B, BOB, "empty", fe, ne);
  free(fa), free(fb), free(fe);
}

/* B holds alice's s1 already (rebuilt there by its client: its own rows):
 * the import is 409, A drops its copy, logs so, and saves nothing of it;
 * B's copy is untouched. */
Test(session_handover, an_id_the_inheritor_holds_is_dropped) {
  const char *keys = keys_file();
  char dir[256];
  snprintf(dir, sizeof dir, "%s/saved", make_tmpdir());
  cr_assert_eq(mkdir(dir, 0700), 0);
  srv_start(&B, "--session-memory", "16M", "--api-key-file", keys, NULL);
  start_pair(keys, B.url, "30", dir);
  create(&A, ALICE, "s1", 1);
  append(&A, ALICE, "s1", 0, 0, 8, 4);
  create(&B, ALICE, "s1", 1);
  append(&B, ALICE, "s1", 0, 0, 3, 5);
  size_t n;
  char *fb = exported(&B, ALICE, "s1", &n);
  cr_assert_eq(srv_stop(&A, 60), 0);
  char *log = srv_log(&A);
  cr_expect(strstr(log, "1 already there, 0 kept"), "%s", log);
  cr_expect(strstr(log, "session s1 (key alice) dropped: the inheritor holds it already (409)"),
            "%s", log);
  cr_expect(strstr(log, "sessions: saved 0 to"), "%s", log);
  free(log);
  expect_on(&B, ALICE, "s1", fb, n);
  free(fb);
}

/* A socket that listens but never accepts: connects complete (the
 * kernel's backlog), and nothing ever answers. */
static int silent_listener(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* A target that never answers, then one nobody listens on: A still exits
 * 0 (the wait bounded by --handover-timeout or the request's idle time,
 * well inside srv_stop's), its
 * sessions kept, logged and saved; a restart from --session-dir serves
 * them as they were. */
static void kept_and_saved(const char *target, const char *timeout, const char *why,
                           const char *logged) {
  const char *keys = keys_file();
  char dir[256];
  snprintf(dir, sizeof dir, "%s/saved-%d", make_tmpdir(), (int)strlen(why));
  cr_assert_eq(mkdir(dir, 0700), 0);
  start_pair(keys, target, timeout, dir);
  create(&A, ALICE, "k1", 1);
  append(&A, ALICE, "k1", 0, 0, 6, 6);
  size_t n;
  char *f = exported(&A, ALICE, "k1", &n);
  cr_assert_eq(srv_stop(&A, 60), 0, "%s: A exits 0", why);
  char *log = srv_log(&A);
  cr_expect(strstr(log, "0 moved (0 bytes), 0 already there, 1 kept"), "%s: %s", why, log);
  cr_expect(strstr(log, "handover: session k1 (key alice) kept"), "%s: %s", why, log);
  cr_expect(strstr(log, logged), "%s: no \"%s\" in %s", why, logged, log);
  cr_expect(strstr(log, "sessions: saved 1 to"), "%s: %s", why, log);
  free(log);
  srv_cleanup(&A);
  srv_start(&A, "--session-memory", "16M", "--api-key-file", keys, "--session-dir", dir, NULL);
  expect_on(&A, ALICE, "k1", f, n);
  srv_stop(&A, 60);
  free(f);
}

Test(session_handover, a_dead_target_keeps_them_for_the_session_dir) {
  int port, fd = silent_listener(&port);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  kept_and_saved(url, "1", "a target that never answers",
                 "no answer by the deadline while waiting for the reply");
  /* a timeout past the request's idle time (10 s): the request gives up
   * first, leaving the rest of the handover to other sessions */
  kept_and_saved(url, "60", "a target that never answers, a long timeout",
                 "no byte moved in its idle time while waiting for the reply");
  close(fd);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", free_port());
  kept_and_saved(url, "1", "nobody listening", "connecting: Connection refused");
}

/* The inheritor at its memory limit answers 507: the session is kept,
 * the status and message logged, and --session-dir saves it. */
Test(session_handover, the_inheritors_refusal_is_logged_and_the_session_kept) {
  const char *keys = keys_file();
  char dir[256];
  snprintf(dir, sizeof dir, "%s/saved", make_tmpdir());
  cr_assert_eq(mkdir(dir, 0700), 0);
  srv_start(&B, "--session-memory", "1M", "--api-key-file", keys, NULL);
  start_pair(keys, B.url, "30", dir);
  create(&A, BOB, "r1", 32); /* 32 layers: 8M of pages, past B's 1M */
  cr_assert_eq(srv_stop(&A, 60), 0);
  char *log = srv_log(&A);
  cr_expect(strstr(log, "session r1 (key bob) kept"), "%s", log);
  cr_expect(strstr(log, "the inheritor answered 507 session_memory_full: "), "%s", log);
  cr_expect(strstr(log, "sessions: saved 1 to"), "%s", log);
  free(log);
}

/* A session loaded from --session-dir whose key has left the key file has
 * no key to be imported with: kept and saved again, never sent under
 * another key. */
Test(session_handover, a_session_whose_key_is_gone_is_kept) {
  const char *keys = keys_file();
  char dir[256], alice_only[256];
  snprintf(dir, sizeof dir, "%s/saved", make_tmpdir());
  snprintf(alice_only, sizeof alice_only, "%s/alice-only", make_tmpdir());
  write_file(alice_only, "alice:alice-key-0123456789\n");
  cr_assert_eq(mkdir(dir, 0700), 0);
  srv_start(&A, "--session-memory", "16M", "--api-key-file", keys, "--session-dir", dir, NULL);
  create(&A, BOB, "b1", 1);
  cr_assert_eq(srv_stop(&A, 60), 0);
  srv_cleanup(&A);
  srv_start(&B, "--session-memory", "16M", "--api-key-file", keys, NULL);
  start_pair(alice_only, B.url, "30", dir);
  cr_assert_eq(srv_stop(&A, 60), 0);
  char *log = srv_log(&A);
  cr_expect(strstr(log, "session b1 (key bob) kept, 0 bytes: this server has no API key of that "
                        "name to import it with"),
            "%s", log);
  cr_expect(strstr(log, "sessions: saved 1 to"), "%s", log);
  free(log);
  long status;
  size_t n;
  cr_expect_null(export_of(&B, BOB, "b1", &n, &status));
  cr_expect_eq(status, 404, "B has no b1 of bob's: %ld", status);
}

Test(session_handover, urls_it_cannot_use_are_refused_at_start) {
  const struct {
    const char *flag, *url, *says;
  } bad[] = {
      {"--handover", "https://10.0.0.1:8443", "the handover speaks plain HTTP"},
      {"--handover", "ftp://proxy", "must start with http:// or https://"},
      {"--handover", "http://proxy:8080/?x=1", "a query has no place in it"},
      {"--handover", "http://proxy:99999", "bad port"},
      {"--handover", "http://user:pw@proxy", "holds credentials"},
      {"--handover-timeout", "0", "above 0"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *args[] = {bad[i].flag, bad[i].url, NULL};
    char *err = NULL;
    cr_expect_eq(run_attnd(args, NULL, 30, NULL, &err), 2, "%s %s", bad[i].flag, bad[i].url);
    cr_expect(err && strstr(err, bad[i].says), "%s %s: %s", bad[i].flag, bad[i].url, err);
    free(err);
  }
}
