/*
 * test_kv_grow.c — sessions of reserve grow (attn_kv_shape.grow): their
 * pages are reserved as tokens arrive, so an append the pool cannot hold
 * is ESESSION_MEMORY with nothing appended (a batch's for every session of
 * it), while whole sessions made before and after keep every page they
 * reserved; truncate and delete give the pages back; the tenant's cap
 * counts them as they are taken; a saved grow session loads as one; the
 * same with 16 KiB pages. Every call's output is checked against the
 * float64 reference.
 */
#include "helpers.h"
#include "kvcalls.h"
#include "kvstep.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE ((uint64_t)64 << 10) /* ATTN_KV_PAGE_BYTES */
/* F32, head_dim 64, one KV head: 256 tokens a page, K and V a page each */
#define PT 256

static attn_engine *eng;
static void setup(void) { eng = topen(2, NULL); }
static void teardown(void) { attn_engine_close(eng); }

static int make(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
                int64_t max_tokens, bool grow, attn_status *st) {
  attn_kv_shape sh = {.heads_kv = s->hkv,
                      .head_dim = s->d,
                      .dtype = s->dt,
                      .layers = 1,
                      .max_tokens = max_tokens,
                      .grow = grow};
  bool created;
  return attn_kv_create(kv, tenant, id, &sh, 600, 0, &created, st);
}

static attn_kv_info info_of(attn_kv_store *kv, const char *tenant, const char *id) {
  attn_kv_info info;
  attn_status st;
  cr_assert_eq(attn_kv_get(kv, tenant, id, 0, &info, NULL, 0, &st), 0, "%s", st.message);
  return info;
}

static uint64_t pool_reserved(attn_kv_store *kv) {
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  return stats.reserved_bytes;
}

/* An append past the pool: refused, nothing appended. */
static void step_refused(attn_kv_store *kv, const char *id, const tkv_stream *s, int64_t pos,
                         int64_t n) {
  attn_status st;
  tkv_reply y;
  cr_assert_eq(tkv_call1(kv, "", id, s, &tkv_plain, pos, n, pos, n, &y, 0, &st),
               ATTN_ESESSION_MEMORY, "%s [%lld, +%lld) was not refused for memory", id,
               (long long)pos, (long long)n);
  tkv_reply_free(&y);
  cr_expect(strstr(st.message, "nothing was appended"), "%s", st.message);
  cr_expect_eq(info_of(kv, "", id).tokens, pos, "the refused append stored tokens");
}

/* A grow session takes pages as it appends, up to what whole sessions
 * made before and after it leave; past that it is refused with its tokens
 * intact, and goes on once a whole session is deleted. The whole sessions
 * fill their max_tokens meanwhile. */
Test(kv_grow, takes_pages_as_tokens_arrive, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 16 * PAGE, false, "cpu");
  tkv_stream g = tkv_stream_make(2, 1, 64, 7 * PT, ATTN_F32, 1);
  tkv_stream w = tkv_stream_make(2, 1, 64, PT, ATTN_F32, 2);
  attn_status st;
  cr_assert_eq(make(kv, "", "before", &w, PT, false, &st), 0, "%s", st.message);
  cr_assert_eq(make(kv, "", "g", &g, 16 * PT, true, &st), 0, "%s", st.message);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 0);
  cr_expect(info_of(kv, "", "g").shape.grow && !info_of(kv, "", "before").shape.grow);
  cr_expect_eq(pool_reserved(kv), 2 * PAGE);
  tkv_step_ok(kv, "g", &g, 0, PT + 44);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 4 * PAGE);
  tkv_step_ok(kv, "g", &g, PT + 44, 3 * PT - 44);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 8 * PAGE);
  cr_assert_eq(make(kv, "", "after", &w, PT, false, &st), 0, "%s", st.message);
  /* 16 pages: 2 + 2 whole, so g holds at most 12, 6 * PT tokens */
  tkv_step_ok(kv, "g", &g, 4 * PT, 2 * PT);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 12 * PAGE);
  step_refused(kv, "g", &g, 6 * PT, 1);
  tkv_step_ok(kv, "before", &w, 0, PT);
  tkv_step_ok(kv, "after", &w, 0, PT);
  cr_assert_eq(attn_kv_delete(kv, "", "after", 0, &st), 0);
  tkv_step_ok(kv, "g", &g, 6 * PT, 1);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 14 * PAGE);
  tkv_stream_free(&g);
  tkv_stream_free(&w);
  attn_kv_close(kv);
}

