/*
 * test_kvstore.c — the session store (engine.h, "sessions"): a session's
 * calls checked against the float64 reference over exactly the keys the
 * session should hold (prefill, then token-by-token decode, in every
 * dtype and on every CPU kernel this machine runs), replays bit for bit,
 * conflicts that append nothing, truncation, layers, limits, memory, TTL,
 * tenants, the batch call against single calls, and concurrent calls.
 */
#include "helpers.h"
#include "reference.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

/* A session's whole token stream: q [Hq, n, D], k and v [Hkv, n, D]. */
typedef struct stream {
  int64_t hq, hkv, d, n;
  attn_dtype dt;
  void *q, *k, *v;
} stream;

static void *fill(int64_t count, attn_dtype dt, uint64_t *seed) {
  void *p = malloc((size_t)count * attn_dtype_size(dt));
  for (int64_t i = 0; i < count; i++)
    attn_store_elem(p, dt, (size_t)i, (float)tuniform(seed));
  return p;
}

static stream stream_make(int64_t hq, int64_t hkv, int64_t d, int64_t n, attn_dtype dt,
                          uint64_t seed) {
  stream s = {hq, hkv, d, n, dt, NULL, NULL, NULL};
  s.q = fill(hq * n * d, dt, &seed);
  s.k = fill(hkv * n * d, dt, &seed);
  s.v = fill(hkv * n * d, dt, &seed);
  return s;
}

static void stream_free(stream *s) {
  free(s->q);
  free(s->k);
  free(s->v);
}

/* Rows [r0, r0 + n) of every head of a [H, total, D] tensor, packed. */
static void *rows_of(const void *t, int64_t heads, int64_t total, int64_t d, attn_dtype dt,
                     int64_t r0, int64_t n) {
  size_t es = attn_dtype_size(dt), w = (size_t)d * es;
  char *out = malloc((size_t)(heads * n) * w + 1);
  for (int64_t h = 0; h < heads; h++)
    memcpy(out + (size_t)(h * n) * w, (const char *)t + (size_t)(h * total + r0) * w,
           (size_t)n * w);
  return out;
}

/* A call's result. */
typedef struct reply {
  void *o;
  float *m, *l, *lse;
  int64_t length;
  bool replay;
} reply;

static void reply_free(reply *y) {
  free(y->o);
  free(y->m);
  free(y->l);
  free(y->lse);
}

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  attn_result res;
} waiter;

