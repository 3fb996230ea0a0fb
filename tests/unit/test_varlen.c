/*
 * test_varlen.c — variable-length batches (cu_seqlens) and diag_offset.
 *
 * A varlen batch is checked sequence by sequence against the float64
 * reference of that sequence as a problem of its own, its inputs copied out
 * of the packed tensors (so the check does not share the engine's
 * splitting): forward O and statistics, backward dq, dk, dv with the lse
 * given and recomputed, on every CPU kernel this machine runs and on the
 * reference backend. Sequences with no query or no key are included. Then
 * the refusals, and diag_offset checked by an identity that does not go
 * through attn_request_offset(): top-left causal (diag_offset 0) over Nkv
 * keys equals bottom-right causal over the first Nq keys.
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* amxemu: the amx kernel on the unit tests' emulation of its tiles (tests/lib/amx_emu.h). */
static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas, MAXSEQ = 64 };

typedef struct vspec {
  int nseq;
  int64_t lq[MAXSEQ], lk[MAXSEQ];
  int64_t hq, hkv, d;
  attn_dtype dt;
  bool causal;
  int64_t wl, wr;
  bool sinks;
} vspec;

typedef struct vcase {
  vspec s;
  tcase all; /* the packed tensors: [1, H, total, D] */
  int64_t cuq[MAXSEQ + 1], cuk[MAXSEQ + 1];
  tcase seq[MAXSEQ]; /* each sequence alone (unused where it is empty) */
} vcase;

static bool has_work(const vcase *v, int b) { return v->s.lq[b] > 0 && v->s.lk[b] > 0; }

static void vcase_init(vcase *v, const vspec *s, uint64_t seed) {
  memset(v, 0, sizeof *v);
  v->s = *s;
  for (int b = 0; b < s->nseq; b++) {
    v->cuq[b + 1] = v->cuq[b] + s->lq[b];
    v->cuk[b + 1] = v->cuk[b] + s->lk[b];
  }
  tprob p = tprob_make(1, s->hq, s->hkv, v->cuq[s->nseq], v->cuk[s->nseq], s->d, s->dt);
  p.causal = s->causal;
  p.wl = s->wl;
  p.wr = s->wr;
  p.stats = true;
  p.sinks = s->sinks;
  tcase_init(&v->all, &p, seed);
  attn_request *r = &v->all.req;
  r->batch = s->nseq;
  r->cu_seqlens_q = v->cuq;
  r->cu_seqlens_kv = v->cuk;
  const size_t es = attn_dtype_size(s->dt), row = (size_t)s->d * es;
  for (int b = 0; b < s->nseq; b++) {
    if (!has_work(v, b))
      continue;
    p.nq = s->lq[b];
    p.nkv = s->lk[b];
    tcase_init(&v->seq[b], &p, seed + 1 + (uint64_t)b);
    trows_copy(v->all.q, v->seq[b].q, s->hq, r->seq_q, v->cuq[b], p.nq, row, true);
    trows_copy(v->all.k, v->seq[b].k, s->hkv, r->seq_kv, v->cuk[b], p.nkv, row, true);
    trows_copy(v->all.v, v->seq[b].v, s->hkv, r->seq_kv, v->cuk[b], p.nkv, row, true);
  }
}

static void vcase_free(vcase *v) {
  tcase_free(&v->all);
  for (int b = 0; b < v->s.nseq; b++)
    if (has_work(v, b))
      tcase_free(&v->seq[b]);
}

/* Whether every element of rows [r0, r0 + n) of a packed [H, T, D] tensor is 0. */
static bool rows_zero(const void *x, attn_dtype dt, int64_t h, int64_t t, int64_t d, int64_t r0,
                      int64_t n) {
  for (int64_t i = 0; i < h; i++)
    for (int64_t k = 0; k < n * d; k++)
      if (attn_load_elem(x, dt, (size_t)((i * t + r0) * d + k)) != 0)
        return false;
  return true;
}

