/*
 * test_kv_quant.c — quantized session pages (attn_request.kv_quant): the
 * codec (engine/dtype.c: E4M3 and I8 codes, the row quantizer) and the
 * forward pass over quantized pages on every CPU kernel this machine runs.
 *
 * A kernel case quantizes a dense problem's K and V rows, lays the codes
 * and scales out in pages as a store does (engine.h,
 * attn_kv_quant_scales_at), and puts the dequantized rows (code·scale,
 * rounded to the dtype as the kernels round them) back into the dense
 * tensors: the paged run must then be within the dtype's tolerance of the
 * float64 reference over those rows, and the dense run bit for bit where
 * both tile the keys alike.
 *
 * The store's quantized sessions (16 KiB pages too): calls against the float64 reference
 * over the rows the session stores (a stream quantized and dequantized
 * row by row), a replay, a conflict, a truncate and appends after it,
 * the reservation, export and import, a save and a load.
 */
#include "helpers.h"
#include "kv/kv_int.h"
#include "kvcalls.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* ---- the codec --------------------------------------------------------- */

Test(kv_quant, names) {
  attn_kv_quant q;
  cr_expect_eq(attn_kv_quant_parse("F8_E4M3", &q), 0);
  cr_expect_eq(q, ATTN_KVQ_F8_E4M3);
  cr_expect_eq(attn_kv_quant_parse("I8", &q), 0);
  cr_expect_eq(q, ATTN_KVQ_I8);
  cr_expect_eq(attn_kv_quant_parse("F8_E5M2", &q), ATTN_EDTYPE);
  cr_expect_eq(attn_kv_quant_parse("BF16", &q), ATTN_EDTYPE);
  cr_expect_eq(attn_kv_quant_parse(NULL, &q), ATTN_EDTYPE);
  cr_expect_str_eq(attn_kv_quant_name(ATTN_KVQ_F8_E4M3), "F8_E4M3");
  cr_expect_str_eq(attn_kv_quant_name(ATTN_KVQ_I8), "I8");
  cr_expect_str_eq(attn_kv_quant_name(ATTN_KVQ_NONE), "?");
}

/* The E4M3 value of a code by its definition (bias 7, subnormals 2^-9
 * apart, exponent 15 with mantissa 7 NaN). */
static double e4m3_def(unsigned c) {
  const unsigned e = (c >> 3) & 15, m = c & 7;
  const double s = c & 0x80 ? -1 : 1;
  if (e == 15 && m == 7)
    return NAN;
  return e == 0 ? s * m * ldexp(1, -9) : s * (1 + m / 8.0) * ldexp(1, (int)e - 7);
}

Test(kv_quant, e4m3_every_code) {
  for (unsigned c = 0; c < 256; c++) {
    const double want = e4m3_def(c);
    const float got = attn_e4m3_to_f32((uint8_t)c);
    if (isnan(want)) {
      cr_expect(isnan(got), "code 0x%02x decodes to %g, not NaN", c, (double)got);
      continue;
    }
    cr_expect_eq((double)got, want, "code 0x%02x decodes to %g, not %g", c, (double)got, want);
    /* every value encodes back to its code (but -0, which is 0x80 too) */
    cr_expect_eq(attn_f32_to_e4m3(got), (uint8_t)c, "%g encodes to 0x%02x, not 0x%02x", (double)got,
                 attn_f32_to_e4m3(got), c);
  }
}

Test(kv_quant, e4m3_rounding) {
  /* ties to even: between 1 (0x38) and 1.125 (0x39), 1.0625 goes to 1;
   * between 1.125 and 1.25 (0x3A), 1.1875 goes to 1.25 */
  cr_expect_eq(attn_f32_to_e4m3(1.0625f), 0x38);
  cr_expect_eq(attn_f32_to_e4m3(1.0626f), 0x39);
  cr_expect_eq(attn_f32_to_e4m3(1.1875f), 0x3A);
  cr_expect_eq(attn_f32_to_e4m3(-1.1875f), 0xBA);
  /* subnormals: 2^-9 steps, a tie between 0 and 2^-9 goes to 0, between
   * the largest subnormal (7·2^-9) and the smallest normal (2^-6) to 2^-6 */
  cr_expect_eq(attn_f32_to_e4m3(0x1p-10f), 0x00);
  cr_expect_eq(attn_f32_to_e4m3(0x1.8p-9f), 0x02);
  cr_expect_eq(attn_f32_to_e4m3(7.5f * 0x1p-9f), 0x08);
  cr_expect_eq(attn_f32_to_e4m3(3 * 0x1p-9f), 0x03);
  /* saturation at 448 (0x7E), the "fn" variant's largest: never NaN */
  cr_expect_eq(attn_f32_to_e4m3(448.0f), 0x7E);
  cr_expect_eq(attn_f32_to_e4m3(470.0f), 0x7E);
  cr_expect_eq(attn_f32_to_e4m3(1e30f), 0x7E);
  cr_expect_eq(attn_f32_to_e4m3(-1e30f), 0xFE);
  /* the binade's top rounds up into the next binade's first code */
  cr_expect_eq(attn_f32_to_e4m3(1.97f), 0x40);
}

