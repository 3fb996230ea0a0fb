/*
 * test_session_files.c — --session-dir against whoever else can write in
 * it: a hard link planted at a session's temporary file name is not
 * written through at the graceful shutdown (the file it points at keeps
 * its bytes, and the session comes back); a file name holding a newline
 * and a terminal escape reaches the log escaped, on one line; and a
 * session saved with a ttl_s past the --session-ttl-max of the next start
 * is loaded cut to it.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(session_files, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"

static void create(const char *id, const char *ttl) {
  char path[128], body[256];
  const char *h[] = {JSON_CT, NULL};
  http_res r;
  snprintf(path, sizeof path, "/v1/sessions/%s", id);
  snprintf(body, sizeof body,
           "{\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", \"max_tokens\": 16%s%s}",
           ttl ? ", \"ttl_s\": " : "", ttl ? ttl : "");
  cr_assert_eq(http_call(&S, "PUT", path, h, body, strlen(body), &r), 201, "create %s: %s", id,
               r.body);
  http_res_free(&r);
}

/* Two tokens appended to session id. */
static void append(const char *id) {
  char path[128];
  const char *h[] = {JSON_CT, NULL};
  const char *body = "{\"q\": [[[1, 0]]], \"k\": [[[1, 0], [0, 1]]], \"v\": [[[2, 3], [4, 5]]], "
                     "\"pos\": 0}";
  http_res r;
  snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
  cr_assert_eq(http_call(&S, "POST", path, h, body, strlen(body), &r), 200, "append %s: %s", id,
               r.body);
  http_res_free(&r);
}

static char *session_dir(void) {
  static char sd[512];
  snprintf(sd, sizeof sd, "%s/sessions", make_tmpdir());
  cr_assert_eq(mkdir(sd, 0700), 0);
  return sd;
}

Test(session_files, a_link_at_the_temporary_name_is_not_written_through) {
  char *sd = session_dir(), tmp[600], victim[600];
  srv_start(&S, "--session-memory", "16M", "--session-dir", sd, NULL);
  create("keep", NULL);
  append("keep");
  snprintf(victim, sizeof victim, "%s/../victim", sd);
  write_file(victim, "an operator's file");
  snprintf(tmp, sizeof tmp, "%s/@keep.kv.tmp", sd);
  cr_assert_eq(link(victim, tmp), 0, "cannot plant the link");
  cr_assert_eq(srv_stop(&S, 30), 0, "a graceful stop");
  size_t len;
  char *text = read_file_all(victim, &len);
  cr_expect(text && !strcmp(text, "an operator's file"),
            "the save wrote through the link: %zu bytes", len);
  free(text);
  srv_start(&S, "--session-memory", "16M", "--session-dir", sd, NULL);
  http_res r;
  http_get(&S, "/v1/sessions/keep", &r);
  cr_expect(r.status == 200 && strstr(r.body, "\"lengths\": [2]"), "%ld %s", r.status, r.body);
  http_res_free(&r);
}

Test(session_files, a_file_name_is_escaped_in_the_log) {
  char *sd = session_dir(), bad[600];
  snprintf(bad, sizeof bad, "%s/x@a\nattnd: FORGED\x1b[2J.kv", sd);
  write_file(bad, "not a session file");
  srv_start(&S, "--session-memory", "16M", "--session-dir", sd, NULL);
  cr_assert(srv_wait_log(&S, "sessions: loaded 0", 10), "no line for the load");
  char *log = srv_log(&S);
  cr_expect(!strchr(log, '\x1b'), "a terminal escape reached the log:\n%s", log);
  cr_expect(!strstr(log, "\nattnd: FORGED"), "a file name began a line of the log:\n%s", log);
  cr_expect(strstr(log, "x@a\\x0aattnd: FORGED\\x1b[2J.kv"), "the name is not escaped:\n%s", log);
  free(log);
}

Test(session_files, a_ttl_past_the_next_starts_max_is_cut_to_it) {
  char *sd = session_dir();
  srv_start(&S, "--session-memory", "16M", "--session-dir", sd, "--session-ttl-max", "10000", NULL);
  create("long", "5000");
  cr_assert_eq(srv_stop(&S, 30), 0, "a graceful stop");
  srv_start(&S, "--session-memory", "16M", "--session-dir", sd, "--session-ttl-max", "100", NULL);
  http_res r;
  http_get(&S, "/v1/sessions/long", &r);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect(strstr(r.body, "\"ttl_s\": 100,"), "%s", r.body);
  const char *left = strstr(r.body, "\"expires_in_s\": ");
  cr_expect(left && strtod(left + 16, NULL) <= 100, "%s", r.body);
  http_res_free(&r);
  cr_expect(srv_wait_log(&S, "loaded with ttl_s 100", 10), "no line says the ttl was cut");
}
