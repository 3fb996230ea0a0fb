/*
 * test_kv_dv.c — sessions whose values have a head dim of their own
 * (attn_kv_shape.head_dim_v) and latent sessions (v_from_k: k stored
 * alone, v its first Dv columns), on host pages: prefill in calls and
 * decode steps against the float64 reference over exactly the keys each
 * session holds (causal, GQA, F32 and BF16, statistics, every CPU
 * kernel; computed on the caller's thread too), a batch of sessions
 * against its single calls, padding columns read as zeros whatever a page
 * taken again held, many calls at once on sessions that hold v
 * differently, the refusals, the reservation of a latent session, and
 * both kinds saved and loaded.
 */
#include "helpers.h"
#include "kv/kv_int.h"
#include "kvcalls.h"
#include "reference.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)

/* A session's kind: D, Dv, latent. */
typedef struct kind {
  int64_t d, dv;
  bool latent;
} kind;

static const kind kinds[] = {
    {96, 64, true},   /* MLA's absorbed decode, scaled down (576 = 512 + 64) */
    {64, 64, true},   /* v all of k */
    {96, 64, false},  /* Dv < D, both stored */
    {64, 96, false},  /* D < Dv */
    {192, 128, false} /* DeepSeek's MLA prefill */
};
enum { NKINDS = sizeof kinds / sizeof *kinds };

static tkv_stream stream_of(const kind *k, int64_t hq, int64_t hkv, int64_t n, attn_dtype dt,
                            uint64_t seed) {
  return tkv_stream_make_dv(hq, hkv, k->d, k->dv, k->latent, n, dt, seed);
}

/* Prefill of pre tokens in calls of chunk, then one token a step to s->n,
 * each checked; the steps that failed. */
static int decode_checked(attn_kv_store *kv, const char *id, const tkv_stream *s,
                          const tkv_opts *op, int64_t pre, int64_t chunk, const char *what) {
  const tkv_plan pl = {.pre = pre, .chunk = chunk};
  char why[200] = "";
  int fails = tkv_decode(kv, id, s, op, &pl, why, sizeof why);
  if (fails)
    cr_log_error("%s: %d steps failed, the first at %s", what, fails, why);
  return fails;
}

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Every kind in F32 and BF16 on every CPU kernel this machine runs (the
 * store batching on every other one). */
