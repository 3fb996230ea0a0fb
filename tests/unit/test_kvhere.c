/*
 * test_kvhere.c — a session call computed on the caller's thread
 * (attn_kv_run_here, kv.h): the same bits as the call submitted, on every
 * CPU kernel this machine runs; refusals as attn_kv_submit's; a call larger
 * than its bound, or on a layer another call holds, left to the queue with
 * nothing applied; and, while the engine's one worker is held by the test,
 * calls on free layers (alone and batched) still computed, so that a
 * caller never waits for the engine's threads. Every result is checked
 * against the float64 reference.
 */
#include "helpers.h"
#include "kvcalls.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define BIG 1e15 /* a max_flops no call here reaches */

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

static int64_t length_of(attn_kv_store *kv, const char *id) {
  attn_kv_info info;
  int64_t len = -1;
  attn_status st;
  cr_assert_eq(attn_kv_get(kv, "", id, 0, &info, &len, 1, &st), 0, "%s", st.message);
  return len;
}

/* Prefill of pre tokens submitted, then one token a step to the stream's
 * end on two sessions of the same stream: "q" submitted, "h" run here.
 * Every step's O the same bits, within tolerance of float64. */
static int here_against_queued(attn_engine *e, const char *what) {
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(6, 2, 64, 90, ATTN_BF16, 17);
  tkv_make(kv, "", "q", &s, 1, 256, 600, 0);
  tkv_make(kv, "", "h", &s, 1, 256, 600, 0);
  tkv_opts here = tkv_plain;
  here.here = BIG;
  tkv_reply y, z;
  attn_status st;
  int fails = 0;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(tkv_call1(kv, "", i ? "h" : "q", &s, &tkv_plain, 0, 30, 0, 30, &y, 0, &st), 0,
                 "%s", st.message);
    tkv_reply_free(&y);
  }
  for (int64_t pos = 30; pos < s.n; pos++) {
    int rq = tkv_call1(kv, "", "q", &s, &tkv_plain, pos, 1, pos, 1, &y, 0, &st);
    int rh = tkv_call1(kv, "", "h", &s, &here, pos, 1, pos, 1, &z, 0, &st);
    size_t bytes = (size_t)(s.hq * s.d) * attn_dtype_size(s.dt);
    bool ok = rq == 0 && rh == 0 && z.length == pos + 1 && !memcmp(y.o, z.o, bytes) &&
              tkv_ref_error(&s, &tkv_plain, pos, 1, pos + 1, &z) <= ttol(s.dt);
    if (!ok && fails++ == 0)
      cr_log_error("%s: step at %lld: codes %d/%d (%s), length %lld", what, (long long)pos, rq, rh,
                   st.message, (long long)z.length);
    tkv_reply_free(&y);
    tkv_reply_free(&z);
  }
  tkv_stream_free(&s);
  attn_kv_close(kv);
  return fails;
}

Test(kvhere, decode_here_is_the_queued_decode_bit_for_bit, .timeout = 300) {
  int fails = 0;
  for (int k = 0; k < NISAS; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    fails += here_against_queued(e, isas[k]);
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d steps run here differ from the queued ones", fails);
}

Test(kvhere, refusals_as_submitted_and_large_calls_left_to_the_queue) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(4, 1, 32, 80, ATTN_F32, 5);
  tkv_make(kv, "", "a", &s, 1, 256, 600, 0);
  tkv_opts here = tkv_plain;
  here.here = BIG;
  tkv_reply y;
  attn_status st;
  cr_assert_eq(tkv_call1(kv, "", "a", &s, &here, 0, 40, 0, 40, &y, 0, &st), 0, "%s", st.message);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 0, 40, 40, &y), ttol(s.dt));
  tkv_reply_free(&y);
  /* a step of 4 * 4 * 41 * 32 * 1 = 21 kFLOP over a bound of 1000: the queue's */
  here.here = 1000;
  cr_expect_eq(tkv_call1(kv, "", "a", &s, &here, 40, 1, 40, 1, &y, 0, &st), ATTN_KV_LATER);
  tkv_reply_free(&y);
  cr_expect_eq(length_of(kv, "a"), 40, "a call left to the queue appended");
  here.here = BIG;
  cr_expect_eq(tkv_call1(kv, "", "a", &s, &here, 40, 1, 45, 1, &y, 0, &st), ATTN_ESESSION_CONFLICT,
               "a wrong pos: %s", st.message);
  tkv_reply_free(&y);
  cr_expect_eq(tkv_call1(kv, "", "nobody", &s, &here, 40, 1, 40, 1, &y, 0, &st),
               ATTN_ESESSION_NOT_FOUND);
  tkv_reply_free(&y);
  cr_expect_eq(length_of(kv, "a"), 40, "a refused call appended");
  cr_assert_eq(tkv_call1(kv, "", "a", &s, &here, 40, 1, 40, 1, &y, 0, &st), 0, "%s", st.message);
  cr_expect_eq(y.length, 41);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 40, 1, 41, &y), ttol(s.dt));
  tkv_reply_free(&y);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* ---- the engine's worker held --------------------------------------------- */

