/*
 * test_session_quota.c — one API key cannot take all of the session
 * memory: under two keys, a key's creates stop at its share
 * (--session-memory-per-key, default half) with 507 session_memory_full
 * while the other key still creates; the share from the flag, from its
 * variable, as a size or a percentage, and no share without keys or at 0;
 * the refusals counted in /metrics; and /metrics showing a key its own
 * series only, never another key's name or count.
 *
 * Every session here is the smallest: one layer, one KV head, head_dim 2,
 * F32, max_tokens 1 — one page of K and one of V, 128 KiB. Under
 * --session-memory 2M the pool holds 16.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) {
  srv_cleanup(&S);
  remove_tmpdir();
}
TestSuite(session_quota, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define KEY_A "alice-key-0123456789"
#define KEY_B "bob-key-9876543210"
/* a name found nowhere else in /metrics, so that its absence means something */
#define NAME_B "bobtenant"
#define SMALL "{\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", \"max_tokens\": 1}"
#define SESSION_BYTES (128 << 10)

static const char *const HA[] = {"Authorization: Bearer " KEY_A, JSON_CT, NULL};
static const char *const HB[] = {"Authorization: Bearer " KEY_B, JSON_CT, NULL};
static const char *const HNONE[] = {JSON_CT, NULL};

/* A key file naming the two keys alice and NAME_B; its path (static). */
static const char *key_file(void) {
  static char path[160];
  snprintf(path, sizeof path, "%s/keys", make_tmpdir());
  write_file(path, "alice:" KEY_A "\n" NAME_B ":" KEY_B "\n");
  return path;
}

static long create(const char *const *h, const char *prefix, int i, http_res *r) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s-%d", prefix, i);
  return http_call(&S, "PUT", path, h, SMALL, strlen(SMALL), r);
}

/* Creates prefix-0, prefix-1, ... until one is refused (at most `most`
 * tries); returns how many were made. The refusal must be the 507. */
static int fill(const char *const *h, const char *prefix, int most) {
  int made = 0;
  for (; made < most; made++) {
    http_res r;
    long st = create(h, prefix, made, &r);
    if (st != 201) {
      expect_error(&r, 507, "session_memory_full", prefix);
      http_res_free(&r);
      break;
    }
    http_res_free(&r);
  }
  return made;
}

/* The caller's memory object of GET /v1/sessions: one number of it. */
static double memory_field(const char *const *h, const char *name) {
  http_res r;
  cr_assert_eq(http_call(&S, "GET", "/v1/sessions", h, NULL, 0, &r), 200, "%s", r.body);
  cJSON *j = cJSON_Parse(r.body);
  cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "memory");
  cJSON *f = cJSON_GetObjectItemCaseSensitive(m, name);
  cr_expect(cJSON_IsNumber(f), "no memory.%s in %s", name, r.body);
  double v = cJSON_IsNumber(f) ? f->valuedouble : -1;
  cJSON_Delete(j);
  http_res_free(&r);
  return v;
}

static char *metrics_as(const char *const *h) {
  http_res r;
  cr_assert_eq(http_call(&S, "GET", "/metrics", h, NULL, 0, &r), 200);
  char *body = strdup(r.body);
  http_res_free(&r);
  return body;
}

/* Under two keys and the default, one create of more than half the pool
 * is refused, and alice's small creates stop at half (8 of 16) with a 507
 * that gives the numbers; bob still creates, up to his
 * own half; a delete of alice's makes room for one more of hers. */
Test(session_quota, one_key_cannot_lock_the_other_out) {
  srv_start(&S, "--api-key-file", key_file(), "--session-memory", "2M", NULL);
  /* one large create first: 9 pages of K and 9 of V, more than half */
  const char *large = "{\"heads_kv\": 1, \"head_dim\": 2, \"dtype\": \"F32\", "
                      "\"max_tokens\": 73728}";
  http_res r;
  http_call(&S, "PUT", "/v1/sessions/large", HA, large, strlen(large), &r);
  cr_expect(expect_error(&r, 507, "session_memory_full", "one create past the share"));
  http_res_free(&r);
  cr_expect_eq(fill(HA, "a", 40), 8, "alice stops at half of the pool");
  create(HA, "a", 99, &r);
  cr_expect(expect_error(&r, 507, "session_memory_full", "past the share"));
  cr_expect(strstr(r.body, "--session-memory-per-key") && strstr(r.body, "131072") &&
                strstr(r.body, "1048576"),
            "the message gives the flag, what is needed and the share: %s", r.body);
  http_res_free(&r);
  cr_expect_eq(memory_field(HA, "key_reserved_bytes"), 8 * SESSION_BYTES);
  cr_expect_eq(memory_field(HA, "per_key_bytes"), 1 << 20);
  cr_expect_eq(memory_field(HB, "key_reserved_bytes"), 0, "bob's own, not alice's");

  cr_expect_eq(create(HB, "b", 0, &r), 201, "bob creates while alice is at her share: %s", r.body);
  http_res_free(&r);
  cr_expect_eq(fill(HB, "bb", 40), 7, "and up to his own half");

  cr_expect_eq(http_call(&S, "DELETE", "/v1/sessions/a-3", HA, NULL, 0, &r), 204);
  http_res_free(&r);
  cr_expect_eq(create(HA, "a", 50, &r), 201, "a delete gives alice room again: %s", r.body);
  http_res_free(&r);
}