Test(kv_dv, prefill_and_decode_every_kind_and_kernel, .timeout = 600) {
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  int fails = 0;
  for (int i = 0; i < NISAS; i++) {
    attn_engine *e = topen_isa(isas[i], 2);
    if (!e)
      continue;
    attn_kv_store *kv = tkv_open_store(e, 64 * MIB, i % 2 == 0, NULL);
    for (int k = 0; k < NKINDS; k++)
      for (int t = 0; t < 2; t++) {
        char id[32], what[96];
        snprintf(id, sizeof id, "s-%d-%d", k, t);
        tkv_stream s = stream_of(&kinds[k], 4, 2, 160, dts[t], 11 + (uint64_t)(k * 2 + t));
        tkv_make(kv, "", id, &s, 2, 1024, 600, 0);
        snprintf(what, sizeof what, "%s D %lld Dv %lld%s %s", isas[i], (long long)kinds[k].d,
                 (long long)kinds[k].dv, kinds[k].latent ? " latent" : "", attn_dtype_name(dts[t]));
        tkv_opts op = tkv_plain;
        op.stats = (k + t) % 2 == 0;
        op.layer = t;
        fails += decode_checked(kv, id, &s, &op, 130, 50, what);
        tkv_stream_free(&s);
      }
    attn_kv_close(kv);
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d steps off the reference", fails);
}

/* DeepSeek's absorbed decode at its own size: D 576 (512 latent + 64
 * rope), Dv 512, one latent head for all query heads. A row of 576 BF16
 * elements is 1152 bytes, so a 64 KiB page holds 48 of them (F32: 16),
 * fewer than a key tile: every kernel reads tiles cut at the pages' ends. */
Test(kv_dv, deepseek_latent_at_full_width, .timeout = 600) {
  const kind ds = {576, 512, true};
  const attn_dtype dts[2] = {ATTN_F32, ATTN_BF16};
  const int64_t rows[2] = {16, 48};
  int fails = 0;
  for (int i = 0; i < NISAS; i++) {
    attn_engine *e = topen_isa(isas[i], 2);
    if (!e)
      continue;
    attn_kv_store *kv = tkv_open_store(e, 64 * MIB, i % 2 == 1, NULL);
    for (int t = 0; t < 2; t++) {
      tkv_stream s = stream_of(&ds, 8, 1, 150, dts[t], 300 + (uint64_t)(i * 2 + t));
      tkv_make(kv, "", dts[t] == ATTN_F32 ? "f" : "b", &s, 2, 1000, 600, 0);
      const attn_kv_shape sh = {.heads_kv = 1,
                                .head_dim = 576,
                                .head_dim_v = 512,
                                .v_from_k = true,
                                .dtype = dts[t],
                                .layers = 2,
                                .max_tokens = 1000};
      const uint64_t pages = 2 * (uint64_t)((1000 + rows[t] - 1) / rows[t]);
      cr_expect_eq(attn_kv_reserve_bytes(kv, &sh), pages * (64 << 10), "%s rows of %lld",
                   attn_dtype_name(dts[t]), (long long)rows[t]);
      char what[96];
      snprintf(what, sizeof what, "%s D 576 Dv 512 latent %s", isas[i], attn_dtype_name(dts[t]));
      tkv_opts op = tkv_plain;
      op.stats = t == 1;
      op.layer = 1;
      fails += decode_checked(kv, dts[t] == ATTN_F32 ? "f" : "b", &s, &op, 120, 50, what);
      tkv_stream_free(&s);
    }
    attn_kv_close(kv);
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d steps off the reference", fails);
}

/* Not causal, a window, softcap and MQA, on a latent session. */
Test(kv_dv, latent_options_and_mqa, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = stream_of(&kinds[0], 8, 1, 120, ATTN_BF16, 5);
  tkv_make(kv, "", "w", &s, 1, 512, 600, 0);
  tkv_opts op = tkv_plain;
  op.causal = false;
  op.wl = 40;
  op.wr = 0;
  op.softcap = 20;
  op.stats = true;
  cr_assert_eq(decode_checked(kv, "w", &s, &op, 100, 0, "latent, window, softcap"), 0);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Calls computed on the caller's thread (attn_kv_run_here), as the
 * server answers small ones. */
Test(kv_dv, calls_run_here, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  int fails = 0;
  for (int k = 0; k < NKINDS; k++) {
    char id[16];
    snprintf(id, sizeof id, "h%d", k);
    tkv_stream s = stream_of(&kinds[k], 4, 2, 90, ATTN_BF16, 60 + (uint64_t)k);
    tkv_make(kv, "", id, &s, 1, 128, 600, 0);
    tkv_opts op = tkv_plain;
    op.here = 1e12;
    fails += decode_checked(kv, id, &s, &op, 64, 32, id);
    tkv_stream_free(&s);
  }
  cr_expect_eq(fails, 0, "%d steps off the reference", fails);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Pages that held anything (here NaN in every byte, as a page taken
 * again may hold another dtype's bytes): a session's padding columns must
 * read zero, k's where a padded q meets them and v's where they feed the
 * columns of O that are cut. */
Test(kv_dv, pages_taken_again_hold_no_old_columns) {
  attn_engine *e = topen(2, NULL);
  for (int k = 0; k < NKINDS; k++)
    for (int t = 0; t < 2; t++) {
      const attn_dtype dt = t ? ATTN_BF16 : ATTN_F32;
      attn_kv_store *kv = tkv_open_store(e, 8 * 64 * 1024, false, NULL);
      memset(kv->pages.base, 0xff, (size_t)kv->pages.npages * ATTN_KV_PAGE_BYTES);
      tkv_stream b = stream_of(&kinds[k], 2, 2, 100, dt, 4 + (uint64_t)k);
      tkv_make(kv, "", "b", &b, 1, 128, 600, 0);
      tkv_reply y;
      attn_status st;
      cr_assert_eq(tkv_call1(kv, "", "b", &b, &tkv_plain, 0, 100, 0, 100, &y, 0, &st), 0, "%s",
                   st.message);
      double err = tkv_ref_error(&b, &tkv_plain, 0, 100, 100, &y);
      cr_expect(err <= ttol(dt), "D %lld Dv %lld %s: error %g", (long long)kinds[k].d,
                (long long)kinds[k].dv, attn_dtype_name(dt), err);
      tkv_reply_free(&y);
      tkv_stream_free(&b);
      attn_kv_close(kv);
    }
  attn_engine_close(e);
}

/* ---- a batch of sessions ------------------------------------------------ */

/* A batch call of three sessions of each kind: bit for bit the single
 * calls' O, which match the reference. */
static void batch_kind(attn_engine *e, const kind *kd, uint64_t seed) {
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s[3] = {stream_of(kd, 4, 2, 300, ATTN_BF16, seed),
                     stream_of(kd, 4, 2, 40, ATTN_BF16, seed + 1),
                     stream_of(kd, 4, 2, 90, ATTN_BF16, seed + 2)};
  const char *single[3] = {"a1", "b1", "c1"}, *batched[3] = {"a2", "b2", "c2"};
  const int64_t pre[3] = {299, 39, 85};
  tkv_reply y;
  attn_status st;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      const char *id = j ? batched[i] : single[i];
      tkv_make(kv, "", id, &s[i], 1, 512, 600, 0);
      cr_assert_eq(tkv_call1(kv, "", id, &s[i], &tkv_plain, 0, pre[i], 0, pre[i], &y, 0, &st), 0,
                   "%s", st.message);
      tkv_reply_free(&y);
    }
  tkv_batch bt = {{"a2", "b2", "c2"}, {&s[0], &s[1], &s[2]}, {299, 39, 85}, {1, 1, 3}, {1, 1, 2}};
  void *bo;
  cr_assert_eq(tkv_call_batch(kv, &bt, 3, &bo, 0, &st), 0, "%s", st.message);
  const size_t w = (size_t)kd->dv * 2;
  for (int i = 0, off = 0; i < 3; off += (int)bt.nq[i], i++) {
    cr_assert_eq(tkv_call1(kv, "", single[i], &s[i], &tkv_plain, bt.pos[i], bt.nq[i], bt.pos[i],
                           bt.nn[i], &y, 0, &st),
                 0, "%s", st.message);
    double err = tkv_ref_error(&s[i], &tkv_plain, bt.pos[i], bt.nq[i], bt.pos[i] + bt.nn[i], &y);
    cr_expect(err <= ttol(ATTN_BF16), "D %lld Dv %lld session %d: error %g", (long long)kd->d,
              (long long)kd->dv, i, err);
    for (int64_t h = 0; h < 4; h++)
      cr_expect_eq(memcmp((char *)y.o + (size_t)(h * bt.nq[i]) * w,
                          (char *)bo + (size_t)(h * 5 + off) * w, (size_t)bt.nq[i] * w),
                   0, "D %lld Dv %lld session %d head %lld: the batch's O is not the single call's",
                   (long long)kd->d, (long long)kd->dv, i, (long long)h);
    tkv_reply_free(&y);
  }
  free(bo);
  for (int i = 0; i < 3; i++)
    tkv_stream_free(&s[i]);
  attn_kv_close(kv);
}

Test(kv_dv, batch_call_equals_single_calls, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  for (int k = 0; k < NKINDS; k++)
    batch_kind(e, &kinds[k], 40 + 3 * (uint64_t)k);
  attn_engine_close(e);
}

/* Sessions of one batch call share how they hold v. */
Test(kv_dv, batch_of_mixed_kinds_refused) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  const kind plain = {96, 64, false};
  tkv_stream a = stream_of(&kinds[0], 4, 2, 10, ATTN_F32, 1),
             b = stream_of(&plain, 4, 2, 10, ATTN_F32, 2);
  tkv_make(kv, "", "lat", &a, 1, 64, 600, 0);
  tkv_make(kv, "", "both", &b, 1, 64, 600, 0);
  attn_status st;
  tkv_reply y;
  cr_assert_eq(tkv_call1(kv, "", "both", &b, &tkv_plain, 0, 4, 0, 4, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  cr_assert_eq(tkv_call1(kv, "", "lat", &a, &tkv_plain, 0, 4, 0, 4, &y, 0, &st), 0, "%s",
               st.message);
  tkv_reply_free(&y);
  tkv_batch bt = {{"lat", "both"}, {&a, &b}, {4, 4}, {1, 1}, {0, 0}};
  void *bo;
  cr_expect_eq(tkv_call_batch(kv, &bt, 2, &bo, 0, &st), ATTN_ESHAPE);
  cr_expect(strstr(st.message, "latent"), "%s", st.message);
  free(bo);
  tkv_stream_free(&a);
  tkv_stream_free(&b);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* ---- creates, calls and reservations refused or kept -------------------- */

static attn_kv_shape shape_of(int64_t d, int64_t dv, bool latent) {
  return (attn_kv_shape){.heads_kv = 2,
                         .head_dim = d,
                         .head_dim_v = dv,
                         .v_from_k = latent,
                         .dtype = ATTN_BF16,
                         .layers = 3,
                         .max_tokens = 1000};
}

Test(kv_dv, creates_refused_and_kept) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  attn_status st;
  bool created;
  const struct {
    attn_kv_shape sh;
    const char *needle;
  } bad[] = {
      {shape_of(64, 96, true), "head_dim_v must be 1 to head_dim"}, /* v past k */
      {shape_of(64, 0, true), "v_from_k"},                          /* no Dv */
      {shape_of(64, -1, false), "head_dim_v"},
      {shape_of(64, ATTN_MAX_HEAD_DIM_V + 1, false), "head_dim_v"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(attn_kv_create(kv, "", "x", &bad[i].sh, 600, 0, &created, &st), ATTN_EINVAL,
                 "case %zu", i);
    cr_expect(strstr(st.message, bad[i].needle), "case %zu: %s", i, st.message);
  }
  attn_kv_shape sh = shape_of(96, 64, true);
  cr_assert_eq(attn_kv_create(kv, "", "x", &sh, 600, 0, &created, &st), 0, "%s", st.message);
  cr_expect(created);
  cr_assert_eq(attn_kv_create(kv, "", "x", &sh, 600, 1, &created, &st), 0, "%s", st.message);
  cr_expect(!created, "a retried create made another session");
  attn_kv_shape other[3] = {shape_of(96, 32, true), shape_of(96, 64, false),
                            shape_of(96, 0, false)};
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(attn_kv_create(kv, "", "x", &other[i], 600, 2, &created, &st),
                 ATTN_ESESSION_EXISTS, "case %d", i);
    cr_expect(strstr(st.message, "head_dim_v 64 (v_from_k)"), "%s", st.message);
  }
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "x", 3, &info, NULL, 0, &st), 0);
  cr_expect(info.shape.head_dim_v == 64 && info.shape.v_from_k && info.shape.head_dim == 96);
  /* 0 is head_dim: the same session as head_dim_v = head_dim */
  attn_kv_shape zero = shape_of(64, 0, false), same = shape_of(64, 64, false);
  cr_assert_eq(attn_kv_create(kv, "", "y", &zero, 600, 0, &created, &st), 0, "%s", st.message);
  cr_assert_eq(attn_kv_create(kv, "", "y", &same, 600, 0, &created, &st), 0, "%s", st.message);
  cr_expect(!created);
  cr_assert_eq(attn_kv_get(kv, "", "y", 0, &info, NULL, 0, &st), 0);
  cr_expect_eq(info.shape.head_dim_v, 64, "the info says head_dim_v %lld",
               (long long)info.shape.head_dim_v);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kv_dv, latent_reserves_half) {
  attn_kv_store *kv = tkv_open_store(NULL, 64 * MIB, true, "cpu");
  for (int i = 0; i < 3; i++) {
    const int64_t d[3] = {96, 64, 192}, dv[3] = {64, 64, 128};
    attn_kv_shape lat = shape_of(d[i], dv[i], true), both = shape_of(d[i], dv[i], false);
    uint64_t a = attn_kv_reserve_bytes(kv, &lat), b = attn_kv_reserve_bytes(kv, &both);
    cr_expect(a > 0 && 2 * a == b, "D %lld Dv %lld: latent %llu, both %llu", (long long)d[i],
              (long long)dv[i], (unsigned long long)a, (unsigned long long)b);
  }
  /* pages hold rows max(D, Dv) wide: D 64 Dv 128 reserves as D 128 does */
  attn_kv_shape narrow = shape_of(64, 128, false), wide = shape_of(128, 128, false);
  cr_expect_eq(attn_kv_reserve_bytes(kv, &narrow), attn_kv_reserve_bytes(kv, &wide));
  attn_kv_close(kv);
}

/* One call on a session of kind kd whose k and v (which may be NULL) and
 * head_dim_v are given; the store's code. */
static int call_with(attn_kv_store *kv, const char *id, const tkv_stream *s, int64_t dv,
                     const void *v, attn_status *st) {
  attn_kv_entry en = {.id = id, .pos = 0, .n_new = 1};
  attn_kv_call c = {.tenant = "", .nentries = 1, .entries = &en, .total_new = 1};
  void *o = calloc((size_t)(s->hq * 512), 4);
  attn_request_init(&c.req);
  c.req.heads_q = s->hq;
  c.req.heads_kv = s->hkv;
  c.req.head_dim = s->d;
  c.req.head_dim_v = dv;
  c.req.seq_q = 1;
  c.req.dtype = s->dt;
  c.req.q = s->q;
  c.req.o = o;
  c.k_new = s->k;
  c.v_new = v;
  int rc = tkv_run(kv, &c, 0, st);
  free(o);
  return rc;
}

Test(kv_dv, calls_refused) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  const kind plain = {96, 64, false};
  tkv_stream a = stream_of(&kinds[0], 4, 2, 8, ATTN_F32, 1),
             b = stream_of(&plain, 4, 2, 8, ATTN_F32, 2);
  tkv_make(kv, "", "lat", &a, 1, 64, 600, 0);
  tkv_make(kv, "", "both", &b, 1, 64, 600, 0);
  attn_status st;
  cr_expect_eq(call_with(kv, "lat", &a, 64, a.v, &st), ATTN_ESHAPE);
  cr_expect(strstr(st.message, "a latent session (v_from_k) takes q and k only: v is the first "
                               "Dv columns of k"),
            "%s", st.message);
  cr_expect_eq(call_with(kv, "lat", &a, 96, NULL, &st), ATTN_ESHAPE);
  cr_expect(strstr(st.message, "head_dim_v"), "%s", st.message);
  cr_expect_eq(call_with(kv, "both", &b, 64, NULL, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "both k and v"), "%s", st.message);
  cr_expect_eq(call_with(kv, "both", &b, 0, b.v, &st), ATTN_ESHAPE); /* 0: head_dim, not 64 */
  cr_expect(strstr(st.message, "head_dim_v"), "%s", st.message);
  int64_t len;
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "lat", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0, "a refused call appended");
  cr_assert_eq(attn_kv_get(kv, "", "both", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0, "a refused call appended");
  /* and the calls that fit go */
  cr_expect_eq(call_with(kv, "lat", &a, 64, NULL, &st), 0, "%s", st.message);
  cr_expect_eq(call_with(kv, "both", &b, 64, b.v, &st), 0, "%s", st.message);
  tkv_stream_free(&a);
  tkv_stream_free(&b);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* ---- saved and loaded ---------------------------------------------------- */

Test(kv_dv, save_and_load_both_kinds, .timeout = 300) {
  char dir[] = "/tmp/attn-kvdv-XXXXXX";
  cr_assert(mkdtemp(dir));
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, true, NULL),
                *b = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s[NKINDS];
  attn_status st;
  tkv_reply y;
  for (int k = 0; k < NKINDS; k++) {
    char id[16];
    snprintf(id, sizeof id, "k%d", k);
    s[k] = stream_of(&kinds[k], 4, 2, 101, ATTN_BF16, 70 + (uint64_t)k);
    tkv_make(a, "", id, &s[k], 1, 512, 600, 0);
    cr_assert_eq(tkv_call1(a, "", id, &s[k], &tkv_plain, 0, 100, 0, 100, &y, 0, &st), 0, "%s",
                 st.message);
    tkv_reply_free(&y);
  }
  cr_assert_eq(attn_kv_save(a, dir, 10, &st), NKINDS, "%s", st.message);
  cr_assert_eq(attn_kv_load(b, dir, 10, 600, NULL, NULL, &st), NKINDS, "%s", st.message);
  for (int k = 0; k < NKINDS; k++) {
    char id[16];
    snprintf(id, sizeof id, "k%d", k);
    attn_kv_info ia, ib;
    cr_assert_eq(attn_kv_get(a, "", id, 10, &ia, NULL, 0, &st), 0);
    cr_assert_eq(attn_kv_get(b, "", id, 10, &ib, NULL, 0, &st), 0, "%s", st.message);
    cr_expect(ib.shape.head_dim_v == ia.shape.head_dim_v && ib.shape.v_from_k == ia.shape.v_from_k,
              "%s: loaded as another kind", id);
    cr_expect_eq(ib.reserved_bytes, ia.reserved_bytes);
    /* the next step over every key loaded */
    cr_assert_eq(tkv_call1(b, "", id, &s[k], &tkv_plain, 100, 1, 100, 1, &y, 10, &st), 0, "%s",
                 st.message);
    double err = tkv_ref_error(&s[k], &tkv_plain, 100, 1, 101, &y);
    cr_expect(err <= ttol(ATTN_BF16), "%s: error %g after the load", id, err);
    tkv_reply_free(&y);
    tkv_stream_free(&s[k]);
  }
  attn_kv_close(a);
  attn_kv_close(b);
  attn_engine_close(e);
  rmdir(dir);
}

/* ---- calls at once: the store merges only calls of one shape ------------- */

typedef struct reader {
  attn_kv_store *kv;
  const char *id;
  const tkv_stream *s;
  int64_t keys, calls;
  int rc, fails;
  pthread_barrier_t *go;
} reader;

/* Attends the session's last query over its keys, calls times, each
 * checked: calls of one layer that arrive while its job runs wait for it,
 * and those that become free together are merged where they may be. */
static void *read_thread(void *arg) {
  reader *t = arg;
  pthread_barrier_wait(t->go);
  for (int64_t i = 0; i < t->calls && t->rc == 0; i++) {
    tkv_reply y;
    attn_status st;
    t->rc = tkv_call1(t->kv, "", t->id, t->s, &tkv_plain, t->keys - 1, 1, 0, 0, &y, 0, &st);
    if (t->rc == 0 &&
        !(tkv_ref_error(t->s, &tkv_plain, t->keys - 1, 1, t->keys, &y) <= ttol(t->s->dt)))
      t->fails++;
    tkv_reply_free(&y);
  }
  return NULL;
}

/* Sessions of one head_dim whose values differ (latent, Dv 64, 32, 96),
 * read by many threads at once: each reply is its own session's. */
Test(kv_dv, calls_at_once_of_sessions_that_hold_v_differently, .timeout = 300) {
  static const kind mixed[4] = {{96, 64, true}, {96, 64, false}, {96, 32, false}, {96, 96, false}};
  enum { READERS = 3, SESSIONS = 4, N = SESSIONS * READERS };
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, true, NULL);
  tkv_stream s[SESSIONS];
  char ids[SESSIONS][8];
  reader t[N];
  pthread_t th[N];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, N);
  for (int i = 0; i < SESSIONS; i++) {
    snprintf(ids[i], sizeof ids[i], "m%d", i);
    s[i] = stream_of(&mixed[i], 4, 2, 100, ATTN_F32, 90 + (uint64_t)i);
    tkv_make(kv, "", ids[i], &s[i], 1, 128, 600, 0);
    tkv_reply y;
    attn_status st;
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s[i], &tkv_plain, 0, 100, 0, 100, &y, 0, &st), 0, "%s",
                 st.message);
    tkv_reply_free(&y);
  }
  for (int i = 0; i < N; i++) {
    t[i] = (reader){kv, ids[i % SESSIONS], &s[i % SESSIONS], 100, 30, 0, 0, &go};
    pthread_create(&th[i], NULL, read_thread, &t[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(t[i].rc, 0, "reader %d: code %d", i, t[i].rc);
    cr_expect_eq(t[i].fails, 0, "reader %d: %d calls off the reference", i, t[i].fails);
  }
  attn_kv_stats st;
  attn_kv_stats_get(kv, &st);
  cr_expect_eq(st.batched_calls, SESSIONS + N * 30, "every call computed once");
  for (int i = 0; i < SESSIONS; i++)
    tkv_stream_free(&s[i]);
  pthread_barrier_destroy(&go);
  attn_kv_close(kv);
  attn_engine_close(e);
}
