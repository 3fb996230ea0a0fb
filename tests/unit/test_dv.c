/*
 * test_dv.c — values with a head dim of their own (head_dim_v: DeepSeek's
 * MLA prefill, q·k over D 192 and values of Dv 128).
 *
 * The float64 reference takes Dv by the definition; it is checked here by
 * an identity that does not go through its Dv code (O over Dv columns is
 * the first Dv columns of O over V padded with zeros to D). Then every CPU
 * kernel this machine runs, forward and backward, Dv below and above D,
 * GQA, masks, a variable-length batch, against that reference; then the
 * refusals.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* A problem's tensors, contiguous [B, H, N, width], and its request. */
typedef struct dvcase {
  attn_request r;
  int64_t nq_el, nk_el, nv_el, no_el; /* elements of q, k, v, o */
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse;
} dvcase;

static void *rand_tensor(attn_dtype dt, int64_t n, uint64_t *seed) {
  void *p = malloc((size_t)n * attn_dtype_size(dt));
  for (int64_t i = 0; i < n; i++)
    attn_store_elem(p, dt, (size_t)i, (float)tuniform(seed));
  return p;
}

static void dv_init(dvcase *c, int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv,
                    int64_t d, int64_t dv, attn_dtype dt, bool causal, uint64_t seed) {
  memset(c, 0, sizeof *c);
  attn_request *r = &c->r;
  attn_request_init(r);
  r->batch = b, r->heads_q = hq, r->heads_kv = hkv, r->seq_q = nq, r->seq_kv = nkv;
  r->head_dim = d, r->head_dim_v = dv, r->dtype = dt, r->causal = causal;
  c->nq_el = b * hq * nq * d, c->nk_el = b * hkv * nkv * d;
  c->nv_el = b * hkv * nkv * dv, c->no_el = b * hq * nq * dv;
  c->q = rand_tensor(dt, c->nq_el, &seed);
  c->k = rand_tensor(dt, c->nk_el, &seed);
  c->v = rand_tensor(dt, c->nv_el, &seed);
  c->o = calloc((size_t)c->no_el, attn_dtype_size(dt));
  c->lse = calloc((size_t)(b * hq * nq), sizeof *c->lse);
  r->q = c->q, r->k = c->k, r->v = c->v, r->o = c->o, r->lse = c->lse;
}

/* The backward's inputs: O and lse from the float64 forward, dO drawn. */
static void dv_backward(dvcase *c, uint64_t seed) {
  attn_request *r = &c->r;
  double *o = malloc((size_t)c->no_el * sizeof *o);
  double *lse = malloc((size_t)(r->batch * r->heads_q * r->seq_q) * sizeof *lse);
  attn_status st;
  cr_assert_eq(attn_reference(r, o, NULL, NULL, lse, &st), 0, "%s", st.message);
  for (int64_t i = 0; i < c->no_el; i++)
    attn_store_elem(c->o, r->dtype, (size_t)i, (float)o[i]);
  for (int64_t i = 0; i < r->batch * r->heads_q * r->seq_q; i++)
    c->lse[i] = (float)lse[i];
  free(o);
  free(lse);
  c->dout = rand_tensor(r->dtype, c->no_el, &seed);
  const size_t es = attn_dtype_size(r->dtype);
  c->dq = malloc((size_t)c->nq_el * es);
  c->dk = malloc((size_t)c->nk_el * es);
  c->dv = malloc((size_t)c->nv_el * es);
  r->pass = ATTN_BACKWARD;
  r->lse = NULL;
  r->lse_in = c->lse;
  r->dout = c->dout, r->dq = c->dq, r->dk = c->dk, r->dv = c->dv;
}

static void dv_free(dvcase *c) {
  free(c->q), free(c->k), free(c->v), free(c->o), free(c->lse);
  free(c->dout), free(c->dq), free(c->dk), free(c->dv);
}

