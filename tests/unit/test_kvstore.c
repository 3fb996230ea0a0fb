/*
 * test_kvstore.c — the session store (engine/kv/kv.h): a session's
 * calls checked against the float64 reference over exactly the keys the
 * session should hold (prefill, then token-by-token decode, in every
 * dtype and on every CPU kernel this machine runs), replays bit for bit,
 * conflicts that append nothing, truncation, layers, limits, memory, TTL,
 * tenants, the batch call against single calls, and concurrent calls;
 * pages of 16 and 32 KiB (attn_kv_open_paged): decode over 64-token pages
 * on every kernel, what a session reserves at each size, a bad size, and
 * a shape too wide for the page refused naming the size that takes it.
 */
#include "helpers.h"
#include "kvcalls.h"
#include "reference.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Prefill of `pre` tokens, then one token a step to s->n, each checked. */
static int decode_checked(attn_kv_store *kv, const char *id, const tkv_stream *s,
                          const tkv_opts *op, int64_t pre, const char *what) {
  const tkv_plan pl = {.pre = pre};
  char why[200] = "";
  int fails = tkv_decode(kv, id, s, op, &pl, why, sizeof why);
  if (fails)
    cr_log_error("%s: %d steps failed, the first at %s", what, fails, why);
  return fails;
}

#define MIB ((uint64_t)1 << 20)