/* The first token of a new page is the one refused, and the session goes
 * on once another session is deleted. */
Test(kv_grow, refused_then_room, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 6 * PAGE, false, "cpu");
  tkv_stream g = tkv_stream_make(2, 1, 64, 3 * PT, ATTN_F32, 3);
  tkv_stream w = tkv_stream_make(2, 1, 64, PT, ATTN_F32, 4);
  attn_status st;
  cr_assert_eq(make(kv, "", "g", &g, 8 * PT, true, &st), 0);
  cr_assert_eq(make(kv, "", "w", &w, PT, false, &st), 0);
  tkv_step_ok(kv, "g", &g, 0, 2 * PT);
  step_refused(kv, "g", &g, 2 * PT, 5);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 4 * PAGE, "a refused append holds pages");
  cr_expect_eq(pool_reserved(kv), 6 * PAGE);
  cr_assert_eq(attn_kv_delete(kv, "", "w", 0, &st), 0);
  tkv_step_ok(kv, "g", &g, 2 * PT, PT);
  tkv_stream_free(&g);
  tkv_stream_free(&w);
  attn_kv_close(kv);
}

/* Truncate gives back the pages past the new length, delete all of them;
 * the pool's reservation follows. */
Test(kv_grow, truncate_and_delete_give_back, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 8 * PAGE, false, "cpu");
  tkv_stream g = tkv_stream_make(2, 1, 64, 4 * PT, ATTN_F32, 5);
  attn_status st;
  cr_assert_eq(make(kv, "", "g", &g, 4 * PT, true, &st), 0);
  tkv_step_ok(kv, "g", &g, 0, 3 * PT + 1);
  cr_expect_eq(pool_reserved(kv), 8 * PAGE);
  cr_assert_eq(attn_kv_truncate(kv, "", "g", PT + 1, 0, &st), 0);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 4 * PAGE);
  cr_expect_eq(pool_reserved(kv), 4 * PAGE);
  tkv_step_ok(kv, "g", &g, PT + 1, 3 * PT - 1); /* the stream's own tokens again: exact */
  cr_assert_eq(attn_kv_truncate(kv, "", "g", 0, 0, &st), 0);
  cr_expect_eq(pool_reserved(kv), 0);
  tkv_step_ok(kv, "g", &g, 0, 10);
  cr_assert_eq(attn_kv_delete(kv, "", "g", 0, &st), 0);
  cr_expect_eq(pool_reserved(kv), 0);
  tkv_stream_free(&g);
  attn_kv_close(kv);
}

/* A batch whose grow sessions' new pages do not fit together appends to
 * none of them; one that fits appends to all. */