/* ||x - ref|| / ||ref|| over n elements of dtype dt (a NaN: infinite). */
static double nerr(const void *x, attn_dtype dt, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    const double a = attn_load_elem(x, dt, (size_t)i);
    num += isnan(a) ? INFINITY : (a - ref[i]) * (a - ref[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num / den);
}

/* O over V of Dv columns is the first Dv columns of O over V padded with
 * zeros to D: the reference's Dv against its own plain path. */
Test(dv, reference_is_the_padded_problem) {
  dvcase c;
  dv_init(&c, 2, 4, 2, 9, 13, 12, 5, ATTN_F32, true, 1);
  double *o = malloc((size_t)c.no_el * sizeof *o);
  attn_status st;
  cr_assert_eq(attn_reference(&c.r, o, NULL, NULL, NULL, &st), 0, "%s", st.message);
  attn_request p = c.r;
  p.head_dim_v = 0;
  float *vp = calloc((size_t)c.nk_el, sizeof *vp);
  for (int64_t i = 0; i < c.nv_el; i++)
    vp[i / 5 * 12 + i % 5] = ((const float *)c.v)[i];
  float *op = calloc((size_t)(2 * 4 * 9 * 12), sizeof *op);
  double *ow = malloc((size_t)(2 * 4 * 9 * 12) * sizeof *ow);
  p.v = vp, p.o = op, p.lse = NULL;
  cr_assert_eq(attn_reference(&p, ow, NULL, NULL, NULL, &st), 0, "%s", st.message);
  for (int64_t i = 0; i < c.no_el; i++)
    cr_expect_float_eq(o[i], ow[i / 5 * 12 + i % 5], 1e-14, "element %lld", (long long)i);
  free(o), free(vp), free(op), free(ow);
  dv_free(&c);
}

typedef struct dvspec {
  int64_t b, hq, hkv, nq, nkv, d, dv;
  bool causal;
} dvspec;

static const dvspec specs[] = {
    {1, 4, 4, 100, 130, 192, 128, true}, /* DeepSeek's prefill widths */
    {2, 6, 2, 70, 70, 64, 96, false},    /* Dv above D, GQA */
    {1, 3, 1, 1, 1500, 128, 64, false},  /* decode: the keys split */
    {2, 2, 2, 33, 20, 37, 5, true},      /* odd widths; rows that see nothing */
};

static int forward_case(attn_engine *e, const dvspec *s, attn_dtype dt, uint64_t seed,
                        const char *isa) {
  dvcase c;
  dv_init(&c, s->b, s->hq, s->hkv, s->nq, s->nkv, s->d, s->dv, dt, s->causal, seed);
  double *ref = malloc((size_t)c.no_el * sizeof *ref);
  attn_status st = {0};
  cr_assert_eq(attn_reference(&c.r, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double err = rc ? INFINITY : nerr(c.o, dt, ref, c.no_el);
  cr_expect(err <= ttol(dt), "%s, D %lld Dv %lld %s: O error %.3g", isa, (long long)s->d,
            (long long)s->dv, attn_dtype_name(dt), err);
  free(ref);
  dv_free(&c);
  return err > ttol(dt);
}

static int backward_case(attn_engine *e, const dvspec *s, attn_dtype dt, uint64_t seed,
                         const char *isa) {
  dvcase c;
  dv_init(&c, s->b, s->hq, s->hkv, s->nq, s->nkv, s->d, s->dv, dt, s->causal, seed);
  dv_backward(&c, seed + 1);
  double *ref = malloc((size_t)(c.nq_el + c.nk_el + c.nv_el) * sizeof *ref);
  attn_status st = {0};
  cr_assert_eq(attn_reference_backward(&c.r, ref, ref + c.nq_el, ref + c.nq_el + c.nk_el, &st), 0,
               "%s", st.message);
  int rc = attn_engine_run(e, &c.r, NULL, &st);
  cr_expect_eq(rc, 0, "%s: %s", isa, st.message);
  const double eq = rc ? INFINITY : nerr(c.dq, dt, ref, c.nq_el);
  const double ek = rc ? INFINITY : nerr(c.dk, dt, ref + c.nq_el, c.nk_el);
  const double ev = rc ? INFINITY : nerr(c.dv, dt, ref + c.nq_el + c.nk_el, c.nv_el);
  const bool ok = eq <= ttol(dt) && ek <= ttol(dt) && ev <= ttol(dt);
  cr_expect(ok, "%s, D %lld Dv %lld %s: dq %.3g dk %.3g dv %.3g", isa, (long long)s->d,
            (long long)s->dv, attn_dtype_name(dt), eq, ek, ev);
  free(ref);
  dv_free(&c);
  return !ok;
}

static void run_on(int isa, bool backward) {
  attn_engine *e = topen_isa(isas[isa], 2);
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  int fails = 0;
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
    for (int dt = 0; dt < ATTN_DTYPE_COUNT; dt++) {
      if (backward && specs[i].nkv > 1000) /* the reference backward's S and P */
        continue;
      fails += (backward ? backward_case : forward_case)(e, &specs[i], (attn_dtype)dt,
                                                         40 + 10 * i + (uint64_t)dt, isas[isa]);
    }
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d cases out of tolerance on %s", fails, isas[isa]);
}

#define ISA_TESTS(i, name)                                       \
  Test(dv, forward_##name, .timeout = 300) { run_on(i, false); } \
  Test(dv, backward_##name, .timeout = 300) { run_on(i, true); }

ISA_TESTS(0, generic)
ISA_TESTS(1, avx2)
ISA_TESTS(2, avx512)
ISA_TESTS(3, avx512bf16)
ISA_TESTS(4, amx)
ISA_TESTS(5, amxemu)

/* A variable-length batch is padded as a whole, then cut by its offsets:
 * each sequence against its own reference. */
Test(dv, varlen) {
  attn_engine *e = topen(2, NULL);
  const int64_t cu_q[] = {0, 7, 7, 20}, cu_k[] = {0, 9, 15, 40};
  dvcase c;
  dv_init(&c, 1, 4, 2, 20, 40, 48, 24, ATTN_F32, true, 90);
  c.r.batch = 3, c.r.cu_seqlens_q = cu_q, c.r.cu_seqlens_kv = cu_k;
  attn_status st = {0};
  cr_assert_eq(attn_engine_run(e, &c.r, NULL, &st), 0, "%s", st.message);
  for (int64_t s = 0; s < 3; s++) {
    attn_request one;
    attn_request_sequence(&c.r, s, &one);
    if (one.seq_q == 0)
      continue;
    const int64_t n = one.heads_q * one.seq_q * 24;
    double *ref = malloc((size_t)n * sizeof *ref);
    cr_assert_eq(attn_reference(&one, ref, NULL, NULL, NULL, &st), 0, "%s", st.message);
    double num = 0, den = 0;
    for (int64_t h = 0; h < 4; h++)
      for (int64_t i = 0; i < one.seq_q; i++)
        for (int64_t d = 0; d < 24; d++) {
          const double x = ((const float *)c.o)[(h * 20 + cu_q[s] + i) * 24 + d];
          const double y = ref[(h * one.seq_q + i) * 24 + d];
          num += (x - y) * (x - y), den += y * y;
        }
    cr_expect(sqrt(num / den) <= 1e-5, "sequence %lld: O error %.3g", (long long)s,
              sqrt(num / den));
    free(ref);
  }
  dv_free(&c);
  attn_engine_close(e);
}

Test(dv, refusals) {
  dvcase c;
  dv_init(&c, 1, 2, 2, 4, 4, 8, 4, ATTN_F32, false, 3);
  attn_status st = {0};
  c.r.head_dim_v = ATTN_MAX_HEAD_DIM + 1;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_ESHAPE);
  cr_expect(strstr(st.message, "head_dim_v"), "%s", st.message);
  c.r.head_dim_v = 4;
  const void *pages[2] = {c.k, c.k};
  c.r.k = c.r.v = NULL;
  c.r.k_pages = c.r.v_pages = pages;
  c.r.page_tokens = ATTN_PAGE_MIN_TOKENS, c.r.pages_per_head = 1;
  /* pages are W = max(D, Dv) wide: a device's pitch below that is refused */
  c.r.page_pitch = 4;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "page_pitch"), "%s", st.message);
  c.r.page_pitch = 8;
  cr_expect_eq(attn_request_validate(&c.r, &st), 0, "%s", st.message);
  /* rows a job writes are one width: not with two */
  const attn_page_rows rows = {c.k, (void *)(uintptr_t)c.k, 1};
  c.r.page_rows = &rows, c.r.npage_rows = 1;
  cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "page_rows"), "%s", st.message);
  dv_free(&c);
}