Test(kvstore, decode_every_dtype_and_kernel, .timeout = 600) {
  const attn_dtype dts[3] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  int fails = 0;
  for (int k = 0; k < NISAS; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    attn_kv_store *kv = tkv_open_store(e, 64 * MIB, k % 2 == 0, NULL);
    for (int t = 0; t < 3; t++) {
      char id[32], what[96];
      snprintf(id, sizeof id, "s-%d", t);
      tkv_stream s = tkv_stream_make(8, 2, 64, 200, dts[t], 7 + (uint64_t)t);
      tkv_make(kv, "", id, &s, 1, 4096, 600, 0);
      snprintf(what, sizeof what, "%s %s", isas[k], attn_dtype_name(dts[t]));
      tkv_opts op = tkv_plain;
      op.stats = t == 1;
      fails += decode_checked(kv, id, &s, &op, 160, what);
      tkv_stream_free(&s);
    }
    attn_kv_close(kv);
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d steps off the reference", fails);
}

/* Past 1024 keys a decode step's keys are split over the threads; with
 * windows and softcap on, and MQA. */
Test(kvstore, long_decode_split_window_softcap, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 256 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(4, 1, 128, 1300, ATTN_BF16, 3);
  tkv_make(kv, "", "long", &s, 1, 2000, 600, 0);
  tkv_opts op = tkv_plain;
  op.wl = 700;
  op.softcap = 30;
  op.stats = true;
  cr_assert_eq(decode_checked(kv, "long", &s, &op, 1296, "long"), 0);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, replay_is_bit_equal_and_conflicts_append_nothing) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(4, 2, 32, 40, ATTN_F16, 11);
  tkv_make(kv, "", "r", &s, 1, 64, 600, 0);
  tkv_reply first, again, y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "r", &s, &tkv_plain, 0, 30, 0, 30, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  cr_assert_eq(tkv_call1(kv, "", "r", &s, &tkv_plain, 30, 1, 30, 1, &first, 0, &st), 0);
  cr_assert_eq(tkv_call1(kv, "", "r", &s, &tkv_plain, 31, 2, 31, 2, &y, 0, &st), 0);
  tkv_reply_free(&y);
  /* the step at 30 again: a replay, the first tkv_reply's bits, nothing appended */
  cr_assert_eq(tkv_call1(kv, "", "r", &s, &tkv_plain, 30, 1, 30, 1, &again, 0, &st), 0, "%s",
               st.message);
  cr_expect(again.replay && !first.replay);
  cr_expect_eq(again.length, 33);
  cr_expect_eq(memcmp(first.o, again.o, (size_t)(4 * 32 * 2)), 0, "a replay's O differs");
  tkv_reply_free(&again);
  /* past the length, and before it with other tokens: conflicts */
  cr_expect_eq(tkv_call1(kv, "", "r", &s, &tkv_plain, 34, 1, 34, 1, &y, 0, &st),
               ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "length 33"), "%s", st.message);
  tkv_reply_free(&y);
  tkv_stream other = tkv_stream_make(4, 2, 32, 40, ATTN_F16, 12);
  cr_expect_eq(tkv_call1(kv, "", "r", &other, &tkv_plain, 31, 1, 31, 1, &y, 0, &st),
               ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "not a replay"), "%s", st.message);
  tkv_reply_free(&y);
  attn_kv_info info;
  int64_t len = -1;
  cr_assert_eq(attn_kv_get(kv, "", "r", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 33, "a conflict appended: length %lld", (long long)len);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.replays, 1);
  cr_expect_eq(stats.conflicts, 2);
  cr_expect_eq(stats.appended_tokens, 33);
  tkv_reply_free(&first);
  tkv_stream_free(&other);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, truncate_then_append_other_tokens) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, false, NULL);
  tkv_stream a = tkv_stream_make(4, 2, 64, 300, ATTN_F32, 21),
             b = tkv_stream_make(4, 2, 64, 300, ATTN_F32, 22);
  tkv_make(kv, "", "t", &a, 1, 512, 600, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "t", &a, &tkv_plain, 0, 300, 0, 300, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  cr_assert_eq(attn_kv_truncate(kv, "", "t", 100, 0, &st), 0);
  /* b's tokens [100, 300) with a's first 100: build the tkv_stream both hold */
  size_t w = 64 * 4;
  for (int64_t h = 0; h < 2; h++) {
    memcpy((char *)b.k + (size_t)(h * 300) * w, (char *)a.k + (size_t)(h * 300) * w, 100 * w);
    memcpy((char *)b.v + (size_t)(h * 300) * w, (char *)a.v + (size_t)(h * 300) * w, 100 * w);
  }
  cr_assert_eq(tkv_call1(kv, "", "t", &b, &tkv_plain, 100, 200, 100, 200, &y, 0, &st), 0, "%s",
               st.message);
  cr_expect_eq(y.length, 300);
  cr_expect_leq(tkv_ref_error(&b, &tkv_plain, 100, 200, 300, &y), ttol(ATTN_F32));
  tkv_reply_free(&y);
  tkv_stream_free(&a);
  tkv_stream_free(&b);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, layers_limits_and_refusals) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(4, 2, 16, 20, ATTN_BF16, 31);
  tkv_make(kv, "", "l", &s, 3, 16, 600, 0);
  tkv_reply y;
  attn_status st;
  tkv_opts op = tkv_plain;
  op.layer = 2;
  cr_assert_eq(tkv_call1(kv, "", "l", &s, &op, 0, 5, 0, 5, &y, 0, &st), 0, "%s", st.message);
  tkv_reply_free(&y);
  op.layer = 1;
  cr_assert_eq(tkv_call1(kv, "", "l", &s, &op, 0, 3, 0, 3, &y, 0, &st), 0);
  cr_expect_leq(tkv_ref_error(&s, &op, 0, 3, 3, &y), ttol(ATTN_BF16));
  tkv_reply_free(&y);
  int64_t len[3];
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "l", 0, &info, len, 3, &st), 0);
  cr_expect(len[0] == 0 && len[1] == 3 && len[2] == 5);
  op.layer = 3;
  cr_expect_eq(tkv_call1(kv, "", "l", &s, &op, 0, 1, 0, 1, &y, 0, &st), ATTN_EINVAL);
  tkv_reply_free(&y);
  op.layer = 2;
  cr_expect_eq(tkv_call1(kv, "", "l", &s, &op, 5, 12, 5, 12, &y, 0, &st), ATTN_ESESSION_FULL);
  tkv_reply_free(&y);
  tkv_stream f = tkv_stream_make(4, 2, 16, 20, ATTN_F16, 32);
  cr_expect_eq(tkv_call1(kv, "", "l", &f, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_EDTYPE);
  tkv_reply_free(&y);
  tkv_stream g = tkv_stream_make(4, 4, 16, 20, ATTN_BF16, 33);
  cr_expect_eq(tkv_call1(kv, "", "l", &g, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_ESHAPE);
  tkv_reply_free(&y);
  attn_store_elem(s.k, ATTN_BF16, 5 * 16 + 3, NAN); /* head 0, token 5 */
  cr_expect_eq(tkv_call1(kv, "", "l", &s, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_ENONFINITE);
  tkv_reply_free(&y);
  /* attend without new tokens: over the layer's whole length */
  cr_assert_eq(tkv_call1(kv, "", "l", &s, &op, 4, 1, 0, 0, &y, 0, &st), 0, "%s", st.message);
  cr_expect_eq(y.length, 5);
  cr_expect_leq(tkv_ref_error(&s, &op, 4, 1, 5, &y), ttol(ATTN_BF16));
  tkv_reply_free(&y);
  cr_expect_eq(tkv_call1(kv, "", "nobody", &s, &op, 0, 1, 0, 1, &y, 0, &st),
               ATTN_ESESSION_NOT_FOUND);
  tkv_reply_free(&y);
  tkv_stream_free(&s);
  tkv_stream_free(&f);
  tkv_stream_free(&g);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, memory_reserved_at_create_and_freed_by_delete) {
  attn_engine *e = topen(1, NULL);
  /* 16 pages of 64 KiB: a session of 2 KV heads, 1 layer, up to one page
   * of tokens reserves 4 (K and V of each head) */
  attn_kv_store *kv = tkv_open_store(e, 16 * 64 * 1024, true, NULL);
  attn_kv_shape sh = {
      .heads_kv = 2, .head_dim = 64, .dtype = ATTN_F32, .layers = 1, .max_tokens = 100};
  cr_expect_eq(attn_kv_reserve_bytes(kv, &sh), 4 * 64 * 1024);
  attn_status st;
  bool created;
  char id[16];
  for (int i = 0; i < 4; i++) {
    snprintf(id, sizeof id, "m%d", i);
    cr_assert_eq(attn_kv_create(kv, "", id, &sh, 60, 0, &created, &st), 0, "%s", st.message);
    cr_expect(created);
  }
  cr_expect_eq(attn_kv_create(kv, "", "m4", &sh, 60, 0, &created, &st), ATTN_ESESSION_MEMORY);
  cr_expect(strstr(st.message, "--session-memory"), "%s", st.message);
  /* a retried create is no new reservation; other parameters are a conflict */
  cr_expect_eq(attn_kv_create(kv, "", "m0", &sh, 60, 0, &created, &st), 0);
  cr_expect(!created);
  attn_kv_shape other = sh;
  other.max_tokens = 50;
  cr_expect_eq(attn_kv_create(kv, "", "m0", &other, 60, 0, &created, &st), ATTN_ESESSION_EXISTS);
  cr_assert_eq(attn_kv_delete(kv, "", "m1", 0, &st), 0);
  cr_expect_eq(attn_kv_delete(kv, "", "m1", 0, &st), ATTN_ESESSION_NOT_FOUND);
  cr_expect_eq(attn_kv_create(kv, "", "m4", &sh, 60, 0, &created, &st), 0, "%s", st.message);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.sessions, 4);
  cr_expect_eq(stats.reserved_bytes, 16 * 64 * 1024);
  cr_expect_eq(stats.used_bytes, 0);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, ttl_counts_from_the_last_use) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(2, 1, 8, 4, ATTN_F32, 41);
  tkv_make(kv, "", "ttl", &s, 1, 8, 5, 100);
  attn_kv_info info;
  attn_status st;
  tkv_reply y;
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 104, &info, NULL, 0, &st), 0);
  cr_expect_eq(info.expires, 105);
  cr_assert_eq(tkv_call1(kv, "", "ttl", &s, &tkv_plain, 0, 1, 0, 1, &y, 104, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 108.5, &info, NULL, 0, &st), 0, "a use renews the TTL");
  cr_expect_eq(attn_kv_expire(kv, 108.9), 0);
  cr_expect_eq(attn_kv_expire(kv, 109), 1);
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 109, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  tkv_make(kv, "", "ttl2", &s, 1, 8, 5, 200);
  cr_expect_eq(tkv_call1(kv, "", "ttl2", &s, &tkv_plain, 0, 1, 0, 1, &y, 205, &st),
               ATTN_ESESSION_NOT_FOUND, "an expired session was used");
  tkv_reply_free(&y);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.expired, 2);
  cr_expect_eq(stats.sessions, 0);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