/* The share as a percentage on the command line, and as a size in
 * ATTND_SESSION_MEMORY_PER_KEY; the flag wins over the variable. */
Test(session_quota, the_share_from_the_flag_and_the_variable) {
  const char *file = key_file();
  srv_start(&S, "--api-key-file", file, "--session-memory", "2M", "--session-memory-per-key", "25%",
            NULL);
  cr_expect_eq(fill(HA, "a", 40), 4, "25% of 2M: four sessions");
  cr_expect_eq(fill(HB, "b", 40), 4);
  srv_cleanup(&S);

  const char *args[] = {"--api-key-file", file, "--session-memory", "2M", NULL};
  const char *env[] = {"ATTND_SESSION_MEMORY_PER_KEY=256K", NULL};
  srv_startv(&S, args, env, true);
  cr_expect_eq(fill(HA, "a", 40), 2, "256K: two sessions");
  cr_expect_eq(memory_field(HA, "per_key_bytes"), 256 << 10);
  srv_cleanup(&S);

  const char *args2[] = {
      "--api-key-file", file, "--session-memory", "2M", "--session-memory-per-key", "384K", NULL};
  srv_startv(&S, args2, env, true);
  cr_expect_eq(fill(HA, "a", 40), 3, "the flag wins over the variable");
}

/* Without keys there is one tenant and no share (it would lock nobody
 * out); 0 turns the share off under keys too; a bad value exits 2 naming
 * the flag or the variable. */
Test(session_quota, no_share_without_keys_or_at_zero) {
  srv_start(&S, "--session-memory", "2M", NULL);
  cr_expect_eq(fill(HNONE, "n", 40), 16, "one tenant takes the pool");
  cr_expect_eq(memory_field(HNONE, "per_key_bytes"), 0);
  srv_cleanup(&S);
  srv_start(&S, "--api-key-file", key_file(), "--session-memory", "2M", "--session-memory-per-key",
            "0", NULL);
  cr_expect_eq(fill(HA, "a", 40), 16, "0: no share");

  const char *bad[] = {"--session-memory-per-key", "120%", NULL};
  char *err = NULL;
  cr_expect_eq(run_attnd(bad, NULL, 30, NULL, &err), 2);
  cr_expect(err && strstr(err, "--session-memory-per-key"), "%s", err ? err : "");
  free(err);
  const char *env[] = {"ATTND_SESSION_MEMORY_PER_KEY=lots", NULL};
  err = NULL;
  cr_expect_eq(run_attnd(NULL, env, 30, NULL, &err), 2);
  cr_expect(err && strstr(err, "ATTND_SESSION_MEMORY_PER_KEY"), "%s", err ? err : "");
  free(err);
}

/* attnd_session_per_key_refused_total counts the creates refused for the
 * share, and not those refused because the pool itself is full. */
Test(session_quota, the_refusals_are_counted) {
  srv_start(&S, "--api-key-file", key_file(), "--session-memory", "2M", "--session-memory-per-key",
            "75%", NULL);
  const char *fam = "attnd_session_per_key_refused_total";
  char *m = metrics_as(HA);
  cr_expect_eq(prom_sum(m, fam, NULL, NULL), 0, "%s", m);
  free(m);
  cr_expect_eq(fill(HA, "a", 40), 12, "75%% of 16");
  http_res r;
  create(HA, "a", 77, &r);
  http_res_free(&r);
  cr_expect_eq(fill(HB, "b", 40), 4, "bob is within his share, but the pool is full");
  m = metrics_as(HA);
  int n = 0;
  cr_expect_eq(prom_sum(m, fam, NULL, &n), 2, "alice's two refusals, not bob's:\n%s", m);
  cr_expect_eq(n, 1, "one series, no key label");
  cr_expect(!strstr(m, fam) || !strstr(strstr(m, fam), "key="), "no key label");
  free(m);
}

/* A key sees its own series of attnd_requests_by_key_total only: alice's
 * /metrics never names bob's key nor counts his requests, and his never
 * hers. */
Test(session_quota, metrics_show_a_key_only_its_own) {
  srv_start(&S, "--api-key-file", key_file(), "--session-memory", "2M", NULL);
  http_res r;
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(create(HB, "b", i, &r), 201);
    http_res_free(&r);
  }
  cr_expect_eq(create(HA, "a", 0, &r), 201);
  http_res_free(&r);
  srv_wait_log(&S, "key=" NAME_B, 10);
  char *m = metrics_as(HA);
  cr_expect(!strstr(m, NAME_B), "bob's name in alice's /metrics:\n%s", m);
  int n = 0;
  const char *mine[] = {"key=alice", NULL};
  prom_sum(m, "attnd_requests_by_key_total", NULL, &n);
  cr_expect_eq(n, 1, "alice's series only:\n%s", m);
  cr_expect_geq(prom_sum(m, "attnd_requests_by_key_total", mine, NULL), 0);
  free(m);
  m = metrics_as(HB);
  cr_expect(!strstr(m, "alice"), "alice's name in bob's /metrics:\n%s", m);
  n = 0;
  const char *his[] = {"key=" NAME_B, NULL};
  prom_sum(m, "attnd_requests_by_key_total", his, &n);
  cr_expect_eq(n, 1, "bob's own series:\n%s", m);
  free(m);
}