/* A job whose completion callback waits for the test: it holds the
 * engine's one worker until opened. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool entered, open, done;
  attn_result res;
} gate;

static void gate_hold(const attn_result *res, void *arg) {
  gate *g = arg;
  (void)res;
  pthread_mutex_lock(&g->mu);
  g->entered = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

/* A completion the test waits for. */
static void gate_done(const attn_result *res, void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  g->res = *res;
  g->done = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_wait(gate *g, bool *flag) {
  pthread_mutex_lock(&g->mu);
  while (!*flag)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Holds e's worker with a 1 x 1 x 1 x 4 job until g is opened. */
static void hold_worker(attn_engine *e, gate *g) {
  static float q[4] = {1, 0, 0, 0}, k[4] = {1, 1, 1, 1}, v[4] = {2, 2, 2, 2}, o[4];
  attn_request r;
  attn_request_init(&r);
  r.batch = r.heads_q = r.heads_kv = 1;
  r.seq_q = r.seq_kv = 1;
  r.head_dim = 4;
  r.dtype = ATTN_F32;
  r.q = q, r.k = k, r.v = v, r.o = o;
  r.backend = "cpu";
  attn_status st;
  cr_assert_eq(attn_engine_submit(e, &r, gate_hold, g, &st), 0, "%s", st.message);
  gate_wait(g, &g->entered);
}

/* A one-token step of s at pos on session id, its buffers in *b. */
typedef struct step {
  attn_kv_entry en;
  attn_kv_call c;
  void *q, *k, *v;
  tkv_reply y;
} step;

static void step_make(step *t, const char *id, const tkv_stream *s, int64_t pos) {
  memset(t, 0, sizeof *t);
  t->en = (attn_kv_entry){.id = id, .pos = pos, .n_new = 1};
  t->q = tkv_rows_of(s->q, s->hq, s->n, s->d, s->dt, pos, 1);
  t->k = tkv_rows_of(s->k, s->hkv, s->n, s->d, s->dt, pos, 1);
  t->v = tkv_rows_of(s->v, s->hkv, s->n, s->d, s->dt, pos, 1);
  t->y.o = calloc((size_t)(s->hq * s->d), attn_dtype_size(s->dt));
  t->c = (attn_kv_call){
      .tenant = "", .nentries = 1, .entries = &t->en, .k_new = t->k, .v_new = t->v, .total_new = 1};
  attn_request_init(&t->c.req);
  t->c.req.heads_q = s->hq;
  t->c.req.heads_kv = s->hkv;
  t->c.req.head_dim = s->d;
  t->c.req.seq_q = 1;
  t->c.req.dtype = s->dt;
  t->c.req.causal = true;
  t->c.req.q = t->q;
  t->c.req.o = t->y.o;
}

static void step_free(step *t) {
  free(t->q);
  free(t->k);
  free(t->v);
  tkv_reply_free(&t->y);
}

/* One layer of sessions a and b in one call run here, one token each at
 * pos; its O checked, each entry's rows, against float64. */
static void batch_here(attn_kv_store *kv, const tkv_stream *s, int64_t pos) {
  step a, b;
  step_make(&a, "a", s, pos);
  step_make(&b, "b", s, pos);
  const size_t w = (size_t)s->d * attn_dtype_size(s->dt);
  char *q = malloc((size_t)(2 * s->hq) * w), *k = malloc((size_t)(2 * s->hkv) * w),
       *v = malloc((size_t)(2 * s->hkv) * w), *o = calloc((size_t)(2 * s->hq), w);
  for (int64_t h = 0; h < s->hq; h++)
    for (int e = 0; e < 2; e++)
      memcpy(q + (size_t)(2 * h + e) * w, (char *)a.q + (size_t)h * w, w);
  for (int64_t h = 0; h < s->hkv; h++)
    for (int e = 0; e < 2; e++) {
      memcpy(k + (size_t)(2 * h + e) * w, (char *)a.k + (size_t)h * w, w);
      memcpy(v + (size_t)(2 * h + e) * w, (char *)a.v + (size_t)h * w, w);
    }
  attn_kv_entry en[2] = {{.id = "a", .pos = pos, .n_new = 1, .kv_off = 0},
                         {.id = "b", .pos = pos, .n_new = 1, .kv_off = 1}};
  int64_t cu[3] = {0, 1, 2};
  attn_kv_call c = a.c;
  c.nentries = 2, c.entries = en, c.k_new = k, c.v_new = v, c.total_new = 2;
  c.req.seq_q = 2, c.req.cu_seqlens_q = cu, c.req.q = q, c.req.o = o;
  attn_result res;
  attn_status st;
  cr_assert_eq(attn_kv_run_here(kv, &c, 0, BIG, &res, &st), 0, "%s", st.message);
  cr_assert_eq(res.status.code, 0, "%s", res.status.message);
  for (int e = 0; e < 2; e++) {
    for (int64_t h = 0; h < s->hq; h++)
      memcpy((char *)a.y.o + (size_t)h * w, o + (size_t)(2 * h + e) * w, w);
    cr_expect_leq(tkv_ref_error(s, &tkv_plain, pos, 1, pos + 1, &a.y), ttol(s->dt),
                  "entry %d of the batch run here", e);
    cr_expect_eq(en[e].length, pos + 1);
  }
  free(q), free(k), free(v), free(o);
  step_free(&a);
  step_free(&b);
}

Test(kvhere, calls_here_never_wait_for_the_engines_workers, .timeout = 120) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 16 * MIB, true, NULL);
  tkv_stream s = tkv_stream_make(4, 2, 64, 40, ATTN_F32, 9);
  const char *ids[4] = {"busy", "free", "a", "b"};
  tkv_reply y;
  attn_status st;
  for (int i = 0; i < 4; i++) {
    tkv_make(kv, "", ids[i], &s, 1, 256, 600, 0);
    cr_assert_eq(tkv_call1(kv, "", ids[i], &s, &tkv_plain, 0, 20, 0, 20, &y, 0, &st), 0);
    tkv_reply_free(&y);
  }
  gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  hold_worker(e, &g);
  /* a step of "busy" submitted: admitted, its job queued behind the held one */
  step t;
  step_make(&t, "busy", &s, 20);
  cr_assert_eq(attn_kv_submit(kv, &t.c, 0, gate_done, &g, &st), 0, "%s", st.message);
  /* its layer held by that call: left to the queue, nothing applied */
  tkv_opts here = tkv_plain;
  here.here = BIG;
  cr_expect_eq(tkv_call1(kv, "", "busy", &s, &here, 20, 1, 0, 0, &y, 0, &st), ATTN_KV_LATER);
  tkv_reply_free(&y);
  /* other sessions' steps, alone and batched, computed here meanwhile */
  cr_assert_eq(tkv_call1(kv, "", "free", &s, &here, 20, 1, 20, 1, &y, 0, &st), 0, "%s", st.message);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 20, 1, 21, &y), ttol(s.dt));
  tkv_reply_free(&y);
  batch_here(kv, &s, 20);
  cr_expect(!g.done, "the held worker ran the queued call");
  gate_open(&g);
  gate_wait(&g, &g.done);
  cr_expect_eq(g.res.status.code, 0, "%s", g.res.status.message);
  cr_expect_eq(t.en.length, 21);
  cr_expect_leq(tkv_ref_error(&s, &tkv_plain, 20, 1, 21, &t.y), ttol(s.dt));
  step_free(&t);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}