static void count_one(const attn_kv_info *info, const int64_t *lengths, void *arg) {
  (void)info, (void)lengths;
  (*(int *)arg)++;
}

/* "tenant/id" of each session listed, joined by spaces, into arg (a
 * 64-byte buffer). */
static void name_one(const attn_kv_info *info, const int64_t *lengths, void *arg) {
  (void)lengths;
  char *out = arg;
  size_t n = strlen(out);
  snprintf(out + n, 64 - n, "%s%s/%s", n ? " " : "", info->tenant, info->id);
}

Test(kvstore, tenants_are_namespaces) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream a = tkv_stream_make(2, 1, 8, 4, ATTN_F32, 51),
             b = tkv_stream_make(2, 1, 8, 4, ATTN_F32, 52);
  tkv_make(kv, "alice", "x", &a, 1, 8, 60, 0);
  tkv_make(kv, "bob", "x", &b, 1, 8, 60, 0);
  tkv_make(kv, "bob", "y", &b, 1, 8, 60, 0);
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "alice", "x", &a, &tkv_plain, 0, 4, 0, 4, &y, 0, &st), 0);
  tkv_reply_free(&y);
  int64_t len = -1;
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "bob", "x", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0, "alice's append reached bob's session");
  cr_expect_eq(attn_kv_get(kv, "alice", "y", 0, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  cr_expect_eq(attn_kv_get(kv, "", "x", 0, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  int na = 0, nb = 0;
  cr_expect_eq(attn_kv_list(kv, "alice", 0, count_one, &na), 1);
  cr_expect_eq(attn_kv_list(kv, "bob", 0, count_one, &nb), 2);
  char names[64] = "";
  cr_expect_eq(attn_kv_list(kv, NULL, 0, name_one, names), 3, "NULL lists every tenant's");
  cr_expect(strstr(names, "alice/x") && strstr(names, "bob/x") && strstr(names, "bob/y"),
            "each with its tenant: %s", names);
  cr_expect_eq(attn_kv_delete(kv, "alice", "y", 0, &st), ATTN_ESESSION_NOT_FOUND);
  cr_expect_eq(attn_kv_truncate(kv, "alice", "y", 0, 0, &st), ATTN_ESESSION_NOT_FOUND);
  tkv_stream_free(&a);
  tkv_stream_free(&b);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, ids_checked) {
  attn_status st;
  cr_expect_eq(attn_kv_id_check("a.b_c-9", 7, &st), 0);
  cr_expect_eq(attn_kv_id_check("", 0, &st), ATTN_EINVAL);
  cr_expect_eq(attn_kv_id_check("_x", 2, &st), ATTN_EINVAL);
  cr_expect_eq(attn_kv_id_check(".x", 2, &st), ATTN_EINVAL);
  cr_expect_eq(attn_kv_id_check("a/b", 3, &st), ATTN_EINVAL);
  char big[130];
  memset(big, 'a', sizeof big);
  cr_expect_eq(attn_kv_id_check(big, 128, &st), 0);
  cr_expect_eq(attn_kv_id_check(big, 129, &st), ATTN_EINVAL);
}

Test(kvstore, batch_call_equals_single_calls_and_is_all_or_nothing, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s[3] = {tkv_stream_make(8, 2, 64, 1200, ATTN_BF16, 61),
                     tkv_stream_make(8, 2, 64, 40, ATTN_BF16, 62),
                     tkv_stream_make(8, 2, 64, 300, ATTN_BF16, 63)};
  const char *single[3] = {"a1", "b1", "c1"}, *batched[3] = {"a2", "b2", "c2"};
  const int64_t pre[3] = {1199, 39, 250};
  tkv_reply y;
  attn_status st;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      const char *id = j ? batched[i] : single[i];
      tkv_make(kv, "", id, &s[i], 2, 2048, 600, 0);
      cr_assert_eq(tkv_call1(kv, "", id, &s[i], &tkv_plain, 0, pre[i], 0, pre[i], &y, 0, &st), 0,
                   "%s", st.message);
      tkv_reply_free(&y);
    }
  /* a step of one token for a and b, two new tokens and three queries for c */
  tkv_batch bt = {{"a2", "b2", "c2"}, {&s[0], &s[1], &s[2]}, {1199, 39, 250}, {1, 1, 3}, {1, 1, 2}};
  void *bo;
  cr_assert_eq(tkv_call_batch(kv, &bt, 3, &bo, 0, &st), 0, "%s", st.message);
  size_t w = 64 * 2, off = 0;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(tkv_call1(kv, "", single[i], &s[i], &tkv_plain, bt.pos[i], bt.nq[i], bt.pos[i],
                           bt.nn[i], &y, 0, &st),
                 0, "%s", st.message);
    for (int64_t h = 0; h < 8; h++)
      cr_expect_eq(memcmp((char *)y.o + (size_t)(h * bt.nq[i]) * w,
                          (char *)bo + (size_t)(h * 5 + (int64_t)off) * w, (size_t)bt.nq[i] * w),
                   0, "session %d head %lld: the batch's O is not the single call's", i,
                   (long long)h);
    off += (size_t)bt.nq[i];
    tkv_reply_free(&y);
  }
  free(bo);
  /* one entry at a wrong pos refuses the call, naming it; nothing appended anywhere */
  tkv_batch bad = {
      {"a2", "b2", "c2"}, {&s[0], &s[2], &s[2]}, {1199, 30, 252}, {1, 1, 1}, {0, 1, 1}};
  cr_expect_eq(tkv_call_batch(kv, &bad, 3, &bo, 0, &st), ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "sessions[1]"), "%s", st.message);
  free(bo);
  int64_t len[2];
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "c2", 0, &info, len, 2, &st), 0);
  cr_expect_eq(len[0], 252, "a refused batch appended to c2");
  cr_assert_eq(attn_kv_get(kv, "", "b2", 0, &info, len, 2, &st), 0);
  cr_expect_eq(len[0], 40);
  tkv_batch dup = {
      {"a2", "a2", "c2"}, {&s[0], &s[0], &s[2]}, {1199, 1199, 252}, {1, 1, 1}, {0, 0, 0}};
  cr_expect_eq(tkv_call_batch(kv, &dup, 3, &bo, 0, &st), ATTN_EINVAL);
  free(bo);
  for (int i = 0; i < 3; i++)
    tkv_stream_free(&s[i]);
  attn_kv_close(kv);
  attn_engine_close(e);
}