/* The forward's packed outputs sequence by sequence; returns failures. */
static int check_forward(vcase *v, const char *what) {
  const vspec *s = &v->s;
  const attn_request *r = &v->all.req;
  const size_t es = attn_dtype_size(s->dt), row = (size_t)s->d * es;
  int fails = 0;
  for (int b = 0; b < s->nseq; b++) {
    if (!has_work(v, b)) {
      bool ok = rows_zero(v->all.o, s->dt, s->hq, r->seq_q, s->d, v->cuq[b], s->lq[b]);
      for (int64_t h = 0; h < s->hq; h++) /* with a sink, the sink's statistics alone */
        for (int64_t i = 0; i < s->lq[b]; i++) {
          const int64_t at = h * r->seq_q + v->cuq[b] + i;
          const float t = s->sinks ? v->all.sinks[h] : -INFINITY;
          ok &= v->all.m[at] == t && v->all.l[at] == (s->sinks ? 1 : 0) && v->all.lse[at] == t;
        }
      cr_expect(ok, "%s: sequence %d (%lld queries, no key) is not O = 0, m = lse = %s, l = %d",
                what, b, (long long)s->lq[b], s->sinks ? "sink" : "-inf", s->sinks);
      fails += !ok;
      continue;
    }
    tcase *c = &v->seq[b];
    trows_copy(v->all.o, c->o, s->hq, r->seq_q, v->cuq[b], s->lq[b], row, true);
    trows_copy(v->all.m, c->m, s->hq, r->seq_q, v->cuq[b], s->lq[b], 4, true);
    trows_copy(v->all.l, c->l, s->hq, r->seq_q, v->cuq[b], s->lq[b], 4, true);
    trows_copy(v->all.lse, c->lse, s->hq, r->seq_q, v->cuq[b], s->lq[b], 4, true);
    terr err = tcheck(c);
    bool ok = err.o <= ttol(s->dt) && err.masked_ok && err.stats <= 1e-5;
    char desc[200];
    cr_expect(ok, "%s: sequence %d (%s): O error %.3g (tol %.0e), stats %.3g, masked rows %s", what,
              b, tdesc(&c->p, desc, sizeof desc), err.o, ttol(s->dt), err.stats,
              err.masked_ok ? "ok" : "WRONG");
    fails += !ok;
  }
  return fails;
}

static int run_forward(attn_engine *e, vcase *v, const char *backend, const char *what) {
  attn_status st = {0};
  tcase_poison(&v->all);
  int rc = trun(e, &v->all, backend, &st);
  cr_expect_eq(rc, 0, "%s: engine failed: %s", what, st.message);
  return rc ? 1 : check_forward(v, what);
}

/* Backward inputs: each sequence's own O, dO and lse packed together. */
static void make_backward(vcase *v, uint64_t seed) {
  const vspec *s = &v->s;
  attn_request *r = &v->all.req;
  attn_status st;
  const size_t es = attn_dtype_size(s->dt), row = (size_t)s->d * es;
  const size_t nq = (size_t)(s->hq * r->seq_q), nk = (size_t)(s->hkv * r->seq_kv);
  tcase *a = &v->all; /* not tcase_backward(): the reference knows no varlen */
  a->dout = calloc(nq, row);
  a->dq = malloc(nq * row);
  a->dk = malloc(nk * row);
  a->dv = malloc(nk * row);
  a->lse_in = malloc(nq * 4);
  a->dsinks = s->sinks ? malloc((size_t)s->hq * sizeof *a->dsinks) : NULL;
  cr_assert(a->dout && a->dq && a->dk && a->dv && a->lse_in && (a->dsinks || !s->sinks));
  r->dsinks = a->dsinks;
  r->pass = ATTN_BACKWARD;
  r->m = r->l = r->lse = NULL;
  r->dout = a->dout;
  r->dq = a->dq;
  r->dk = a->dk;
  r->dv = a->dv;
  for (int b = 0; b < s->nseq; b++) {
    if (!has_work(v, b)) {
      for (int64_t h = 0; h < s->hq; h++) /* a row with no key has lse -inf */
        for (int64_t i = 0; i < s->lq[b]; i++)
          v->all.lse_in[h * r->seq_q + v->cuq[b] + i] = -INFINITY;
      continue;
    }
    tcase *c = &v->seq[b];
    cr_assert_eq(tcase_backward(c, true, seed + 1 + (uint64_t)b, &st), 0, "%s", st.message);
    trows_copy(v->all.o, c->o, s->hq, r->seq_q, v->cuq[b], s->lq[b], row, false);
    trows_copy(v->all.dout, c->dout, s->hq, r->seq_q, v->cuq[b], s->lq[b], row, false);
    trows_copy(v->all.lse_in, c->lse_in, s->hq, r->seq_q, v->cuq[b], s->lq[b], 4, false);
  }
}