Test(kv_quant, i8) {
  cr_expect_eq((int8_t)attn_f32_to_i8(0.5f), 0);
  cr_expect_eq((int8_t)attn_f32_to_i8(1.5f), 2);
  cr_expect_eq((int8_t)attn_f32_to_i8(2.5f), 2);
  cr_expect_eq((int8_t)attn_f32_to_i8(-2.5f), -2);
  cr_expect_eq((int8_t)attn_f32_to_i8(126.6f), 127);
  cr_expect_eq((int8_t)attn_f32_to_i8(127.4f), 127);
  cr_expect_eq((int8_t)attn_f32_to_i8(300.0f), 127);
  cr_expect_eq((int8_t)attn_f32_to_i8(-300.0f), -127); /* never -128 */
  for (int c = -127; c <= 127; c++)
    cr_expect_eq(attn_kv_code_value(ATTN_KVQ_I8, attn_f32_to_i8((float)c)), (float)c);
}

Test(kv_quant, rows) {
  const float x[5] = {0.5f, -2.0f, 0.25f, 1e-3f, 1.0f};
  uint8_t c[5];
  float s = attn_kv_quantize_row(ATTN_KVQ_I8, x, ATTN_F32, 5, c);
  cr_expect_eq(s, 2.0f / 127.0f);
  cr_expect_eq((int8_t)c[1], -127, "the largest |x| takes the largest code");
  cr_expect_eq((int8_t)c[3], 0);
  s = attn_kv_quantize_row(ATTN_KVQ_F8_E4M3, x, ATTN_F32, 5, c);
  cr_expect_eq(s, 2.0f / 448.0f);
  cr_expect_eq(c[1], 0xFE);
  for (int i = 0; i < 5; i++) {
    const double err = fabs(attn_kv_code_value(ATTN_KVQ_F8_E4M3, c[i]) * s - x[i]);
    cr_expect(err <= fabs(x[i]) / 16 + 2 * ldexp(s, -9), "element %d: error %g", i, err);
  }
  /* a row of zeros: scale 0, codes 0 (also -0) */
  const float z[3] = {0.0f, -0.0f, 0.0f};
  memset(c, 0xAA, sizeof c);
  cr_expect_eq(attn_kv_quantize_row(ATTN_KVQ_F8_E4M3, z, ATTN_F32, 3, c), 0.0f);
  cr_expect(c[0] == 0 && c[1] == 0 && c[2] == 0);
  /* BF16 rows read as their values */
  uint16_t b[2] = {attn_f32_to_bf16(3.0f), attn_f32_to_bf16(-1.5f)};
  cr_expect_eq(attn_kv_quantize_row(ATTN_KVQ_I8, b, ATTN_BF16, 2, c), 3.0f / 127.0f);
}

Test(kv_quant, layout) {
  cr_expect_eq(attn_kv_quant_scales_at(64, 128), 64 * 128);
  cr_expect_eq(attn_kv_quant_scales_at(16, 37), 640); /* 592 up to a multiple of 64 */
}

/* ---- kernels over quantized pages --------------------------------------- */

/* Quantized pages of a dense case: codes and scales of every row of K and
 * V in pages of pt tokens ([B, Hkv, pph] tables), and the dense K and V
 * overwritten with what the pages hold, dequantized in the dtype. */
typedef struct qpages {
  char *pool;
  const void **kp, **vp;
  int64_t pt, pph;
  float mx[2];
  float *kx, *vx; /* code·scale in F32 (one rounding), the dense layout */
} qpages;

static void qpages_make(qpages *qp, tcase *c, attn_kv_quant q, int64_t pt) {
  const tprob *p = &c->p;
  const int64_t W = p->d, heads = p->b * p->hkv;
  const size_t es = attn_dtype_size(p->dt), page = attn_kv_quant_scales_at(pt, W) + 4 * (size_t)pt;
  qp->pt = pt;
  qp->pph = (p->nkv + pt - 1) / pt;
  qp->pool = malloc(2 * (size_t)(heads * qp->pph) * page);
  memset(qp->pool, 0x7F, 2 * (size_t)(heads * qp->pph) * page); /* NaN codes everywhere unused */
  qp->kp = calloc((size_t)(heads * qp->pph), sizeof *qp->kp);
  qp->vp = calloc((size_t)(heads * qp->pph), sizeof *qp->vp);
  qp->kx = malloc((size_t)(heads * p->nkv * W) * sizeof *qp->kx);
  qp->vx = malloc((size_t)(heads * p->nkv * W) * sizeof *qp->vx);
  qp->mx[0] = qp->mx[1] = 0;
  cr_assert(qp->pool && qp->kp && qp->vp && qp->kx && qp->vx);
  for (int64_t i = 0; i < heads * qp->pph; i++) {
    qp->kp[i] = qp->pool + (size_t)(2 * i) * page;
    qp->vp[i] = qp->pool + (size_t)(2 * i + 1) * page;
  }
  for (int t = 0; t < 2; t++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t j = 0; j < p->nkv; j++) {
        char *x = (char *)(t ? c->v : c->k) + (size_t)((h * p->nkv + j) * W) * es;
        char *pg = (char *)(uintptr_t)(t ? qp->vp : qp->kp)[h * qp->pph + j / pt];
        uint8_t *codes = (uint8_t *)pg + (j % pt) * W;
        float *xs = (t ? qp->vx : qp->kx) + (h * p->nkv + j) * W;
        if (j % 29 == 3) /* rows of zeros: scale 0 */
          memset(x, 0, (size_t)W * es);
        float s = attn_kv_quantize_row(q, x, p->dt, W, codes);
        memcpy(pg + attn_kv_quant_scales_at(pt, W) + 4 * (size_t)(j % pt), &s, 4);
        for (int64_t d = 0; d < W; d++) {
          xs[d] = attn_kv_code_value(q, codes[d]) * s;
          attn_store_elem(x, p->dt, (size_t)d, xs[d]);
          qp->mx[t] = fmaxf(qp->mx[t], fabsf((float)attn_load_elem(x, p->dt, (size_t)d)));
        }
      }
}

