/*
 * test_conformance.c — the CPU flash engine against float64 standard
 * attention on awkward sizes, every mask, GQA/MQA, cross attention, all
 * dtypes and both layouts; once per CPU kernel this machine can run (an
 * unsupported kernel reports itself skipped, never passed).
 */
#include "cases.h"
#include "helpers.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* amxemu: the amx kernel on the unit tests' emulation of its tiles
 * (tests/lib/amx_emu.h), so its logic is checked on CPUs without AMX too. */
static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx", "amxemu"};
enum { NISAS = sizeof isas / sizeof *isas };

/* Runs every problem on the cpu backend and checks it; returns failures. */
static int check_all(attn_engine *e, const tprob *ps, int n, uint64_t seed) {
  int fails = 0;
  for (int i = 0; i < n; i++) {
    tcase c;
    char desc[200];
    tcase_init(&c, &ps[i], seed + (uint64_t)i);
    attn_status st = {0};
    int rc = trun(e, &c, "cpu", &st);
    cr_expect_eq(rc, 0, "%s: engine failed: %s", tdesc(&ps[i], desc, sizeof desc), st.message);
    if (rc == 0) {
      terr err = tcheck(&c);
      bool ok = err.o <= ttol(ps[i].dt) && err.masked_ok && (!ps[i].stats || err.stats <= 1e-5);
      cr_expect(ok, "%s: O error %.3g (tol %.0e), stats error %.3g, masked rows %s",
                tdesc(&ps[i], desc, sizeof desc), err.o, ttol(ps[i].dt), err.stats,
                err.masked_ok ? "ok" : "WRONG");
      fails += !ok;
    } else {
      fails++;
    }
    tcase_free(&c);
  }
  return fails;
}

static void run_group(int isa, int (*gen)(tprob *), uint64_t seed) {
  attn_engine *e = topen_isa(isas[isa], 2); /* never NULL for generic: it runs everywhere */
  if (!e)
    cr_skip_test("skipped: this CPU has no %s", isas[isa]);
  tprob ps[TCASES_MAX];
  int n = gen(ps);
  int fails = check_all(e, ps, n, seed);
  attn_engine_close(e);
  cr_assert_eq(fails, 0, "%d of %d problems out of tolerance on %s", fails, n, isas[isa]);
}