static void wake(const attn_result *res, void *arg) {
  waiter *w = arg;
  pthread_mutex_lock(&w->mu);
  w->res = *res;
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Submits call and waits; the store's code or the job's. */
static int run_call(attn_kv_store *kv, attn_kv_call *c, double now, attn_status *st) {
  waiter w = {.done = false};
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int rc = attn_kv_submit(kv, c, now, wake, &w, st);
  if (rc == 0) {
    pthread_mutex_lock(&w.mu);
    while (!w.done)
      pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    rc = w.res.status.code;
    if (rc && st)
      *st = w.res.status;
  }
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return rc;
}

typedef struct opts {
  bool causal, stats;
  int64_t wl, wr;
  double softcap;
  int64_t layer;
} opts;

static const opts plain = {.causal = true, .wl = -1, .wr = -1};

/* One call on session id: queries [q0, q0 + nq) of s, and (nnew > 0) its
 * tokens [pos, pos + nnew) appended at pos. */
static int call1(attn_kv_store *kv, const char *tenant, const char *id, const stream *s,
                 const opts *op, int64_t q0, int64_t nq, int64_t pos, int64_t nnew, reply *y,
                 double now, attn_status *st) {
  attn_kv_entry en = {.id = id, .pos = pos, .n_new = nnew};
  attn_kv_call c = {.tenant = tenant, .layer = op->layer, .nentries = 1, .entries = &en};
  void *q = rows_of(s->q, s->hq, s->n, s->d, s->dt, q0, nq);
  void *k = nnew ? rows_of(s->k, s->hkv, s->n, s->d, s->dt, pos, nnew) : NULL;
  void *v = nnew ? rows_of(s->v, s->hkv, s->n, s->d, s->dt, pos, nnew) : NULL;
  memset(y, 0, sizeof *y);
  y->o = calloc((size_t)(s->hq * nq * s->d), attn_dtype_size(s->dt));
  if (op->stats) {
    y->m = calloc((size_t)(s->hq * nq), sizeof(float));
    y->l = calloc((size_t)(s->hq * nq), sizeof(float));
    y->lse = calloc((size_t)(s->hq * nq), sizeof(float));
  }
  attn_request_init(&c.req);
  c.req.heads_q = s->hq;
  c.req.heads_kv = s->hkv;
  c.req.head_dim = s->d;
  c.req.seq_q = nq;
  c.req.dtype = s->dt;
  c.req.causal = op->causal;
  c.req.window_left = op->wl;
  c.req.window_right = op->wr;
  c.req.softcap = op->softcap;
  c.req.q = q;
  c.req.o = y->o;
  c.req.m = y->m;
  c.req.l = y->l;
  c.req.lse = y->lse;
  c.k_new = k;
  c.v_new = v;
  c.total_new = nnew;
  int rc = run_call(kv, &c, now, st);
  y->length = en.length;
  y->replay = en.replay;
  free(q);
  free(k);
  free(v);
  return rc;
}

/* The float64 reference of queries [q0, q0 + nq) over keys [0, nk) of s,
 * bottom-right aligned; the relative L2 error of y's O against it, and
 * the largest error of its statistics when it has them. */
static double ref_error(const stream *s, const opts *op, int64_t q0, int64_t nq, int64_t nk,
                        const reply *y) {
  attn_request r;
  attn_request_init(&r);
  void *q = rows_of(s->q, s->hq, s->n, s->d, s->dt, q0, nq);
  r.batch = 1;
  r.heads_q = s->hq;
  r.heads_kv = s->hkv;
  r.seq_q = nq;
  r.seq_kv = nk;
  r.head_dim = s->d;
  r.dtype = s->dt;
  r.causal = op->causal;
  r.window_left = op->wl;
  r.window_right = op->wr;
  r.softcap = op->softcap;
  r.q = q;
  r.k = s->k;
  r.v = s->v;
  r.o = q; /* validation wants an output; the reference writes its own */
  int64_t ks[3] = {s->hkv * s->n * s->d, s->n * s->d, s->d};
  memcpy(r.k_stride, ks, sizeof ks);
  memcpy(r.v_stride, ks, sizeof ks);
  const size_t no = (size_t)(s->hq * nq * s->d), nr = (size_t)(s->hq * nq);
  double *o = malloc(no * sizeof *o), *m = malloc(nr * 8), *l = malloc(nr * 8),
         *lse = malloc(nr * 8);
  attn_status st;
  cr_assert_eq(attn_reference(&r, o, m, l, lse, &st), 0, "%s", st.message);
  double num = 0, den = 0, err = 0;
  for (size_t i = 0; i < no; i++) {
    double x = attn_load_elem(y->o, s->dt, i);
    num += (x - o[i]) * (x - o[i]);
    den += o[i] * o[i];
  }
  err = den > 0 ? sqrt(num / den) : sqrt(num);
  for (size_t i = 0; y->lse && i < nr; i++) {
    double e = fabs(y->lse[i] - lse[i]) / fmax(1, fabs(lse[i]));
    err = isfinite(lse[i]) ? fmax(err, e) : err;
  }
  free(q);
  free(o);
  free(m);
  free(l);
  free(lse);
  return err;
}

static attn_kv_store *open_store(attn_engine *e, uint64_t bytes, bool batch) {
  attn_kv_store *kv;
  attn_status st;
  cr_assert_eq(attn_kv_open(e, bytes, batch, &kv, &st), 0, "%s", st.message);
  return kv;
}

static void make(attn_kv_store *kv, const char *tenant, const char *id, const stream *s,
                 int64_t layers, int64_t max_tokens, double ttl, double now) {
  attn_kv_shape sh = {s->hkv, s->d, s->dt, layers, max_tokens};
  bool created;
  attn_status st;
  cr_assert_eq(attn_kv_create(kv, tenant, id, &sh, ttl, now, &created, &st), 0, "%s", st.message);
}

/* Prefill of `pre` tokens, then one token a step to s->n, each checked. */
static int decode_checked(attn_kv_store *kv, const char *id, const stream *s, const opts *op,
                          int64_t pre, const char *what) {
  reply y;
  attn_status st;
  int fails = 0;
  for (int64_t pos = 0; pos < s->n;) {
    int64_t n = pos == 0 ? pre : 1;
    cr_assert_eq(call1(kv, "", id, s, op, pos, n, pos, n, &y, 0, &st), 0, "%s: %s", what,
                 st.message);
    cr_expect_eq(y.length, pos + n, "%s: length %lld after pos %lld", what, (long long)y.length,
                 (long long)pos);
    double err = ref_error(s, op, pos, n, pos + n, &y);
    if (!(err <= ttol(s->dt))) {
      fails++;
      cr_log_error("%s: step at pos %lld: error %.3g > %.3g", what, (long long)pos, err,
                   ttol(s->dt));
    }
    reply_free(&y);
    pos += n;
  }
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
    attn_kv_store *kv = open_store(e, 64 * MIB, k % 2 == 0);
    for (int t = 0; t < 3; t++) {
      char id[32], what[96];
      snprintf(id, sizeof id, "s-%d", t);
      stream s = stream_make(8, 2, 64, 200, dts[t], 7 + (uint64_t)t);
      make(kv, "", id, &s, 1, 4096, 600, 0);
      snprintf(what, sizeof what, "%s %s", isas[k], attn_dtype_name(dts[t]));
      opts op = plain;
      op.stats = t == 1;
      fails += decode_checked(kv, id, &s, &op, 160, what);
      stream_free(&s);
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
  attn_kv_store *kv = open_store(e, 256 * MIB, true);
  stream s = stream_make(4, 1, 128, 1300, ATTN_BF16, 3);
  make(kv, "", "long", &s, 1, 2000, 600, 0);
  opts op = plain;
  op.wl = 700;
  op.softcap = 30;
  op.stats = true;
  cr_assert_eq(decode_checked(kv, "long", &s, &op, 1296, "long"), 0);
  stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, replay_is_bit_equal_and_conflicts_append_nothing) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  stream s = stream_make(4, 2, 32, 40, ATTN_F16, 11);
  make(kv, "", "r", &s, 1, 64, 600, 0);
  reply first, again, y;
  attn_status st;
  cr_assert_eq(call1(kv, "", "r", &s, &plain, 0, 30, 0, 30, &y, 0, &st), 0, "%s", st.message);
  reply_free(&y);
  cr_assert_eq(call1(kv, "", "r", &s, &plain, 30, 1, 30, 1, &first, 0, &st), 0);
  cr_assert_eq(call1(kv, "", "r", &s, &plain, 31, 2, 31, 2, &y, 0, &st), 0);
  reply_free(&y);
  /* the step at 30 again: a replay, the first reply's bits, nothing appended */
  cr_assert_eq(call1(kv, "", "r", &s, &plain, 30, 1, 30, 1, &again, 0, &st), 0, "%s", st.message);
  cr_expect(again.replay && !first.replay);
  cr_expect_eq(again.length, 33);
  cr_expect_eq(memcmp(first.o, again.o, (size_t)(4 * 32 * 2)), 0, "a replay's O differs");
  reply_free(&again);
  /* past the length, and before it with other tokens: conflicts */
  cr_expect_eq(call1(kv, "", "r", &s, &plain, 34, 1, 34, 1, &y, 0, &st), ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "length 33"), "%s", st.message);
  reply_free(&y);
  stream other = stream_make(4, 2, 32, 40, ATTN_F16, 12);
  cr_expect_eq(call1(kv, "", "r", &other, &plain, 31, 1, 31, 1, &y, 0, &st),
               ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "not a replay"), "%s", st.message);
  reply_free(&y);
  attn_kv_info info;
  int64_t len = -1;
  cr_assert_eq(attn_kv_get(kv, "", "r", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 33, "a conflict appended: length %lld", (long long)len);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.replays, 1);
  cr_expect_eq(stats.conflicts, 2);
  cr_expect_eq(stats.appended_tokens, 33);
  reply_free(&first);
  stream_free(&other);
  stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, truncate_then_append_other_tokens) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = open_store(e, 16 * MIB, false);
  stream a = stream_make(4, 2, 64, 300, ATTN_F32, 21), b = stream_make(4, 2, 64, 300, ATTN_F32, 22);
  make(kv, "", "t", &a, 1, 512, 600, 0);
  reply y;
  attn_status st;
  cr_assert_eq(call1(kv, "", "t", &a, &plain, 0, 300, 0, 300, &y, 0, &st), 0, "%s", st.message);
  reply_free(&y);
  cr_assert_eq(attn_kv_truncate(kv, "", "t", 100, 0, &st), 0);
  /* b's tokens [100, 300) with a's first 100: build the stream both hold */
  size_t w = 64 * 4;
  for (int64_t h = 0; h < 2; h++) {
    memcpy((char *)b.k + (size_t)(h * 300) * w, (char *)a.k + (size_t)(h * 300) * w, 100 * w);
    memcpy((char *)b.v + (size_t)(h * 300) * w, (char *)a.v + (size_t)(h * 300) * w, 100 * w);
  }
  cr_assert_eq(call1(kv, "", "t", &b, &plain, 100, 200, 100, 200, &y, 0, &st), 0, "%s", st.message);
  cr_expect_eq(y.length, 300);
  cr_expect_leq(ref_error(&b, &plain, 100, 200, 300, &y), ttol(ATTN_F32));
  reply_free(&y);
  stream_free(&a);
  stream_free(&b);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, layers_limits_and_refusals) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  stream s = stream_make(4, 2, 16, 20, ATTN_BF16, 31);
  make(kv, "", "l", &s, 3, 16, 600, 0);
  reply y;
  attn_status st;
  opts op = plain;
  op.layer = 2;
  cr_assert_eq(call1(kv, "", "l", &s, &op, 0, 5, 0, 5, &y, 0, &st), 0, "%s", st.message);
  reply_free(&y);
  op.layer = 1;
  cr_assert_eq(call1(kv, "", "l", &s, &op, 0, 3, 0, 3, &y, 0, &st), 0);
  cr_expect_leq(ref_error(&s, &op, 0, 3, 3, &y), ttol(ATTN_BF16));
  reply_free(&y);
  int64_t len[3];
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "l", 0, &info, len, 3, &st), 0);
  cr_expect(len[0] == 0 && len[1] == 3 && len[2] == 5);
  op.layer = 3;
  cr_expect_eq(call1(kv, "", "l", &s, &op, 0, 1, 0, 1, &y, 0, &st), ATTN_EINVAL);
  reply_free(&y);
  op.layer = 2;
  cr_expect_eq(call1(kv, "", "l", &s, &op, 5, 12, 5, 12, &y, 0, &st), ATTN_ESESSION_FULL);
  reply_free(&y);
  stream f = stream_make(4, 2, 16, 20, ATTN_F16, 32);
  cr_expect_eq(call1(kv, "", "l", &f, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_EDTYPE);
  reply_free(&y);
  stream g = stream_make(4, 4, 16, 20, ATTN_BF16, 33);
  cr_expect_eq(call1(kv, "", "l", &g, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_ESHAPE);
  reply_free(&y);
  attn_store_elem(s.k, ATTN_BF16, 5 * 16 + 3, NAN); /* head 0, token 5 */
  cr_expect_eq(call1(kv, "", "l", &s, &op, 5, 1, 5, 1, &y, 0, &st), ATTN_ENONFINITE);
  reply_free(&y);
  /* attend without new tokens: over the layer's whole length */
  cr_assert_eq(call1(kv, "", "l", &s, &op, 4, 1, 0, 0, &y, 0, &st), 0, "%s", st.message);
  cr_expect_eq(y.length, 5);
  cr_expect_leq(ref_error(&s, &op, 4, 1, 5, &y), ttol(ATTN_BF16));
  reply_free(&y);
  cr_expect_eq(call1(kv, "", "nobody", &s, &op, 0, 1, 0, 1, &y, 0, &st), ATTN_ESESSION_NOT_FOUND);
  reply_free(&y);
  stream_free(&s);
  stream_free(&f);
  stream_free(&g);
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, memory_reserved_at_create_and_freed_by_delete) {
  attn_engine *e = topen(1, NULL);
  /* 16 pages of 64 KiB: a session of 2 KV heads, 1 layer, up to one page
   * of tokens reserves 4 (K and V of each head) */
  attn_kv_store *kv = open_store(e, 16 * 64 * 1024, true);
  attn_kv_shape sh = {2, 64, ATTN_F32, 1, 100};
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
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  stream s = stream_make(2, 1, 8, 4, ATTN_F32, 41);
  make(kv, "", "ttl", &s, 1, 8, 5, 100);
  attn_kv_info info;
  attn_status st;
  reply y;
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 104, &info, NULL, 0, &st), 0);
  cr_expect_eq(info.expires, 105);
  cr_assert_eq(call1(kv, "", "ttl", &s, &plain, 0, 1, 0, 1, &y, 104, &st), 0, "%s", st.message);
  reply_free(&y);
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 108.5, &info, NULL, 0, &st), 0, "a use renews the TTL");
  cr_expect_eq(attn_kv_expire(kv, 108.9), 0);
  cr_expect_eq(attn_kv_expire(kv, 109), 1);
  cr_expect_eq(attn_kv_get(kv, "", "ttl", 109, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  make(kv, "", "ttl2", &s, 1, 8, 5, 200);
  cr_expect_eq(call1(kv, "", "ttl2", &s, &plain, 0, 1, 0, 1, &y, 205, &st), ATTN_ESESSION_NOT_FOUND,
               "an expired session was used");
  reply_free(&y);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.expired, 2);
  cr_expect_eq(stats.sessions, 0);
  stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

static void count_one(const attn_kv_info *info, const int64_t *lengths, void *arg) {
  (void)info, (void)lengths;
  (*(int *)arg)++;
}

Test(kvstore, tenants_are_namespaces) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  stream a = stream_make(2, 1, 8, 4, ATTN_F32, 51), b = stream_make(2, 1, 8, 4, ATTN_F32, 52);
  make(kv, "alice", "x", &a, 1, 8, 60, 0);
  make(kv, "bob", "x", &b, 1, 8, 60, 0);
  make(kv, "bob", "y", &b, 1, 8, 60, 0);
  reply y;
  attn_status st;
  cr_assert_eq(call1(kv, "alice", "x", &a, &plain, 0, 4, 0, 4, &y, 0, &st), 0);
  reply_free(&y);
  int64_t len = -1;
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "bob", "x", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0, "alice's append reached bob's session");
  cr_expect_eq(attn_kv_get(kv, "alice", "y", 0, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  cr_expect_eq(attn_kv_get(kv, "", "x", 0, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND);
  int na = 0, nb = 0;
  cr_expect_eq(attn_kv_list(kv, "alice", 0, count_one, &na), 1);
  cr_expect_eq(attn_kv_list(kv, "bob", 0, count_one, &nb), 2);
  cr_expect_eq(attn_kv_delete(kv, "alice", "y", 0, &st), ATTN_ESESSION_NOT_FOUND);
  cr_expect_eq(attn_kv_truncate(kv, "alice", "y", 0, 0, &st), ATTN_ESESSION_NOT_FOUND);
  stream_free(&a);
  stream_free(&b);
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

/* One layer of three sessions in one call: q rows [p_i, p_i + nq_i) of
 * stream i and its tokens [p_i, p_i + nn_i), packed. */
typedef struct batch {
  const char *ids[3];
  const stream *s[3];
  int64_t pos[3], nq[3], nn[3];
} batch;

static int call_batch(attn_kv_store *kv, const batch *bt, int n, void **po, double now,
                      attn_status *st) {
  attn_kv_entry en[3];
  int64_t cu_q[4] = {0}, tq = 0, tk = 0;
  const stream *s0 = bt->s[0];
  for (int i = 0; i < n; i++) {
    en[i] = (attn_kv_entry){.id = bt->ids[i], .pos = bt->pos[i], .n_new = bt->nn[i], .kv_off = tk};
    tq += bt->nq[i];
    tk += bt->nn[i];
    cu_q[i + 1] = tq;
  }
  size_t es = attn_dtype_size(s0->dt), w = (size_t)s0->d * es;
  char *q = malloc((size_t)(s0->hq * tq) * w), *k = malloc((size_t)(s0->hkv * tk) * w + 1),
       *v = malloc((size_t)(s0->hkv * tk) * w + 1);
  *po = calloc((size_t)(s0->hq * tq), w);
  for (int i = 0, r0 = 0, k0 = 0; i < n; r0 += (int)bt->nq[i], k0 += (int)bt->nn[i], i++) {
    const stream *s = bt->s[i];
    for (int64_t h = 0; h < s->hq; h++)
      memcpy(q + (size_t)(h * tq + r0) * w, (char *)s->q + (size_t)(h * s->n + bt->pos[i]) * w,
             (size_t)bt->nq[i] * w);
    for (int64_t h = 0; h < s->hkv; h++) {
      memcpy(k + (size_t)(h * tk + k0) * w, (char *)s->k + (size_t)(h * s->n + bt->pos[i]) * w,
             (size_t)bt->nn[i] * w);
      memcpy(v + (size_t)(h * tk + k0) * w, (char *)s->v + (size_t)(h * s->n + bt->pos[i]) * w,
             (size_t)bt->nn[i] * w);
    }
  }
  attn_kv_call c = {
      .tenant = "", .nentries = n, .entries = en, .k_new = k, .v_new = v, .total_new = tk};
  attn_request_init(&c.req);
  c.req.heads_q = s0->hq;
  c.req.heads_kv = s0->hkv;
  c.req.head_dim = s0->d;
  c.req.seq_q = tq;
  c.req.dtype = s0->dt;
  c.req.causal = true;
  c.req.cu_seqlens_q = cu_q;
  c.req.q = q;
  c.req.o = *po;
  int rc = run_call(kv, &c, now, st);
  free(q);
  free(k);
  free(v);
  return rc;
}

Test(kvstore, batch_call_equals_single_calls_and_is_all_or_nothing, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = open_store(e, 64 * MIB, true);
  stream s[3] = {stream_make(8, 2, 64, 1200, ATTN_BF16, 61),
                 stream_make(8, 2, 64, 40, ATTN_BF16, 62),
                 stream_make(8, 2, 64, 300, ATTN_BF16, 63)};
  const char *single[3] = {"a1", "b1", "c1"}, *batched[3] = {"a2", "b2", "c2"};
  const int64_t pre[3] = {1199, 39, 250};
  reply y;
  attn_status st;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) {
      const char *id = j ? batched[i] : single[i];
      make(kv, "", id, &s[i], 2, 2048, 600, 0);
      cr_assert_eq(call1(kv, "", id, &s[i], &plain, 0, pre[i], 0, pre[i], &y, 0, &st), 0, "%s",
                   st.message);
      reply_free(&y);
    }
  /* a step of one token for a and b, two new tokens and three queries for c */
  batch bt = {{"a2", "b2", "c2"}, {&s[0], &s[1], &s[2]}, {1199, 39, 250}, {1, 1, 3}, {1, 1, 2}};
  void *bo;
  cr_assert_eq(call_batch(kv, &bt, 3, &bo, 0, &st), 0, "%s", st.message);
  size_t w = 64 * 2, off = 0;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(call1(kv, "", single[i], &s[i], &plain, bt.pos[i], bt.nq[i], bt.pos[i], bt.nn[i],
                       &y, 0, &st),
                 0, "%s", st.message);
    for (int64_t h = 0; h < 8; h++)
      cr_expect_eq(memcmp((char *)y.o + (size_t)(h * bt.nq[i]) * w,
                          (char *)bo + (size_t)(h * 5 + (int64_t)off) * w, (size_t)bt.nq[i] * w),
                   0, "session %d head %lld: the batch's O is not the single call's", i,
                   (long long)h);
    off += (size_t)bt.nq[i];
    reply_free(&y);
  }
  free(bo);
  /* one entry at a wrong pos refuses the call, naming it; nothing appended anywhere */
  batch bad = {{"a2", "b2", "c2"}, {&s[0], &s[2], &s[2]}, {1199, 30, 252}, {1, 1, 1}, {0, 1, 1}};
  cr_expect_eq(call_batch(kv, &bad, 3, &bo, 0, &st), ATTN_ESESSION_CONFLICT);
  cr_expect(strstr(st.message, "sessions[1]"), "%s", st.message);
  free(bo);
  int64_t len[2];
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "c2", 0, &info, len, 2, &st), 0);
  cr_expect_eq(len[0], 252, "a refused batch appended to c2");
  cr_assert_eq(attn_kv_get(kv, "", "b2", 0, &info, len, 2, &st), 0);
  cr_expect_eq(len[0], 40);
  batch dup = {{"a2", "a2", "c2"}, {&s[0], &s[0], &s[2]}, {1199, 1199, 252}, {1, 1, 1}, {0, 0, 0}};
  cr_expect_eq(call_batch(kv, &dup, 3, &bo, 0, &st), ATTN_EINVAL);
  free(bo);
  for (int i = 0; i < 3; i++)
    stream_free(&s[i]);
  attn_kv_close(kv);
  attn_engine_close(e);
}