Test(kv_grow, batch_all_or_nothing, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 10 * PAGE, false, "cpu");
  tkv_stream x = tkv_stream_make(2, 1, 64, 3 * PT, ATTN_F32, 6);
  tkv_stream y = tkv_stream_make(2, 1, 64, 4 * PT, ATTN_F32, 7);
  attn_status st;
  cr_assert_eq(make(kv, "", "x", &x, 4 * PT, true, &st), 0);
  cr_assert_eq(make(kv, "", "y", &y, 4 * PT, true, &st), 0);
  tkv_step_ok(kv, "x", &x, 0, PT);
  tkv_step_ok(kv, "y", &y, 0, PT);
  /* 6 pages free: x's +PT takes 2, y's +2 PT 4, and its one token more 2 */
  tkv_batch bt = {
      .ids = {"x", "y"}, .s = {&x, &y}, .pos = {PT, PT}, .nq = {1, 1}, .nn = {PT, 2 * PT + 1}};
  void *o = NULL;
  cr_expect_eq(tkv_call_batch(kv, &bt, 2, &o, 0, &st), ATTN_ESESSION_MEMORY);
  free(o);
  o = NULL;
  cr_expect(strstr(st.message, "nothing was appended"), "%s", st.message);
  cr_expect_eq(info_of(kv, "", "x").tokens, PT);
  cr_expect_eq(info_of(kv, "", "y").tokens, PT);
  cr_expect_eq(pool_reserved(kv), 4 * PAGE);
  bt.nn[1] = 2 * PT;
  cr_expect_eq(tkv_call_batch(kv, &bt, 2, &o, 0, &st), 0, "%s", st.message);
  free(o);
  cr_expect_eq(pool_reserved(kv), 10 * PAGE);
  /* the batch's rows, checked as the keys of one more query each */
  cr_assert_eq(attn_kv_truncate(kv, "", "y", 3 * PT - 1, 0, &st), 0);
  tkv_step_ok(kv, "y", &y, 3 * PT - 1, 1);
  cr_assert_eq(attn_kv_truncate(kv, "", "x", 2 * PT - 1, 0, &st), 0);
  tkv_step_ok(kv, "x", &x, 2 * PT - 1, 1);
  tkv_stream_free(&x);
  tkv_stream_free(&y);
  attn_kv_close(kv);
}

/* The per-tenant cap counts a grow session's pages as it takes them: an
 * append past it is refused saying so, another tenant goes on, and a
 * truncate makes room. */
Test(kv_grow, tenant_cap, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 16 * PAGE, false, "cpu");
  attn_kv_set_tenant_cap(kv, 4 * PAGE);
  tkv_stream g = tkv_stream_make(2, 1, 64, 3 * PT, ATTN_F32, 8);
  attn_status st;
  cr_assert_eq(make(kv, "t", "g", &g, 8 * PT, true, &st), 0);
  cr_assert_eq(make(kv, "u", "g", &g, 8 * PT, true, &st), 0);
  tkv_reply y;
  cr_assert_eq(tkv_call1(kv, "t", "g", &g, &tkv_plain, 0, 2 * PT, 0, 2 * PT, &y, 0, &st), 0);
  cr_expect_lt(tkv_ref_error(&g, &tkv_plain, 0, 2 * PT, 2 * PT, &y), ttol(g.dt));
  tkv_reply_free(&y);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "t"), 4 * PAGE);
  cr_expect_eq(tkv_call1(kv, "t", "g", &g, &tkv_plain, 2 * PT, 1, 2 * PT, 1, &y, 0, &st),
               ATTN_ESESSION_MEMORY);
  tkv_reply_free(&y);
  cr_expect(strstr(st.message, "--session-memory-per-key") &&
                strstr(st.message, "nothing was appended"),
            "%s", st.message);
  cr_expect_eq(info_of(kv, "t", "g").tokens, 2 * PT);
  cr_expect_eq(tkv_call1(kv, "u", "g", &g, &tkv_plain, 0, 1, 0, 1, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  cr_assert_eq(attn_kv_truncate(kv, "t", "g", PT, 0, &st), 0);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "t"), 2 * PAGE);
  cr_assert_eq(tkv_call1(kv, "t", "g", &g, &tkv_plain, PT, PT, PT, PT, &y, 0, &st), 0, "%s",
               st.message);
  cr_expect_lt(tkv_ref_error(&g, &tkv_plain, PT, PT, 2 * PT, &y), ttol(g.dt));
  tkv_reply_free(&y);
  cr_assert_eq(attn_kv_delete(kv, "t", "g", 0, &st), 0);
  cr_expect_eq(attn_kv_tenant_reserved(kv, "t"), 0);
  tkv_stream_free(&g);
  attn_kv_close(kv);
}

/* A retried create with the other reserve is a session of other
 * parameters. */
Test(kv_grow, retried_create_differs, .init = setup, .fini = teardown) {
  attn_kv_store *kv = tkv_open_store(eng, 16 * PAGE, false, "cpu");
  tkv_stream g = tkv_stream_make(2, 1, 64, 1, ATTN_F32, 9);
  attn_status st;
  cr_assert_eq(make(kv, "", "g", &g, PT, true, &st), 0);
  cr_expect_eq(make(kv, "", "g", &g, PT, true, &st), 0);
  cr_expect_eq(make(kv, "", "g", &g, PT, false, &st), ATTN_ESESSION_EXISTS);
  cr_expect(strstr(st.message, "reserve grow"), "%s", st.message);
  tkv_stream_free(&g);
  attn_kv_close(kv);
}