/* dsinks sums the sequences': each one's float64 reference, alone. */
static int check_dsinks(vcase *v, const char *what) {
  const vspec *s = &v->s;
  if (!s->sinks)
    return 0;
  double ref[8] = {0}, one[8], num = 0, den = 0;
  attn_status st;
  for (int b = 0; b < s->nseq; b++) {
    if (!has_work(v, b))
      continue;
    cr_assert_eq(attn_reference_dsinks(&v->seq[b].req, one, &st), 0, "%s", st.message);
    for (int64_t h = 0; h < s->hq; h++)
      ref[h] += one[h];
  }
  for (int64_t h = 0; h < s->hq; h++) {
    const double x = v->all.dsinks[h];
    num += isnan(x) ? INFINITY : (x - ref[h]) * (x - ref[h]);
    den += ref[h] * ref[h];
  }
  const double err = sqrt(num / den);
  cr_expect(err <= ttol(s->dt), "%s: dsinks error %.3g (tol %.0e)", what, err, ttol(s->dt));
  return err > ttol(s->dt);
}

static int check_backward(vcase *v, const char *what) {
  const vspec *s = &v->s;
  const attn_request *r = &v->all.req;
  const size_t es = attn_dtype_size(s->dt), row = (size_t)s->d * es;
  int fails = 0;
  for (int b = 0; b < s->nseq; b++) {
    if (!has_work(v, b)) {
      bool ok = rows_zero(v->all.dq, s->dt, s->hq, r->seq_q, s->d, v->cuq[b], s->lq[b]) &&
                rows_zero(v->all.dk, s->dt, s->hkv, r->seq_kv, s->d, v->cuk[b], s->lk[b]) &&
                rows_zero(v->all.dv, s->dt, s->hkv, r->seq_kv, s->d, v->cuk[b], s->lk[b]);
      cr_expect(ok, "%s: empty sequence %d has nonzero gradients", what, b);
      fails += !ok;
      continue;
    }
    tcase *c = &v->seq[b];
    trows_copy(v->all.dq, c->dq, s->hq, r->seq_q, v->cuq[b], s->lq[b], row, true);
    trows_copy(v->all.dk, c->dk, s->hkv, r->seq_kv, v->cuk[b], s->lk[b], row, true);
    trows_copy(v->all.dv, c->dv, s->hkv, r->seq_kv, v->cuk[b], s->lk[b], row, true);
    tref_bwd ref;
    attn_status st;
    cr_assert_eq(tref_bwd_compute(c, &ref, &st), 0, "%s", st.message);
    terr_bwd err = tref_bwd_check(c, &ref);
    tref_bwd_free(&ref);
    bool ok = terr_bwd_within(&err, ttol(s->dt)) && err.zeros_ok;
    cr_expect(ok, "%s: sequence %d: dq %.3g dk %.3g dv %.3g (tol %.0e), zeros %s", what, b, err.dq,
              err.dk, err.dv, ttol(s->dt), err.zeros_ok ? "ok" : "WRONG");
    fails += !ok;
  }
  return fails + check_dsinks(v, what);
}

static int run_backward(attn_engine *e, vcase *v, const char *backend, bool with_lse,
                        const char *what) {
  attn_status st = {0};
  tcase_poison_grads(&v->all);
  v->all.req.lse_in = with_lse ? v->all.lse_in : NULL;
  int rc = trun(e, &v->all, backend, &st);
  cr_expect_eq(rc, 0, "%s: engine failed: %s", what, st.message);
  return rc ? 1 : check_backward(v, what);
}