typedef struct racer {
  attn_kv_store *kv;
  const char *id;
  const stream *s;
  int64_t pos, steps;
  int rc, fails;
  pthread_barrier_t *go;
} racer;

/* Decodes steps tokens from pos, each step checked against the reference. */
static void *decode_thread(void *arg) {
  racer *t = arg;
  pthread_barrier_wait(t->go);
  for (int64_t p = t->pos; p < t->pos + t->steps; p++) {
    reply y;
    attn_status st;
    t->rc = call1(t->kv, "", t->id, t->s, &plain, p, 1, p, 1, &y, 0, &st);
    if (t->rc == 0 && !(ref_error(t->s, &plain, p, 1, p + 1, &y) <= ttol(t->s->dt)))
      t->fails++;
    reply_free(&y);
    if (t->rc)
      break;
  }
  return NULL;
}

Test(kvstore, eight_sessions_decode_at_once, .timeout = 300) {
  const bool modes[2] = {false, true};
  for (int mode = 0; mode < 2; mode++) {
    attn_engine *e = topen(2, NULL);
    attn_kv_store *kv = open_store(e, 64 * MIB, modes[mode]);
    stream s[8];
    racer t[8];
    pthread_t th[8];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 8);
    char ids[8][8];
    for (int i = 0; i < 8; i++) {
      snprintf(ids[i], sizeof ids[i], "d%d", i);
      s[i] = stream_make(8, 2, 64, 120, i % 2 ? ATTN_F16 : ATTN_F32, 70 + (uint64_t)i);
      make(kv, "", ids[i], &s[i], 1, 128, 600, 0);
      reply y;
      attn_status st;
      cr_assert_eq(call1(kv, "", ids[i], &s[i], &plain, 0, 100, 0, 100, &y, 0, &st), 0);
      reply_free(&y);
      t[i] = (racer){kv, ids[i], &s[i], 100, 20, 0, 0, &go};
      pthread_create(&th[i], NULL, decode_thread, &t[i]);
    }
    for (int i = 0; i < 8; i++) {
      pthread_join(th[i], NULL);
      cr_expect_eq(t[i].rc, 0, "session %d: code %d", i, t[i].rc);
      cr_expect_eq(t[i].fails, 0, "session %d: %d steps off the reference", i, t[i].fails);
      stream_free(&s[i]);
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
  reply y;
  attn_status st;
  pthread_barrier_wait(t->go);
  t->rc = call1(t->kv, "", t->id, t->s, &plain, t->pos, 1, t->pos, 1, &y, 0, &st);
  reply_free(&y);
  return NULL;
}

Test(kvstore, two_racing_appends_at_one_pos_one_wins, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  for (int round = 0; round < 20; round++) {
    stream a = stream_make(4, 2, 32, 8, ATTN_F32, 100 + (uint64_t)round),
           b = stream_make(4, 2, 32, 8, ATTN_F32, 200 + (uint64_t)round);
    char id[16];
    snprintf(id, sizeof id, "race%d", round);
    make(kv, "", id, &a, 1, 8, 600, 0);
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
    stream_free(&a);
    stream_free(&b);
  }
  attn_kv_close(kv);
  attn_engine_close(e);
}

Test(kvstore, an_expired_session_gives_way_to_a_create) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = open_store(e, 4 * 64 * 1024, true);
  attn_kv_shape sh = {2, 64, ATTN_F32, 1, 100}; /* 4 pages: the whole store */
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
  attn_kv_store *kv = open_store(e, 16 * MIB, true);
  stream s = stream_make(2, 1, 8, 4, ATTN_F32, 81);
  make(kv, "", "t", &s, 1, 8, 60, 0);
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
  cr_expect_eq(run_call(kv, &c, 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "2 new rows"), "%s", st.message);
  c.total_new = 1;
  en.kv_off = 1;
  cr_expect_eq(run_call(kv, &c, 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "rows 0 and on"), "%s", st.message);
  int64_t len = -1;
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "t", 0, &info, &len, 1, &st), 0);
  cr_expect_eq(len, 0);
  stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}
