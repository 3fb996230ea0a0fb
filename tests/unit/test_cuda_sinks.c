/*
 * test_cuda_sinks.c — the CUDA sink fold's row arithmetic
 * (engine/cuda/sinks.h's attn_cu_sink_row, which the kernel runs as it is
 * compiled here), on the CPU.
 *
 * The kernels' stand-in is the float64 reference of a problem without its
 * sinks, rounded to F32 (O, m, l, lse of the real keys, as a forward
 * launch leaves them); every row is folded with attn_cu_sink_row in F32
 * and must give the float64 reference of the problem with its sinks: O, m,
 * l and lse. Rows of random scores, rows that see no key, sinks above
 * every score and sinks of −1e30 (as if there were none).
 */
#include "cuda/sinks.h"
#include "engine.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

/* The reference of c's request with or without its sinks. */
static void reference(const tcase *c, bool sinks, tref *ref) {
  tcase x = *c;
  x.req.sinks = sinks ? c->sinks : NULL;
  attn_status st;
  cr_assert_eq(tref_compute(&x, 1, ref, &st), 0, "%s", st.message);
}

static double rel(double x, double y) {
  if (x == y) /* equal infinities too */
    return 0;
  return fabs(x - y) / fmax(1, fabs(y));
}

/* The largest error over c's rows of the fold against the reference with
 * sinks: O relative to the row's largest |O| (at least 1e-30), the
 * statistics relative to max(1, |ref|), l relative. */
static double fold_error(const tcase *c) {
  tref plain, want;
  reference(c, false, &plain);
  reference(c, true, &want);
  const tprob *p = &c->p;
  double worst = 0;
  for (int64_t row = 0; row < p->b * p->hq * p->nq; row++) {
    const float t = c->sinks[row / p->nq % p->hq];
    const attn_cu_sink_stats s =
        attn_cu_sink_row(t, (float)plain.m[row], (float)plain.l[row], (float)plain.lse[row]);
    double omax = 1e-30;
    for (int64_t d = 0; d < p->d; d++)
      omax = fmax(omax, fabs(want.o[row * p->d + d]));
    for (int64_t d = 0; d < p->d; d++) {
      const double o = (double)(float)plain.o[row * p->d + d] * s.o_scale;
      worst = fmax(worst, fabs(o - want.o[row * p->d + d]) / omax);
    }
    worst = fmax(worst, fmax(rel(s.m, want.m[row]), rel(s.lse, want.lse[row])));
    worst = fmax(worst, fabs(s.l / want.l[row] - 1));
    if (plain.l[row] == 0) /* no key: O = 0, m = lse = the sink, l = 1 */
      worst = fmax(worst, s.o_scale != 0 || s.m != t || s.lse != t || s.l != 1 ? INFINITY : 0);
  }
  tref_free(&plain);
  tref_free(&want);
  return isnan(worst) ? INFINITY : worst;
}

/* Random scores, GQA; causal with Nq > Nkv so the first rows see no key. */
Test(cuda_sinks_row, random_rows_and_rows_without_keys) {
  const int64_t shapes[3][6] = {{2, 4, 2, 17, 40, 16}, {1, 6, 2, 30, 20, 8}, {3, 2, 1, 5, 300, 64}};
  for (int k = 0; k < 3; k++)
    for (int causal = 0; causal < 2; causal++) {
      tprob p = tprob_make(shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], shapes[k][4],
                           shapes[k][5], ATTN_F32);
      p.causal = causal, p.stats = true, p.sinks = true;
      tcase c;
      tcase_init(&c, &p, 10 + (uint64_t)(2 * k + causal));
      const double e = fold_error(&c);
      cr_expect(e <= 2e-6, "shape %d causal %d: error %.3g", k, causal, e);
      tcase_free(&c);
    }
}

/* Sinks of every size: far above every score (O nearly 0, lse the sink),
 * about the scores, far below them (−1e30: the fold changes nothing but a
 * row with no key, whose statistics become the sink's). */
Test(cuda_sinks_row, sinks_above_and_far_below_every_score) {
  const float ts[5] = {60.0f, 8.0f, 0.0f, -30.0f, -1e30f};
  for (int k = 0; k < 5; k++) {
    tprob p = tprob_make(2, 3, 1, 12, 9, 32, ATTN_F32);
    p.causal = true, p.stats = true, p.sinks = true; /* rows 0-2 see no key */
    tcase c;
    tcase_init(&c, &p, 40 + (uint64_t)k);
    for (int h = 0; h < 3; h++)
      c.sinks[h] = ts[k] + (ts[k] > -1e29f ? (float)h : 0.0f);
    const double e = fold_error(&c);
    cr_expect(e <= 2e-6, "sinks about %g: error %.3g", (double)ts[k], e);
    tcase_free(&c);
  }
}

/* The placeholders a launch without m and l passes (−inf, 0) leave lse and
 * the O factor as they are with the real m and l. */
Test(cuda_sinks_row, lse_alone_needs_no_m_nor_l) {
  const float lses[4] = {-INFINITY, -3.0f, 0.5f, 70.0f};
  for (int i = 0; i < 4; i++) {
    const attn_cu_sink_stats a = attn_cu_sink_row(1.5f, -INFINITY, 0.0f, lses[i]);
    const attn_cu_sink_stats b = attn_cu_sink_row(1.5f, lses[i] - 0.25f, expf(0.25f), lses[i]);
    cr_expect(a.lse == b.lse && a.o_scale == b.o_scale, "lse %g", (double)lses[i]);
  }
}