/* The case list: empty sides, GQA, masks, every dtype, decode-like rows. */
static int vspecs(vspec *out) {
  int n = 0;
  out[n++] = (vspec){
      6, {5, 0, 70, 1, 33, 64}, {5, 9, 0, 200, 20, 64}, 4, 2, 37, ATTN_F32, true, -1, -1, false};
  out[n++] = (vspec){3, {100, 3, 0}, {130, 3, 7}, 2, 1, 64, ATTN_BF16, false, 8, 0, false};
  out[n++] = (vspec){4, {1, 1, 1, 2}, {1500, 1, 2, 50}, 3, 3, 16, ATTN_F16, false, -1, -1, false};
  /* whole blocks of 64 rows and keys for the amx kernel's tiles */
  out[n++] = (vspec){3, {192, 64, 130}, {256, 64, 70}, 4, 2, 128, ATTN_BF16, true, -1, -1, false};
  out[n++] =
      (vspec){2, {0, 4}, {3, 0}, 2, 2, 8, ATTN_F32, false, -1, -1, false}; /* nothing to run */
  /* sinks: sequences with no key (the sink's statistics alone), and whole tiles */
  out[n++] = (vspec){4, {5, 3, 70, 2}, {9, 0, 40, 300}, 5, 1, 32, ATTN_F32, true, -1, -1, true};
  out[n++] = (vspec){2, {128, 64}, {192, 64}, 4, 2, 128, ATTN_BF16, false, -1, -1, true};
  vspec many = {40, {0}, {0}, 4, 1, 64, ATTN_F32, true, 20, -1, false};
  for (int b = 0; b < many.nseq; b++) {
    many.lq[b] = 1 + (b * 7) % 50;
    many.lk[b] = many.lq[b] + (b % 3) * 5;
  }
  out[n++] = many;
  return n;
}