static void qpages_free(qpages *qp) {
  free(qp->pool);
  free(qp->kp);
  free(qp->vp);
  free(qp->kx);
  free(qp->vx);
}

/* The float64 reference over the pages' values themselves (qp->kx, vx) and
 * c's Q widened: what a kernel that reads the codes in place computes,
 * where c's K and V hold those values rounded to the dtype. */
static void exact_ref(const tcase *c, const qpages *qp, tref *ref) {
  const size_t nq = (size_t)(c->p.b * c->p.hq * c->p.nq * c->p.d);
  tcase x = *c;
  float *q = malloc(nq * sizeof *q);
  cr_assert(q);
  for (size_t i = 0; i < nq; i++)
    q[i] = (float)attn_load_elem(c->q, c->p.dt, i);
  x.p.dt = x.req.dtype = ATTN_F32;
  x.req.q = q;
  x.req.k = qp->kx;
  x.req.v = qp->vx;
  attn_status st;
  cr_assert_eq(tref_compute(&x, 2, ref, &st), 0, "%s", st.message);
  free(q);
}

/* Whether isa's blocks of c read quantized codes in place (flash_rows.h:
 * the AVX-512 kernels, few rows, head_dim a multiple of 16) rather than
 * dequantized copies: a decode of a GQA group of at most 4 heads. */
static bool reads_codes(const char *isa, const tcase *c) {
  const bool avx512 = strstr(isa, "avx512") || strstr(isa, "amx");
  return avx512 && c->p.d % 16 == 0 && c->p.nq == 1 && c->p.hq / c->p.hkv <= 4;
}

/* c (its K and V dequantized) on kernel isa from quantized pages qp: within
 * tolerance of ref, and the dense run's bits where tiles fall alike. */
static int run_quant(attn_engine *e, const char *isa, tcase *c, const tref *ref[2],
                     const qpages *qp, attn_kv_quant q) {
  char desc[240], what[320];
  snprintf(what, sizeof what, "%s, %s pages of %lld: %s", isa, attn_kv_quant_name(q),
           (long long)qp->pt, tdesc(&c->p, desc, sizeof desc));
  attn_status st = {0};
  attn_request dense = c->req;
  tcase_poison(c);
  cr_assert_eq(trun(e, c, "cpu", &st), 0, "%s: dense: %s", what, st.message);
  const size_t ob = (size_t)(c->p.b * c->p.hq * c->p.nq * c->p.d) * attn_dtype_size(c->p.dt);
  void *o = malloc(ob);
  memcpy(o, c->o, ob);
  c->req.k = c->req.v = NULL;
  c->req.k_pages = qp->kp;
  c->req.v_pages = qp->vp;
  c->req.page_tokens = qp->pt;
  c->req.pages_per_head = qp->pph;
  c->req.kv_absmax[0] = qp->mx[0];
  c->req.kv_absmax[1] = qp->mx[1];
  c->req.kv_quant = q;
  tcase_poison(c);
  int rc = trun(e, c, "cpu", &st);
  c->req = dense;
  cr_expect_eq(rc, 0, "%s: %s", what, st.message);
  int fails = rc != 0;
  if (rc == 0) {
    /* A kernel reading codes in place is checked against the pages' own
     * values (ref[1]), with the same tolerances; one dequantizing tiles
     * against the dtype's rounding of them (ref[0]), and the dense run's
     * bits. */
    const bool codes = reads_codes(isa, c);
    terr err = tref_check(c, ref[codes]);
    bool ok = err.o <= ttol(c->p.dt) && err.masked_ok && err.stats <= 1e-5;
    cr_expect(ok, "%s: O error %.3g (tol %.0e), stats %.3g%s", what, err.o, ttol(c->p.dt),
              err.stats, codes ? " against the pages' values" : "");
    fails += !ok;
    /* (amx's dense F16 runs its packed split tiles, which quantized
     * tiles skip for F32 products: the same tolerance, other bits) */
    const bool packs = c->p.dt == ATTN_F16 && strstr(isa, "amx");
    if (!codes && c->p.wl < 0 && qp->pt % ATTN_PAGE_ALIGN_TOKENS == 0 && !packs) {
      bool same = !memcmp(o, c->o, ob);
      cr_expect(same, "%s: not the dense run over the dequantized rows bit for bit", what);
      fails += !same;
    }
  }
  free(o);
  return fails;
}