typedef struct racer {
  attn_kv_store *kv;
  const char *id;
  const tkv_stream *s;
  int64_t pos, steps;
  int rc, fails;
  pthread_barrier_t *go;
} racer;

/* Decodes steps tokens from pos, each step checked against the reference. */
static void *decode_thread(void *arg) {
  racer *t = arg;
  pthread_barrier_wait(t->go);
  for (int64_t p = t->pos; p < t->pos + t->steps; p++) {
    tkv_reply y;
    attn_status st;
    t->rc = tkv_call1(t->kv, "", t->id, t->s, &tkv_plain, p, 1, p, 1, &y, 0, &st);
    if (t->rc == 0 && !(tkv_ref_error(t->s, &tkv_plain, p, 1, p + 1, &y) <= ttol(t->s->dt)))
      t->fails++;
    tkv_reply_free(&y);
    if (t->rc)
      break;
  }
  return NULL;
}

Test(kvstore, eight_sessions_decode_at_once, .timeout = 300) {
  const bool modes[2] = {false, true};
  for (int mode = 0; mode < 2; mode++) {
    attn_engine *e = topen(2, NULL);
    attn_kv_store *kv = tkv_open_store(e, 64 * MIB, modes[mode], NULL);
    tkv_stream s[8];
    racer t[8];
    pthread_t th[8];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 8);
    char ids[8][8];
    for (int i = 0; i < 8; i++) {
      snprintf(ids[i], sizeof ids[i], "d%d", i);
      s[i] = tkv_stream_make(8, 2, 64, 120, i % 2 ? ATTN_F16 : ATTN_F32, 70 + (uint64_t)i);
      tkv_make(kv, "", ids[i], &s[i], 1, 128, 600, 0);
      tkv_reply y;
      attn_status st;
      cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, 100, 0, 100, &y, 0, &st), 0);
      tkv_reply_free(&y);
      t[i] = (racer){kv, ids[i], &s[i], 100, 20, 0, 0, &go};
      pthread_create(&th[i], NULL, decode_thread, &t[i]);
    }
    for (int i = 0; i < 8; i++) {
      pthread_join(th[i], NULL);
      cr_expect_eq(t[i].rc, 0, "session %d: code %d", i, t[i].rc);
      cr_expect_eq(t[i].fails, 0, "session %d: %d steps off the reference", i, t[i].fails);
      tkv_stream_free(&s[i]);
    }
    attn_kv_stats st;
    attn_kv_stats_get(kv, &st);
    uint64_t jobs = 0;
    for (int b = 0; b < ATTN_KV_BATCH_BUCKETS; b++)
      jobs += st.batch_sizes[b];
    cr_expect_eq(st.batched_calls, 8 + 8 * 20, "every call computed once");
    if (!modes[mode])
      cr_expect_eq(jobs, st.batched_calls, "without batching, one job a call");
    cr_expect_leq(jobs, st.batched_calls);
    pthread_barrier_destroy(&go);
    attn_kv_close(kv);
    attn_engine_close(e);
  }
}