Test(varlen, forward_every_isa, .timeout = 300) {
  vspec specs[10];
  int ns = vspecs(specs), fails = 0;
  for (int k = 0; k < NISAS; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    for (int i = 0; i < ns; i++) {
      vcase *v = malloc(sizeof *v);
      vcase_init(v, &specs[i], 100 + (uint64_t)i);
      char what[64];
      snprintf(what, sizeof what, "%s, case %d", isas[k], i);
      fails += run_forward(e, v, "cpu", what);
      if (k == 0)
        fails += run_forward(e, v, "reference", "reference");
      vcase_free(v);
      free(v);
    }
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d varlen forward checks failed", fails);
}

Test(varlen, backward_every_isa, .timeout = 300) {
  vspec specs[10];
  int ns = vspecs(specs), fails = 0;
  for (int k = 0; k < NISAS; k++) {
    attn_engine *e = topen_isa(isas[k], 2);
    if (!e)
      continue;
    for (int i = 0; i < ns; i++) {
      vcase *v = malloc(sizeof *v);
      vcase_init(v, &specs[i], 200 + (uint64_t)i);
      make_backward(v, 300 + (uint64_t)i);
      char what[64];
      snprintf(what, sizeof what, "%s, case %d, lse given", isas[k], i);
      fails += run_backward(e, v, "cpu", true, what);
      snprintf(what, sizeof what, "%s, case %d, lse recomputed", isas[k], i);
      fails += run_backward(e, v, "cpu", false, what);
      if (k == 0)
        fails += run_backward(e, v, "reference", true, "reference");
      vcase_free(v);
      free(v);
    }
    attn_engine_close(e);
  }
  cr_assert_eq(fails, 0, "%d varlen backward checks failed", fails);
}

/* The visible pairs (and so the FLOPs) of a varlen batch are its sequences', and
 * so are the pairs it asks for. */
Test(varlen, flops_sum_the_sequences) {
  vspec s = {3, {4, 0, 6}, {4, 5, 2}, 2, 1, 8, ATTN_F32, true, -1, -1, false};
  vcase *v = malloc(sizeof *v);
  vcase_init(v, &s, 1);
  /* causal square 4x4: 10 pairs; no query: 0; 6 queries over 2 keys: the
   * last two rows see 1 and 2 keys, 3 pairs. Two heads. */
  cr_assert_eq(attn_request_visible_pairs(&v->all.req), 2 * (10 + 0 + 3));
  /* unmasked, each sequence its own nq x nkv: not total_q x total_kv */
  cr_assert_eq(attn_request_pairs(&v->all.req), 2 * (16 + 0 + 12));
  vcase_free(v);
  free(v);
}

static void expect_refused(attn_request *r, int code, const char *needle) {
  attn_status st = {0};
  int rc = attn_request_validate(r, &st);
  cr_expect_eq(rc, code, "expected %s, got %s: %s", attn_err_name(code), attn_err_name(rc),
               st.message);
  cr_expect(strstr(st.message, needle) != NULL, "message \"%s\" lacks \"%s\"", st.message, needle);
}

Test(varlen, bad_offsets_refused) {
  vspec s = {3, {4, 0, 6}, {4, 5, 2}, 2, 1, 8, ATTN_F32, false, -1, -1, false};
  vcase *v = malloc(sizeof *v);
  vcase_init(v, &s, 1);
  attn_request *r = &v->all.req;
  attn_status st;
  cr_assert_eq(attn_request_validate(r, &st), 0, "%s", st.message);
  v->cuq[0] = 1;
  expect_refused(r, ATTN_ESHAPE, "cu_seqlens_q[0] is 1");
  v->cuq[0] = 0;
  v->cuk[2] = 3;
  expect_refused(r, ATTN_ESHAPE, "cu_seqlens_kv[2] = 3 is below cu_seqlens_kv[1] = 4");
  v->cuk[2] = 9;
  v->cuk[3] = 10;
  expect_refused(r, ATTN_ESHAPE, "cu_seqlens_kv[3] = 10 but seq_kv is 11");
  v->cuk[3] = 11;
  r->cu_seqlens_kv = NULL;
  expect_refused(r, ATTN_EINVAL, "cu_seqlens_kv is missing");
  r->cu_seqlens_kv = v->cuk;
  r->diag_offset = 0;
  expect_refused(r, ATTN_EINVAL, "diag_offset cannot be combined with cu_seqlens");
  r->cu_seqlens_q = r->cu_seqlens_kv = NULL;
  r->batch = 1;
  r->diag_offset = ((int64_t)1 << 40) + 1;
  expect_refused(r, ATTN_EWINDOW, "diag_offset");
  r->diag_offset = -((int64_t)1 << 40);
  cr_expect_eq(attn_request_validate(r, &st), 0, "%s", st.message);
  vcase_free(v);
  free(v);
}

/* Top-left causal over Nkv keys (diag_offset 0) sees keys 0..i: the same
 * problem as bottom-right causal over the first Nq keys; and diag_offset
 * -s (rows see 0..i-s) the same as keys 0..Nq-s-1 aligned bottom-right,
 * whose first s rows see nothing. The engine's cpu backend and the
 * reference each against the truncated problem run without diag_offset. */
Test(varlen, diag_offset_is_top_left_causal) {
  attn_engine *e = topen(2, NULL);
  const int64_t nq = 40, nkv = 300, shifts[] = {0, 7};
  const char *const backends[] = {"cpu", "reference"};
  for (int si = 0; si < 2; si++)
    for (int bi = 0; bi < 2; bi++) {
      const int64_t s = shifts[si];
      tprob p = tprob_make(1, 2, 1, nq, nkv, 32, ATTN_F32);
      p.causal = true;
      p.stats = true;
      p.diag = -s;
      tcase full, cut;
      tcase_init(&full, &p, 5);
      p.nkv = nq - s;
      p.diag = ATTN_DIAG_AUTO;
      tcase_init(&cut, &p, 6);
      memcpy(cut.q, full.q, (size_t)(2 * nq * 32) * 4);
      trows_copy(full.k, cut.k, 1, nkv, 0, nq - s, 32 * 4, true);
      trows_copy(full.v, cut.v, 1, nkv, 0, nq - s, 32 * 4, true);
      attn_status st;
      cr_assert_eq(trun(e, &full, backends[bi], &st), 0, "%s", st.message);
      cr_assert_eq(trun(e, &cut, "reference", &st), 0, "%s", st.message);
      double num = 0, den = 0;
      for (int64_t i = 0; i < 2 * nq * 32; i++) {
        double a = ((float *)full.o)[i], b = ((float *)cut.o)[i];
        num += (a - b) * (a - b);
        den += b * b;
      }
      cr_expect(sqrt(num / den) <= 1e-5, "%s, shift %lld: O differs by %.3g", backends[bi],
                (long long)s, sqrt(num / den));
      for (int64_t i = 0; i < 2 * nq; i++)
        cr_expect(full.lse[i] == cut.lse[i] || fabsf(full.lse[i] - cut.lse[i]) <= 1e-5f,
                  "%s, shift %lld: lse[%lld] %g vs %g", backends[bi], (long long)s, (long long)i,
                  (double)full.lse[i], (double)cut.lse[i]);
      tcase_free(&full);
      tcase_free(&cut);
    }
  attn_engine_close(e);
}