/* Problem p in every dtype, both kinds, pages of 64 and 128 tokens, on
 * every kernel. */
static int run_everywhere(attn_engine *e[NISAS], tprob p, uint64_t seed) {
  static const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  int fails = 0;
  for (int di = 0; di < 3; di++)
    for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++)
      for (int64_t pt = 64; pt <= 128; pt *= 2) {
        p.dt = dts[di];
        p.stats = true;
        tcase c;
        tcase_init(&c, &p, seed + (uint64_t)(di * 10 + q));
        qpages qp;
        qpages_make(&qp, &c, (attn_kv_quant)q, pt);
        tref ref, ref1;
        attn_status st;
        cr_assert_eq(tref_compute(&c, 2, &ref, &st), 0, "%s", st.message);
        exact_ref(&c, &qp, &ref1);
        const tref *refs[2] = {&ref, &ref1};
        for (int k = 0; k < NISAS; k++)
          if (e[k])
            fails += run_quant(e[k], isas[k], &c, refs, &qp, (attn_kv_quant)q);
        tref_free(&ref);
        tref_free(&ref1);
        qpages_free(&qp);
        tcase_free(&c);
      }
  return fails;
}

static void open_all(attn_engine *e[NISAS]) {
  for (int k = 0; k < NISAS; k++)
    e[k] = topen_isa(isas[k], 2);
}

static void close_all(attn_engine *e[NISAS]) {
  for (int k = 0; k < NISAS; k++)
    if (e[k])
      attn_engine_close(e[k]);
}

/* Decoding: one query over split keys, GQA; an odd head dim (the scalar
 * tail of the dequantization) and a causal MQA. */
Test(kv_quant, decode, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  int fails = run_everywhere(e, tprob_make(1, 8, 2, 1, 1100, 128, ATTN_F32), 10);
  tprob mqa = tprob_make(1, 4, 1, 1, 700, 37, ATTN_F32);
  mqa.causal = true;
  fails += run_everywhere(e, mqa, 20);
  /* {heads_q, heads_kv, head_dim}: head dims the in-place path steps
   * through differently (48: E4M3 32 codes, then 16), groups of 3 and 1,
   * causal and not, the keys ending mid-page */
  static const int64_t shapes[4][3] = {{6, 2, 64}, {6, 6, 96}, {6, 2, 256}, {3, 1, 48}};
  for (int i = 0; i < 4; i++) {
    tprob p = tprob_make(1, shapes[i][0], shapes[i][1], 1, 333 + 40 * i, shapes[i][2], ATTN_F32);
    p.causal = i % 2 == 0;
    fails += run_everywhere(e, p, 30 + (uint64_t)i);
  }
  close_all(e);
  cr_assert_eq(fails, 0, "%d quantized decode checks failed", fails);
}

/* Prefill (causal, several query blocks: the AMX tiles), a sliding window
 * (tiles off the pages' boundaries), sinks and softcap. */
Test(kv_quant, prefill_and_variants, .timeout = 600) {
  attn_engine *e[NISAS];
  open_all(e);
  tprob p = tprob_make(1, 4, 2, 130, 200, 64, ATTN_F32);
  p.causal = true;
  int fails = run_everywhere(e, p, 40);
  p = tprob_make(1, 4, 1, 3, 500, 128, ATTN_F32);
  p.wl = 77;
  p.wr = 0;
  p.sinks = true;
  p.softcap = 30;
  fails += run_everywhere(e, p, 50);
  /* the same variants, and ALiBi, on a decode step (codes read in place) */
  p = tprob_make(1, 8, 2, 1, 600, 128, ATTN_F32);
  p.wl = 150;
  p.wr = 0;
  p.sinks = true;
  p.softcap = 20;
  p.alibi = true;
  fails += run_everywhere(e, p, 60);
  close_all(e);
  cr_assert_eq(fails, 0, "%d quantized prefill and variant checks failed", fails);
}