static void *append_once(void *arg) {
  racer *t = arg;
  tkv_reply y;
  attn_status st;
  pthread_barrier_wait(t->go);
  t->rc = tkv_call1(t->kv, "", t->id, t->s, &tkv_plain, t->pos, 1, t->pos, 1, &y, 0, &st);
  tkv_reply_free(&y);
  return NULL;
}

Test(kvstore, two_racing_appends_at_one_pos_one_wins, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  for (int round = 0; round < 20; round++) {
    tkv_stream a = tkv_stream_make(4, 2, 32, 8, ATTN_F32, 100 + (uint64_t)round),
               b = tkv_stream_make(4, 2, 32, 8, ATTN_F32, 200 + (uint64_t)round);
    char id[16];
    snprintf(id, sizeof id, "race%d", round);
    tkv_make(kv, "", id, &a, 1, 8, 600, 0);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    racer ta = {kv, id, &a, 0, 1, -1, 0, &go}, tb = {kv, id, &b, 0, 1, -1, 0, &go};
    pthread_t x, y;
    pthread_create(&x, NULL, append_once, &ta);
    pthread_create(&y, NULL, append_once, &tb);
    pthread_join(x, NULL);
    pthread_join(y, NULL);
    cr_expect((ta.rc == 0) != (tb.rc == 0), "round %d: codes %d and %d", round, ta.rc, tb.rc);
    cr_expect(ta.rc == ATTN_ESESSION_CONFLICT || tb.rc == ATTN_ESESSION_CONFLICT);
    int64_t len = -1;
    attn_kv_info info;
    attn_status st;
    cr_assert_eq(attn_kv_get(kv, "", id, 0, &info, &len, 1, &st), 0);
    cr_expect_eq(len, 1);
    pthread_barrier_destroy(&go);
    tkv_stream_free(&a);
    tkv_stream_free(&b);
  }
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, an_expired_session_gives_way_to_a_create) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 4 * 64 * 1024, true, NULL);
  attn_kv_shape sh = {.heads_kv = 2,
                      .head_dim = 64,
                      .dtype = ATTN_F32,
                      .layers = 1,
                      .max_tokens = 100}; /* 4 pages: the whole store */
  attn_status st;
  bool created;
  cr_assert_eq(attn_kv_create(kv, "", "old", &sh, 1, 0, &created, &st), 0, "%s", st.message);
  cr_expect_eq(attn_kv_create(kv, "", "new", &sh, 1, 0.5, &created, &st), ATTN_ESESSION_MEMORY,
               "a live session was evicted");
  cr_expect_eq(attn_kv_create(kv, "", "new", &sh, 1, 1.5, &created, &st), 0, "%s", st.message);
  attn_kv_info info;
  cr_expect_eq(attn_kv_get(kv, "", "old", 1.5, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* The entries' new rows tile k and v, every row used once: a row left over
 * or taken out of order is refused before anything is appended. */
Test(kvstore, new_rows_tile_k_and_v) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(2, 1, 8, 4, ATTN_F32, 81);
  tkv_make(kv, "", "t", &s, 1, 8, 60, 0);
  float o[16];
  attn_kv_entry en = {.id = "t", .pos = 0, .n_new = 1};
  attn_kv_call c = {
      .tenant = "", .nentries = 1, .entries = &en, .k_new = s.k, .v_new = s.v, .total_new = 2};
  attn_request_init(&c.req);
  c.req.heads_q = 2;
  c.req.heads_kv = 1;
  c.req.head_dim = 8;
  c.req.seq_q = 1;
  c.req.q = s.q;
  c.req.o = o;
  attn_status st;
  cr_expect_eq(tkv_run(kv, &c, 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "2 new rows"), "%s", st.message);
  c.total_new = 1;
  en.kv_off = 1;
  cr_expect_eq(tkv_run(kv, &c, 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "rows 0 and on"), "%s", st.message);
  int64_t len = -1;
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "t", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Pages of 16 KiB and 32 KiB (attn_kv_open_paged): a session's decode over
 * 64-token pages, prefill across several of them, on every CPU kernel
 * this machine runs. */
Test(kvstore, small_pages_decode_every_kernel, .timeout = 600) {
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  int fails = 0;
  for (int k = 0; k < NISAS; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    for (size_t pb = 16 << 10; pb <= 32 << 10; pb *= 2) {
      attn_kv_store *kv = tkv_open_paged(e, 64 * MIB, pb);
      for (int t = 0; t < 2; t++) {
        char id[32], what[96];
        snprintf(id, sizeof id, "s-%d", t);
        /* D 128: 64 rows of BF16 a 16 KiB page, 32 of F32; D 64 F32: 64 */
        tkv_stream s = tkv_stream_make(8, 2, t ? 128 : 64, 220, dts[t], 70 + (uint64_t)t);
        tkv_make(kv, "", id, &s, 1, 1000, 600, 0);
        snprintf(what, sizeof what, "%s %s, %zu-byte pages", isas[k], attn_dtype_name(dts[t]), pb);
        fails += decode_checked(kv, id, &s, &tkv_plain, 150, what);
        tkv_stream_free(&s);
      }
      attn_kv_close(kv);
    }
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d steps off the reference", fails);
}

static int64_t reserve_pages_at(attn_engine *e, size_t pb, const attn_kv_shape *sh) {
  attn_kv_store *kv = tkv_open_paged(e, 64 * MIB, pb);
  attn_kv_stats st;
  attn_kv_stats_get(kv, &st);
  cr_expect_eq(st.page_bytes, (int64_t)pb);
  cr_expect_eq(st.pool_bytes, 64 * MIB);
  const uint64_t b = attn_kv_reserve_bytes(kv, sh);
  cr_expect_eq(b % pb, 0);
  attn_kv_close(kv);
  return (int64_t)(b / pb);
}

/* The tokens a page holds, and so what a session reserves, at each page
 * size: a GQA D128 BF16 row is 256 bytes (64, 128, 256 tokens a page); a
 * short session of many layers wastes less of small pages. */
Test(kvstore, page_size_reservations) {
  attn_engine *e = topen(1, NULL);
  attn_kv_shape gqa = {
      .heads_kv = 8, .head_dim = 128, .dtype = ATTN_BF16, .layers = 1, .max_tokens = 4096};
  attn_kv_shape small = {
      .heads_kv = 3, .head_dim = 128, .dtype = ATTN_BF16, .layers = 30, .max_tokens = 49};
  for (size_t pb = 16 << 10, i = 0; pb <= 64 << 10; pb *= 2, i++) {
    /* 4096 tokens: 2 x 8 x 4096 / (64 << i) pages, the same 16 MiB at every size */
    cr_expect_eq(reserve_pages_at(e, pb, &gqa), 2 * 8 * (4096 >> (6 + i)), "%zu", pb);
    /* 49 tokens: one page per (layer, head, K/V) whatever its size */
    cr_expect_eq(reserve_pages_at(e, pb, &small), 2 * 30 * 3, "%zu", pb);
  }
  attn_kv_store *kv = tkv_open_paged(e, 64 * MIB, 16 << 10);
  cr_expect_eq(attn_kv_reserve_bytes(kv, &small), 2 * 30 * 3 * (uint64_t)(16 << 10)); /* 2.9 MB */
  /* an uneven row: 16 KiB / (80 x 4) = 51 rows: 48 a page (a multiple of 16) */
  attn_kv_shape odd = {
      .heads_kv = 1, .head_dim = 80, .dtype = ATTN_F32, .layers = 1, .max_tokens = 100};
  cr_expect_eq(attn_kv_reserve_bytes(kv, &odd), 2 * 3 * (uint64_t)(16 << 10));
  /* the tenant cap is whole pages of the store's size */
  attn_kv_set_tenant_cap(kv, 40 << 10);
  attn_kv_stats st;
  attn_kv_stats_get(kv, &st);
  cr_expect_eq(st.tenant_cap_bytes, 32 << 10);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* A page size not 16, 32 or 64 KiB is refused; 0 is the default. */
Test(kvstore, page_size_refused) {
  attn_engine *e = topen(1, NULL);
  const size_t bad[] = {20 << 10, 8 << 10, 1 << 20, 48 << 10};
  attn_kv_store *kv = NULL;
  attn_status st;
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(attn_kv_open_paged(e, 64 * MIB, bad[i], true, "cpu", &kv, &st), ATTN_EINVAL, "%zu",
                 bad[i]);
    cr_expect(strstr(st.message, "16K, 32K or 64K"), "%s", st.message);
  }
  cr_assert_eq(attn_kv_open_paged(e, 64 * MIB, 0, true, NULL, &kv, &st), 0, "%s", st.message);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.page_bytes, 64 << 10);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Rows too wide for 16 to a page: D 576 BF16 (1152 bytes) fits 14 to a 16
 * KiB page, refused naming the row's bytes, the page's and the flag that
 * takes it; at 32 KiB it is made and computes right. */
Test(kvstore, too_wide_for_the_page, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *small = tkv_open_paged(e, 64 * MIB, 16 << 10);
  attn_kv_store *mid = tkv_open_paged(e, 64 * MIB, 32 << 10);
  tkv_stream s = tkv_stream_make_dv(16, 1, 576, 512, true, 40, ATTN_BF16, 5);
  attn_kv_shape sh = {.heads_kv = 1,
                      .head_dim = 576,
                      .head_dim_v = 512,
                      .v_from_k = true,
                      .dtype = ATTN_BF16,
                      .layers = 1,
                      .max_tokens = 64};
  attn_status st;
  bool created;
  cr_expect_eq(attn_kv_create(small, "", "mla", &sh, 60, 0, &created, &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "1152 bytes") && strstr(st.message, "16384 bytes") &&
                strstr(st.message, "--session-page-bytes 32K"),
            "%s", st.message);
  /* quantized, the row is 580 bytes: 28 fit */
  sh.kv_quant = ATTN_KVQ_I8;
  cr_expect_eq(attn_kv_create(small, "", "mla8", &sh, 60, 0, &created, &st), 0, "%s", st.message);
  sh.kv_quant = ATTN_KVQ_NONE;
  cr_assert_eq(attn_kv_create(mid, "", "mla", &sh, 60, 0, &created, &st), 0, "%s", st.message);
  cr_expect_eq(attn_kv_reserve_bytes(mid, &sh), 4 * (uint64_t)(32 << 10)); /* 16 tokens a page */
  cr_expect_eq(decode_checked(mid, "mla", &s, &tkv_plain, 20, "D576 at 32 KiB"), 0);
  /* F32 D 576 (2304 bytes) fits no page but 64 KiB's */
  sh.dtype = ATTN_F32;
  cr_expect_eq(attn_kv_create(mid, "", "f32", &sh, 60, 0, &created, &st), ATTN_EUNSUPPORTED);
  cr_expect(strstr(st.message, "--session-page-bytes 64K"), "%s", st.message);
  tkv_stream_free(&s);
  attn_kv_close(small);
  attn_kv_close(mid);
  attn_engine_close(e);
}