#define GROUP_TESTS(isa_idx, isa_name)                                                             \
  Test(conformance_##isa_name, sizes, .timeout = 300) { run_group(isa_idx, tcases_sizes, 100); }   \
  Test(conformance_##isa_name, masks, .timeout = 300) { run_group(isa_idx, tcases_masks, 200); }   \
  Test(conformance_##isa_name, shapes, .timeout = 300) { run_group(isa_idx, tcases_shapes, 300); } \
  Test(conformance_##isa_name, decode, .timeout = 300) { run_group(isa_idx, tcases_decode, 400); } \
  Test(conformance_##isa_name, variants, .timeout = 300) {                                         \
    run_group(isa_idx, tcases_variants, 500);                                                      \
  }                                                                                                \
  Test(conformance_##isa_name, diag, .timeout = 300) { run_group(isa_idx, tcases_diag, 450); }

GROUP_TESTS(0, generic)
GROUP_TESTS(1, avx2)
GROUP_TESTS(2, avx512)
GROUP_TESTS(3, avx512bf16)
GROUP_TESTS(4, amx)
GROUP_TESTS(5, amxemu)

/* Rows with no visible key (causal with Nq > Nkv, a zero-width window that
 * falls off the keys) give O = 0, m = lse = -inf, l = 0 and never NaN. */
Test(conformance, fully_masked_rows) {
  attn_engine *e = topen(2, NULL);
  tprob p[TCASES_MAX];
  int n = tcases_masked_rows(p);
  cr_assert_eq(check_all(e, p, n, 7), 0);
  /* and look at one masked row directly */
  tcase c;
  tcase_init(&c, &p[0], 1);
  attn_status st;
  cr_assert_eq(trun(e, &c, "cpu", &st), 0);
  for (int d = 0; d < 64; d++)
    cr_assert_eq(((float *)c.o)[5 * 64 + d], 0.0f);
  cr_assert(isinf(c.m[5]) && c.m[5] < 0);
  cr_assert(isinf(c.lse[5]) && c.lse[5] < 0);
  cr_assert_eq(c.l[5], 0.0f);
  cr_assert(isfinite(c.m[99]) && c.l[99] > 0);
  tcase_free(&c);
  attn_engine_close(e);
}

/* The same problem on 1 and on 2 threads: the same bits, for every kernel
 * and dtype, and for a decode shape whose keys are split across threads. */
static void same_bits(int isa, tprob p) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cpu_isa = isas[isa];
  attn_engine *e1, *e2;
  attn_status st;
  cfg.threads = 1;
  cr_assert_eq(attn_engine_open(&cfg, &e1, &st), 0);
  cfg.threads = 2;
  cr_assert_eq(attn_engine_open(&cfg, &e2, &st), 0);
  tcase a, b;
  tcase_init(&a, &p, 11);
  tcase_init(&b, &p, 11);
  int r1 = trun(e1, &a, "cpu", &st), r2 = trun(e2, &b, "cpu", &st);
  if (r1 == 0 && r2 == 0) {
    size_t rows = (size_t)(p.b * p.hq * p.nq) * 4;
    size_t n = rows / 4 * (size_t)p.d * attn_dtype_size(p.dt);
    cr_expect_eq(memcmp(a.o, b.o, n), 0, "%s: O differs between 1 and 2 threads", isas[isa]);
    cr_expect_eq(memcmp(a.m, b.m, rows), 0);
    cr_expect_eq(memcmp(a.l, b.l, rows), 0);
    cr_expect_eq(memcmp(a.lse, b.lse, rows), 0);
  } else {
    cr_expect_eq(r1, r2, "%s: different verdicts on 1 and 2 threads", isas[isa]);
    if (r1 == r2)
      printf("skipped: this CPU has no %s (%s)\n", isas[isa], st.message);
  }
  tcase_free(&a);
  tcase_free(&b);
  attn_engine_close(e1);
  attn_engine_close(e2);
}

Test(conformance, bit_identical_across_threads, .timeout = 300) {
  for (int isa = 0; isa < NISAS; isa++)
    for (int dt = 0; dt < 3; dt++) {
      tprob p = tprob_make(2, 4, 2, 300, 333, 64, (attn_dtype)dt);
      p.causal = true;
      p.stats = true;
      same_bits(isa, p);
      p = tprob_make(1, 8, 2, 2, 5000, 128, (attn_dtype)dt); /* key split */
      p.wl = 3000;
      p.stats = true;
      same_bits(isa, p);
    }
}

/* An engine on kernel isa with tuning tune on 2 threads, or NULL when the
 * CPU lacks the kernel. */
static attn_engine *open_tuned(const char *isa, const char *tune) {
  attn_config cfg;
  attn_config_init(&cfg);
  cfg.cpu_isa = isa;
  cfg.cpu_tune = tune;
  cfg.threads = 2;
  attn_engine *e;
  attn_status st;
  cr_assert_eq(attn_engine_open(&cfg, &e, &st), 0, "%s", st.message);
  tprob p = tprob_make(1, 1, 1, 1, 1, 8, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  int rc = trun(e, &c, "cpu", &st);
  tcase_free(&c);
  if (rc == 0)
    return e;
  attn_engine_close(e);
  return NULL;
}

/* p under the amd and the intel tuning: the same bits. */
static void same_bits_tuned(const char *isa, tprob p) {
  attn_engine *ea = open_tuned(isa, "amd"), *ei = open_tuned(isa, "intel");
  if (!ea || !ei) {
    printf("skipped: this CPU has no %s\n", isa);
    if (ea)
      attn_engine_close(ea);
    if (ei)
      attn_engine_close(ei);
    return;
  }
  tcase a, b;
  tcase_init(&a, &p, 12);
  tcase_init(&b, &p, 12);
  attn_status st;
  cr_assert_eq(trun(ea, &a, "cpu", &st), 0, "%s", st.message);
  cr_assert_eq(trun(ei, &b, "cpu", &st), 0, "%s", st.message);
  const size_t rows = (size_t)(p.b * p.hq * p.nq);
  const size_t n = rows * (size_t)p.d * attn_dtype_size(p.dt);
  char desc[200];
  tdesc(&p, desc, sizeof desc);
  cr_expect_eq(memcmp(a.o, b.o, n), 0, "%s %s: O differs between the tunings", isa, desc);
  cr_expect_eq(memcmp(a.lse, b.lse, rows * sizeof *a.lse), 0, "%s %s: lse differs", isa, desc);
  terr err = tcheck(&b);
  cr_expect(err.o <= ttol(p.dt) && err.stats <= 1e-5, "%s %s: O error %.3g, stats %.3g", isa, desc,
            err.o, err.stats);
  tcase_free(&a);
  tcase_free(&b);
  attn_engine_close(ea);
  attn_engine_close(ei);
}

/*
 * The tunings (attn_config.cpu_tune) change how the AVX-512 kernels' F32
 * products run, never what they compute: 6-row register blocks against 4
 * (head dims and tiles that leave partial blocks), V prefetched, and items
 * of two query blocks (enough heads and blocks per thread for them; an odd
 * block count leaves a single one; windows give the pair different key
 * ranges), under masks, GQA, variants and all three dtypes; on amx (and
 * amxemu) BF16's two blocks run on the tiles in lockstep, each with P
 * slots of its own (causal, GQA over more keys, head_dim 128 to 256).
 */
Test(conformance, tunings_same_bits, .timeout = 300) {
  for (int isa = 2; isa < NISAS; isa++) {
    tprob p = tprob_make(1, 8, 8, 1100, 1100, 72, ATTN_F32);
    p.causal = true;
    p.stats = true;
    same_bits_tuned(isas[isa], p);
    p = tprob_make(2, 8, 2, 700, 900, 128, ATTN_F16);
    p.wl = 300;
    p.wr = 0;
    p.stats = true;
    same_bits_tuned(isas[isa], p);
    p = tprob_make(1, 4, 4, 520, 520, 40, ATTN_F32);
    p.softcap = 30;
    p.alibi = 1;
    p.stats = true;
    same_bits_tuned(isas[isa], p);
    static const struct {
      int64_t b, hq, hkv, nq, nkv, d;
      bool causal;
      double softcap;
    } bf[] = {{1, 8, 8, 600, 600, 64, false, 0},
              {1, 8, 8, 1100, 1100, 192, true, 0},
              {2, 8, 2, 700, 900, 128, true, 20},
              {1, 4, 4, 530, 530, 256, false, 0}};
    for (size_t i = 0; i < sizeof bf / sizeof *bf; i++) {
      p = tprob_make(bf[i].b, bf[i].hq, bf[i].hkv, bf[i].nq, bf[i].nkv, bf[i].d, ATTN_BF16);
      p.causal = bf[i].causal;
      p.softcap = bf[i].softcap;
      p.stats = true;
      same_bits_tuned(isas[isa], p);
    }
  }
}

/* The reference backend, as users select it, agrees with the float64 one it
 * wraps (rounded to F32). */
Test(conformance, reference_backend) {
  attn_engine *e = topen(2, NULL);
  tprob p = tprob_make(2, 2, 1, 50, 70, 24, ATTN_F32);
  p.causal = true;
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 5);
  attn_status st;
  cr_assert_eq(trun(e, &c, "reference", &st), 0, "%s", st.message);
  terr err = tcheck(&c);
  cr_expect_lt(err.o, 1e-7);
  cr_expect_lt(err.stats, 1e-7);
  cr_expect(err.masked_ok);
  tcase_free(&c);
  attn_engine_close(e);
}