/* kv_quant is for host pages only. */
Test(kv_quant, refusals) {
  tprob p = tprob_make(1, 2, 1, 1, 16, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  attn_status st;
  c.req.kv_quant = ATTN_KVQ_I8; /* dense k and v */
  cr_expect_eq(attn_request_validate(&c.req, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "kv_quant"), "%s", st.message);
  c.req.kv_quant = (attn_kv_quant)7;
  cr_expect_eq(attn_request_validate(&c.req, &st), ATTN_EINVAL);
  tcase_free(&c);
}

/* ---- the store's quantized sessions ------------------------------------ */

#define MIB ((uint64_t)1 << 20)

/* s as a session of kind q stores it: every row of k (and v) quantized
 * per KV head and dequantized in the dtype (a latent session's v being
 * its stored k's first dv columns). */
static tkv_stream stored_stream(const tkv_stream *s, attn_kv_quant q) {
  tkv_stream o = *s;
  const size_t es = attn_dtype_size(s->dt);
  uint8_t codes[ATTN_MAX_HEAD_DIM];
  o.q = malloc((size_t)(s->hq * s->n * s->d) * es);
  memcpy(o.q, s->q, (size_t)(s->hq * s->n * s->d) * es);
  for (int t = 0; t < 2; t++) {
    const int64_t w = t ? s->dv : s->d;
    char *x = malloc((size_t)(s->hkv * s->n * w) * es);
    for (int64_t r = 0; r < s->hkv * s->n; r++) {
      char *row = x + (size_t)(r * w) * es;
      if (t && s->latent) {
        memcpy(row, (char *)o.k + (size_t)(r * s->d) * es, (size_t)w * es);
        continue;
      }
      const float sc = attn_kv_quantize_row(
          q, (const char *)(t ? s->v : s->k) + (size_t)(r * w) * es, s->dt, w, codes);
      for (int64_t d = 0; d < w; d++)
        attn_store_elem(row, s->dt, (size_t)d, attn_kv_code_value(q, codes[d]) * sc);
    }
    *(t ? &o.v : &o.k) = x;
  }
  return o;
}

static attn_kv_shape shape_of(const tkv_stream *s, attn_kv_quant q, int64_t layers) {
  return (attn_kv_shape){.heads_kv = s->hkv,
                         .head_dim = s->d,
                         .head_dim_v = s->latent || s->dv != s->d ? s->dv : 0,
                         .v_from_k = s->latent,
                         .dtype = s->dt,
                         .kv_quant = q,
                         .layers = layers,
                         .max_tokens = 512};
}

static void make(attn_kv_store *kv, const char *id, const tkv_stream *s, attn_kv_quant q) {
  attn_kv_shape sh = shape_of(s, q, 2);
  attn_status st;
  bool created;
  cr_assert_eq(attn_kv_create(kv, "", id, &sh, 600, 0, &created, &st), 0, "%s", st.message);
}

/* One call on layer l of id: queries and new tokens [pos, pos + n) of s,
 * its error against the reference over sq's keys [0, pos + n). */
static double call_error(attn_kv_store *kv, const char *id, const tkv_stream *s,
                         const tkv_stream *sq, int64_t l, int64_t pos, int64_t n, bool *replay) {
  tkv_opts op = tkv_plain;
  op.layer = l;
  tkv_reply y;
  attn_status st;
  int rc = tkv_call1(kv, "", id, s, &op, pos, n, pos, n, &y, 1, &st);
  cr_assert_eq(rc, 0, "%s at %lld: %s", id, (long long)pos, st.message);
  double e = tkv_ref_error(sq, &op, pos, n, pos + n, &y);
  if (replay)
    *replay = y.replay;
  tkv_reply_free(&y);
  return e;
}

/* The kinds of session a store test takes: D = Dv, Dv != D, latent. */
static tkv_stream stream_kind(int k, attn_dtype dt, uint64_t seed) {
  static const int64_t dims[3][2] = {{64, 64}, {48, 80}, {96, 64}};
  return tkv_stream_make_dv(4, 2, dims[k][0], dims[k][1], k == 2, 300, dt, seed);
}

Test(kv_quant, store_calls_replay_conflict_truncate, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, "cpu");
  static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16};
  for (int di = 0; di < 2; di++)
    for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++)
      for (int k = 0; k < 3; k++) {
        tkv_stream s = stream_kind(k, dts[di], (uint64_t)(100 * di + 10 * q + k));
        tkv_stream sq = stored_stream(&s, (attn_kv_quant)q);
        char id[32];
        snprintf(id, sizeof id, "s%d%d%d", di, q, k);
        make(kv, id, &s, (attn_kv_quant)q);
        const double tol = ttol(s.dt);
        bool replay = false;
        /* a prefill past a page's rows, decode steps */
        for (int64_t pos = 0, n = 130; pos < 140; pos += n, n = 1)
          cr_expect_leq(call_error(kv, id, &s, &sq, 1, pos, n, NULL), tol, "%s at %lld", id,
                        (long long)pos);
        cr_expect_leq(call_error(kv, id, &s, &sq, 1, 0, 40, &replay), tol, "%s replay", id);
        cr_expect(replay, "%s: the first 40 tokens again are a replay", id);
        tkv_stream other = stream_kind(k, dts[di], 999);
        tkv_opts op = tkv_plain;
        op.layer = 1;
        tkv_reply y;
        attn_status st;
        cr_expect_eq(tkv_call1(kv, "", id, &other, &op, 0, 2, 0, 2, &y, 1, &st),
                     ATTN_ESESSION_CONFLICT, "%s: other tokens at 0", id);
        tkv_reply_free(&y);
        tkv_stream_free(&other);
        cr_assert_eq(attn_kv_truncate(kv, "", id, 100, 1, &st), 0, "%s", st.message);
        for (int64_t pos = 100; pos < 103; pos++)
          cr_expect_leq(call_error(kv, id, &s, &sq, 1, pos, 1, NULL), tol, "%s after truncate", id);
        tkv_stream_free(&sq);
        tkv_stream_free(&s);
      }
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Forks of a quantized session: a page copied on write takes its rows'
 * scales with it (they lie after the page's rows), both when the source
 * writes first and when the fork does, and a fork's writes into a page it
 * alone holds leave the source's rows alone. */
Test(kv_quant, store_forks_copy_scales, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, "cpu");
  for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++)
    for (int k = 0; k < 3; k += 2) {
      tkv_stream s = stream_kind(k, ATTN_BF16, (uint64_t)(70 + 10 * q + k));
      tkv_stream sq = stored_stream(&s, (attn_kv_quant)q);
      const double tol = ttol(s.dt);
      attn_status st;
      make(kv, "src", &s, (attn_kv_quant)q);
      cr_expect_leq(call_error(kv, "src", &s, &sq, 1, 0, 130, NULL), tol, "prefill");
      cr_assert_eq(attn_kv_fork(kv, "", "src", "f", -1, 0, 0, &st), 0, "%s", st.message);
      /* the source writes into the shared page first: it copies it */
      for (int64_t pos = 130; pos < 135; pos++)
        cr_expect_leq(call_error(kv, "src", &s, &sq, 1, pos, 1, NULL), tol, "src at %lld",
                      (long long)pos);
      /* the fork's page is the original, now its own */
      for (int64_t pos = 130; pos < 140; pos++)
        cr_expect_leq(call_error(kv, "f", &s, &sq, 1, pos, 1, NULL), tol, "f at %lld",
                      (long long)pos);
      /* a fork of the fork writes first: it copies */
      cr_assert_eq(attn_kv_fork(kv, "", "f", "g", -1, 0, 0, &st), 0, "%s", st.message);
      for (int64_t pos = 140; pos < 145; pos++)
        cr_expect_leq(call_error(kv, "g", &s, &sq, 1, pos, 1, NULL), tol, "g at %lld",
                      (long long)pos);
      cr_expect_leq(call_error(kv, "f", &s, &sq, 1, 140, 1, NULL), tol, "f after g");
      cr_expect_leq(call_error(kv, "src", &s, &sq, 1, 135, 1, NULL), tol, "src after f");
      for (const char *const *id = (const char *const[]){"src", "f", "g", NULL}; *id; id++)
        cr_assert_eq(attn_kv_delete(kv, "", *id, 0, &st), 0, "%s", st.message);
      tkv_stream_free(&sq);
      tkv_stream_free(&s);
    }
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* Quantized rows of 64 codes and a scale: 960 a page where BF16's 128
 * bytes take 512; the store counts them as quantized bytes. */
