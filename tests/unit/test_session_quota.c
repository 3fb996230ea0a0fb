/*
 * test_session_quota.c — the per-tenant cap of a session store
 * (attn_kv_set_tenant_cap, engine/kvquota.c): one tenant's creates stop at
 * the cap while another's go on, a delete or an expiry makes room, a
 * retried create takes nothing more, the refusals are counted; sessions
 * loaded from a directory are kept whatever the cap; and the metrics a
 * key's caller sees (attnd_metrics_render_for) name no other key.
 * tests/server/test_session_quota.c drives the same through attnd.
 */
#include "helpers.h"
#include "kvcalls.h"
#include "metrics.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE ((uint64_t)64 << 10)
/* one KV head, one layer, one page of tokens: 2 pages (K and V) */
static const attn_kv_shape SMALL = {
    .heads_kv = 1, .head_dim = 2, .dtype = ATTN_F32, .layers = 1, .max_tokens = 1};

static int make(attn_kv_store *kv, const char *tenant, const char *id, double ttl, double now,
                attn_status *st) {
  bool created;
  return attn_kv_create(kv, tenant, id, &SMALL, ttl, now, &created, st);
}

/* Sessions tenant-0, tenant-1, ... until one is refused; how many. */
static int fill(attn_kv_store *kv, const char *tenant, double ttl, double now, attn_status *st) {
  char id[32];
  int n = 0;
  for (; n < 64; n++) {
    snprintf(id, sizeof id, "%s-%d", tenant, n);
    if (make(kv, tenant, id, ttl, now, st))
      break;
  }
  return n;
}

Test(session_quota, one_tenant_stops_at_the_cap) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * PAGE, false, "cpu");
  attn_kv_set_tenant_cap(kv, 8 * PAGE + 100); /* whole pages: 8 */
  attn_status st;
  cr_expect_eq(fill(kv, "a", 60, 0, &st), 4);
  cr_expect_eq(st.code, ATTN_ESESSION_MEMORY);
  cr_expect(strstr(st.message, "--session-memory-per-key") && strstr(st.message, "131072") &&
                strstr(st.message, "524288"),
            "%s", st.message);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "a"), 8 * PAGE);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "b"), 0);
  cr_expect_eq(make(kv, "a", "a-0", 60, 1, &st), 0, "a retried create takes nothing more");
  cr_expect_eq(fill(kv, "b", 60, 0, &st), 4, "another tenant goes on");
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.tenant_cap_refused, 2);
  cr_expect_eq(stats.tenant_cap_bytes, 8 * PAGE);
  cr_expect_eq(stats.reserved_bytes, 16 * PAGE);
  cr_assert_eq(attn_kv_delete(kv, "a", "a-2", 0, &st), 0);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "a"), 6 * PAGE);
  cr_expect_eq(make(kv, "a", "a-new", 60, 0, &st), 0, "a delete makes room: %s", st.message);
  attn_kv_set_tenant_cap(kv, 0);
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.tenant_cap_bytes, 0);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* The tenant's own sessions past their TTL give way to its create, as they
 * do for the pool; a cap below a page refuses every create, not none. */
Test(session_quota, expired_sessions_give_way) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * PAGE, false, "cpu");
  attn_kv_set_tenant_cap(kv, 4 * PAGE);
  attn_status st;
  cr_expect_eq(fill(kv, "a", 10, 0, &st), 2);
  cr_expect_eq(make(kv, "a", "late", 10, 10, &st), 0, "%s", st.message);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "a"), 2 * PAGE);
  attn_kv_set_tenant_cap(kv, 100);
  cr_expect_eq(make(kv, "b", "b", 10, 10, &st), ATTN_ESESSION_MEMORY);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Loading saved sessions is not held to the cap (they were made under the
 * cap of then), but they count: the next create is refused. */
Test(session_quota, loaded_sessions_are_kept_and_counted) {
  char dir[] = "/tmp/attn-quota-XXXXXX";
  cr_assert(mkdtemp(dir));
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * PAGE, false, "cpu");
  attn_status st;
  cr_expect_eq(fill(kv, "a", 600, 0, &st), 8);
  cr_assert_eq(attn_kv_save(kv, dir, 0, &st), 8, "%s", st.message);
  attn_kv_close(kv);
  kv = tkv_open_store(e, 16 * PAGE, false, "cpu");
  attn_kv_set_tenant_cap(kv, 4 * PAGE);
  cr_expect_eq(attn_kv_load(kv, dir, 1, 86400, NULL, NULL, &st), 8, "%s", st.message);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "a"), 16 * PAGE);
  cr_expect_eq(make(kv, "a", "more", 600, 1, &st), ATTN_ESESSION_MEMORY);
  attn_kv_close(kv);
  attn_engine_close(e);
  rmdir(dir);
}

/* What GET /metrics renders for a caller: its own key's series only. */
Test(session_quota, metrics_for_a_key_name_no_other) {
  const char *labels[] = {"/metrics"};
  attnd_metrics *m = attnd_metrics_new(labels, 1);
  cr_assert_not_null(m);
  const char *names[] = {"alice", "bob.ops"};
  cr_assert_eq(attnd_metrics_keys(m, names, 2), 0);
  attnd_metrics_request_key(m, "bob.ops");
  attnd_metrics_request_key(m, "alice");
  attnd_metrics_request_key(m, "alice");
  char *out = attnd_metrics_render_for(m, "alice", NULL);
  cr_assert_not_null(out);
  cr_expect(strstr(out, "attnd_requests_by_key_total{key=\"alice\"} 2\n"), "%s", out);
  cr_expect(!strstr(out, "bob"), "%s", out);
  free(out);
  out = attnd_metrics_render_for(m, "bob.ops", NULL);
  cr_expect(strstr(out, "attnd_requests_by_key_total{key=\"bob.ops\"} 1\n"), "%s", out);
  cr_expect(!strstr(out, "alice"), "%s", out);
  free(out);
  attnd_metrics_free(m);
}