/* A saved grow session loads as one, holding the pages of its tokens (and
 * the file, loaded, is gone); a store too small for them moves it aside. */
Test(kv_grow, saved_and_loaded, .init = setup, .fini = teardown) {
  char dir[] = "/tmp/attn-kvgrow-XXXXXX";
  cr_assert(mkdtemp(dir));
  attn_kv_store *a = tkv_open_store(eng, 16 * PAGE, false, "cpu");
  tkv_stream g = tkv_stream_make(2, 1, 64, 2 * PT, ATTN_F32, 10);
  attn_status st;
  cr_assert_eq(make(a, "", "g", &g, 8 * PT, true, &st), 0);
  tkv_step_ok(a, "g", &g, 0, PT + 1);
  cr_assert_eq(attn_kv_save(a, dir, 0, &st), 1, "%s", st.message);
  attn_kv_store *b = tkv_open_store(eng, 16 * PAGE, false, "cpu");
  cr_assert_eq(attn_kv_load(b, dir, 0, 1e9, NULL, NULL, &st), 1, "%s", st.message);
  attn_kv_info info = info_of(b, "", "g");
  cr_expect(info.shape.grow);
  cr_expect_eq(info.reserved_bytes, 4 * PAGE);
  cr_expect_eq(pool_reserved(b), 4 * PAGE);
  tkv_step_ok(b, "g", &g, PT + 1, PT - 1);
  cr_assert_eq(attn_kv_save(b, dir, 0, &st), 1, "%s", st.message); /* a load took the file */
  attn_kv_store *c = tkv_open_store(eng, 2 * PAGE, false, "cpu");
  cr_expect_eq(attn_kv_load(c, dir, 0, 1e9, NULL, NULL, &st), 0);
  cr_expect_eq(pool_reserved(c), 0);
  char bad[64];
  snprintf(bad, sizeof bad, "%s/@g.kv.bad", dir);
  cr_expect_eq(access(bad, F_OK), 0, "the file too big for the store was not moved aside");
  unlink(bad);
  rmdir(dir);
  tkv_stream_free(&g);
  attn_kv_close(a);
  attn_kv_close(b);
  attn_kv_close(c);
}

/* With 16 KiB pages (64 tokens of F32 D 64) a grow session takes a page
 * per 64 tokens, gives them back as it is cut, and is refused at the pool's
 * last page as with the default size. */
Test(kv_grow, small_pages, .init = setup, .fini = teardown) {
  const uint64_t pb = 16 << 10;
  attn_kv_store *kv = tkv_open_paged(eng, 8 * pb, pb);
  tkv_stream g = tkv_stream_make(2, 1, 64, 300, ATTN_F32, 3);
  attn_status st;
  cr_assert_eq(make(kv, "", "g", &g, 1000, true, &st), 0, "%s", st.message);
  tkv_step_ok(kv, "g", &g, 0, 65);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 4 * pb);
  cr_expect_eq(info_of(kv, "", "g").used_bytes, 4 * pb);
  for (int64_t pos = 65; pos < 200; pos++)
    tkv_step_ok(kv, "g", &g, pos, 1);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 8 * pb); /* 4 pages, K and V */
  tkv_step_ok(kv, "g", &g, 200, 56);                         /* the 4th page full */
  step_refused(kv, "g", &g, 256, 1);
  cr_assert_eq(attn_kv_truncate(kv, "", "g", 60, 0, &st), 0, "%s", st.message);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 2 * pb);
  cr_expect_eq(pool_reserved(kv), 2 * pb);
  tkv_step_ok(kv, "g", &g, 60, 10);
  cr_expect_eq(info_of(kv, "", "g").reserved_bytes, 4 * pb);
  tkv_stream_free(&g);
  attn_kv_close(kv);
}