Test(kv_quant, store_reservation) {
  attn_engine *e = topen(1, NULL);
  attn_kv_store *kv = tkv_open_store(e, 64 * MIB, false, "cpu");
  tkv_stream s = stream_kind(0, ATTN_BF16, 1);
  attn_kv_shape sh = shape_of(&s, ATTN_KVQ_I8, 2), plain = shape_of(&s, ATTN_KVQ_NONE, 2);
  sh.max_tokens = plain.max_tokens = 4000;
  cr_expect_eq(attn__kv_page_tokens(kv, &sh), 960);
  cr_expect_eq(attn__kv_page_tokens(kv, &plain), 512);
  cr_expect_eq(attn_kv_reserve_bytes(kv, &sh), 2 * 2 * 2 * 5 * (uint64_t)ATTN_KV_PAGE_BYTES);
  cr_expect_eq(attn_kv_reserve_bytes(kv, &plain), 2 * 2 * 2 * 8 * (uint64_t)ATTN_KV_PAGE_BYTES);
  attn_status st;
  bool created;
  cr_assert_eq(attn_kv_create(kv, "", "q", &sh, 600, 0, &created, &st), 0, "%s", st.message);
  cr_assert_eq(attn_kv_create(kv, "", "p", &plain, 600, 0, &created, &st), 0, "%s", st.message);
  attn_kv_stats stats;
  attn_kv_stats_get(kv, &stats);
  cr_expect_eq(stats.quantized_bytes, attn_kv_reserve_bytes(kv, &sh));
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(kv, "", "q", 1, &info, NULL, 0, &st), 0);
  cr_expect_eq(info.shape.kv_quant, ATTN_KVQ_I8);
  cr_expect_eq(info.reserved_bytes, attn_kv_reserve_bytes(kv, &sh));
  /* the same session but for kv_quant is another */
  sh.kv_quant = ATTN_KVQ_F8_E4M3;
  cr_expect_eq(attn_kv_create(kv, "", "q", &sh, 600, 0, &created, &st), ATTN_ESESSION_EXISTS);
  sh.kv_quant = (attn_kv_quant)9;
  cr_expect_eq(attn_kv_create(kv, "", "z", &sh, 600, 0, &created, &st), ATTN_EDTYPE);
  tkv_stream_free(&s);
  attn_kv_close(kv);
  attn_engine_close(e);
}

/* An export: its info, lengths and rows (codes, then scales). */
typedef struct qexport {
  attn_kv_info info;
  int64_t len[ATTN_KV_MAX_LAYERS];
  void *k[2], *v[2];
} qexport;

static void export_ok(attn_kv_store *kv, const char *id, qexport *x) {
  attn_status st;
  memset(x, 0, sizeof *x);
  cr_assert_eq(attn_kv_export(kv, "", id, 1, &x->info, x->len, x->k, x->v, &st), 0, "%s",
               st.message);
}

static size_t export_bytes(const qexport *x, int l, int t) {
  const attn_kv_shape *sh = &x->info.shape;
  return (size_t)(sh->heads_kv * x->len[l]) * (size_t)((t ? sh->head_dim_v : sh->head_dim) + 4);
}

static bool same_export(const qexport *a, const qexport *b) {
  for (int l = 0; l < 2; l++)
    for (int t = 0; t < (a->info.shape.v_from_k ? 1 : 2); t++)
      if (a->len[l] != b->len[l] ||
          memcmp(t ? a->v[l] : a->k[l], t ? b->v[l] : b->k[l], export_bytes(a, l, t)))
        return false;
  return true;
}

static void export_free(qexport *x) {
  for (int l = 0; l < 2; l++) {
    free(x->k[l]);
    free(x->v[l]);
  }
}

/* Each kind quantized both ways: exported from a, imported into b, saved
 * from b and loaded into c: every export the same bytes, and the next
 * call on c right. A scale no quantizer writes is refused. */
Test(kv_quant, store_export_import_save_load, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, false, "cpu");
  attn_kv_store *b = tkv_open_store(e, 64 * MIB, false, "cpu");
  attn_kv_store *c = tkv_open_store(e, 64 * MIB, false, "cpu");
  char dir[] = "/tmp/attn-kvquant-XXXXXX";
  cr_assert(mkdtemp(dir));
  tkv_stream s[6], sq[6];
  for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++)
    for (int k = 0; k < 3; k++) {
      const int i = (q - 1) * 3 + k;
      char id[16];
      snprintf(id, sizeof id, "m%d", i);
      s[i] = stream_kind(k, ATTN_BF16, (uint64_t)(50 + i));
      sq[i] = stored_stream(&s[i], (attn_kv_quant)q);
      make(a, id, &s[i], (attn_kv_quant)q);
      call_error(a, id, &s[i], &sq[i], 0, 0, 70, NULL);
      qexport x, y;
      export_ok(a, id, &x);
      attn_status st;
      cr_assert_eq(attn_kv_import(b, "", id, &x.info.shape, x.info.ttl_s, 1, x.len,
                                  (const void *const *)x.k,
                                  x.info.shape.v_from_k ? NULL : (const void *const *)x.v, &st),
                   0, "%s", st.message);
      export_ok(b, id, &y);
      cr_expect(same_export(&x, &y), "%s: the import's export differs", id);
      export_free(&y);
      if (k == 0) { /* row 3's k scale made negative: no quantizer's */
        const float neg = -1.0f;
        memcpy((char *)x.k[0] + 2 * 70 * 64 + 3 * 4, &neg, 4);
        cr_expect_eq(attn_kv_import(c, "", id, &x.info.shape, x.info.ttl_s, 1, x.len,
                                    (const void *const *)x.k, (const void *const *)x.v, &st),
                     ATTN_EINVAL, "a negative scale");
        cr_expect(strstr(st.message, "row 3"), "%s", st.message);
      }
      export_free(&x);
    }
  attn_status st;
  cr_assert_eq(attn_kv_save(b, dir, 1, &st), 6, "%s", st.message);
  cr_assert_eq(attn_kv_load(c, dir, 1, 1e9, NULL, NULL, &st), 6, "%s", st.message);
  for (int i = 0; i < 6; i++) {
    char id[16];
    snprintf(id, sizeof id, "m%d", i);
    qexport x, y;
    export_ok(a, id, &x);
    export_ok(c, id, &y);
    cr_expect(same_export(&x, &y), "%s: the loaded session's export differs", id);
    export_free(&x);
    export_free(&y);
    cr_expect_leq(call_error(c, id, &s[i], &sq[i], 0, 70, 1, NULL), ttol(ATTN_BF16), "%s", id);
    tkv_stream_free(&s[i]);
    tkv_stream_free(&sq[i]);
    char path[128];
    snprintf(path, sizeof path, "%s/@%s.kv", dir, id);
    unlink(path);
  }
  rmdir(dir);
  attn_kv_close(a);
  attn_kv_close(b);
  attn_kv_close(c);
  attn_engine_close(e);
}

/* Layer 0's tensor t of s as an export reads it out, at p (n tokens):
 * every row's codes, then the scales, each the quantizer's of the row
 * sent; the bytes it took. */
static size_t codes_then_scales(const tkv_stream *s, attn_kv_quant q, int t, const char *p,
                                int64_t n, const char *id) {
  const int64_t w = t ? s->dv : s->d, rows = s->hkv * n;
  const size_t es = attn_dtype_size(s->dt);
  uint8_t codes[ATTN_MAX_HEAD_DIM];
  for (int64_t r = 0; r < rows; r++) {
    const int64_t h = r / n, j = r % n;
    const char *row = (const char *)(t ? s->v : s->k) + (size_t)((h * s->n + j) * w) * es;
    float sc = attn_kv_quantize_row(q, row, s->dt, w, codes), got;
    memcpy(&got, p + rows * w + r * 4, 4);
    cr_expect(!memcmp(p + r * w, codes, (size_t)w), "%s: %c row %lld's codes", id, t ? 'v' : 'k',
              (long long)r);
    cr_expect_eq(got, sc, "%s: %c row %lld's scale %g, not %g", id, t ? 'v' : 'k', (long long)r,
                 got, sc);
  }
  return (size_t)(rows * (w + 4));
}

/* A quantized session's export read out in pieces of any size: each
 * layer's codes, then their scales, as the quantizer makes them from the
 * tokens sent. */
Test(kv_quant, export_read_in_pieces, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *a = tkv_open_store(e, 64 * MIB, false, "cpu");
  for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++)
    for (int k = 0; k < 3; k++) {
      char id[16], why[256];
      snprintf(id, sizeof id, "r%d%d", q, k);
      tkv_stream s = stream_kind(k, ATTN_BF16, (uint64_t)(150 + 3 * q + k));
      tkv_stream sq = stored_stream(&s, (attn_kv_quant)q);
      make(a, id, &s, (attn_kv_quant)q);
      call_error(a, id, &s, &sq, 0, 0, 70, NULL); /* layer 1 stays empty */
      attn_kv_exporter *x;
      attn_kv_info info;
      int64_t len[ATTN_KV_MAX_LAYERS];
      attn_status st;
      cr_assert_eq(attn_kv_export_open(a, "", id, 1, &info, len, &x, &st), 0, "%s", st.message);
      cr_expect(len[0] == 70 && len[1] == 0, "%s: lengths %lld, %lld", id, (long long)len[0],
                (long long)len[1]);
      const size_t n = (size_t)(s.hkv * 70) * ((size_t)s.d + 4 + (s.latent ? 0 : (size_t)s.dv + 4));
      char *all = tkv_export_all(x, n, why, sizeof why);
      cr_assert(all, "%s: %s", id, why);
      size_t at = codes_then_scales(&s, (attn_kv_quant)q, 0, all, 70, id);
      if (!s.latent)
        codes_then_scales(&s, (attn_kv_quant)q, 1, all + at, 70, id);
      attn_kv_export_close(x);
      free(all);
      tkv_stream_free(&s);
      tkv_stream_free(&sq);
    }
  attn_kv_close(a);
  attn_engine_close(e);
}

/* Quantized pages of 16 KiB: D 128 rows of 132 bytes (codes and scale)
 * fit 64 to a page, the scales after them; a prefill across pages and
 * decode steps, then a fork that copies the partial page, each against
 * float64 over the stored rows; an export equal to the default size's. */
Test(kv_quant, small_pages, .timeout = 300) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *kv = tkv_open_paged(e, 64 * MIB, 16 << 10);
  attn_kv_store *big = tkv_open_store(e, 64 * MIB, false, "cpu");
  for (int q = ATTN_KVQ_F8_E4M3; q <= ATTN_KVQ_I8; q++) {
    tkv_stream s = tkv_stream_make(4, 2, 128, 300, ATTN_BF16, 80 + (uint64_t)q);
    tkv_stream sq = stored_stream(&s, (attn_kv_quant)q);
    const attn_kv_shape sh = shape_of(&s, (attn_kv_quant)q, 2);
    /* 512 tokens: 8 pages per (layer, head, K/V) */
    cr_expect_eq(attn_kv_reserve_bytes(kv, &sh), 2 * 2 * 2 * 8 * (uint64_t)(16 << 10));
    make(kv, "s", &s, (attn_kv_quant)q);
    make(big, "s", &s, (attn_kv_quant)q);
    cr_expect_leq(call_error(kv, "s", &s, &sq, 1, 0, 150, NULL), ttol(s.dt), "prefill");
    for (int64_t pos = 150; pos < 160; pos++)
      cr_expect_leq(call_error(kv, "s", &s, &sq, 1, pos, 1, NULL), ttol(s.dt), "at %lld",
                    (long long)pos);
    (void)call_error(big, "s", &s, &sq, 1, 0, 161, NULL); /* the fork's 161 tokens */
    attn_status st;
    cr_assert_eq(attn_kv_fork(kv, "", "s", "f", -1, 0, 0, &st), 0, "%s", st.message);
    cr_expect_leq(call_error(kv, "f", &s, &sq, 1, 160, 1, NULL), ttol(s.dt), "the fork");
    cr_expect_leq(call_error(kv, "s", &s, &sq, 1, 160, 2, NULL), ttol(s.dt), "the source");
    qexport x, y;
    export_ok(kv, "f", &x);
    export_ok(big, "s", &y);
    cr_expect(same_export(&x, &y), "the export differs from the 64 KiB pages' one");
    export_free(&x);
    export_free(&y);
    cr_assert_eq(attn_kv_delete(kv, "", "s", 0, &st), 0);
    cr_assert_eq(attn_kv_delete(kv, "", "f", 0, &st), 0);
    cr_assert_eq(attn_kv_delete(big, "", "s", 0, &st), 0);
    tkv_stream_free(&s);
    tkv_stream_free(&sq);
  }
  attn_kv_close(kv);
  attn_kv_close(big);
  attn_engine_close(e);
}
