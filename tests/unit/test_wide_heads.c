/*
 * test_wide_heads.c — head dims past 256, up to the contract's limits: q and
 * k of D up to 576, v of Dv up to 512 (DeepSeek's absorbed MLA decode: D
 * 576, Dv 512).
 *
 * Every CPU kernel this machine runs, forward (O and the statistics m, l,
 * lse) and backward (dq, dk, dv, and dsinks where the case has sinks),
 * against the float64 reference: causal prefill, a decode row whose keys
 * are split across threads, GQA, D 512 with v as wide, D 320, D 300 and odd
 * widths, D 384, sinks and a window at D 576. Then the refusals past the
 * limits. (Paged K and V at D 512: test_paged.c.)
 */
#include "dvcase.h"

#include <criterion/criterion.h>
#include <string.h>

static const dvspec specs[] = {
    {1, 2, 2, 130, 150, 576, 512, true, -1, -1, false}, /* causal prefill */
    {1, 8, 1, 1, 1100, 576, 512, false, -1, -1, false}, /* decode: GQA, the keys split */
    {2, 4, 2, 70, 90, 576, 512, true, -1, -1, false},   /* GQA prefill */
    {1, 2, 2, 80, 100, 512, 0, true, -1, -1, false},    /* v as wide as q */
    {1, 2, 1, 65, 70, 320, 0, false, -1, -1, false},    /* D 320 */
    {1, 3, 1, 33, 47, 300, 300, true, -1, -1, false},   /* D 300, odd sizes */
    {1, 2, 1, 29, 41, 301, 263, false, -1, -1, false},  /* odd widths */
    {1, 2, 2, 90, 120, 576, 512, false, 40, 3, true},   /* sinks and a window */
    {1, 4, 2, 70, 80, 384, 384, true, -1, -1, false},   /* D 384 */
    {1, 4, 1, 2, 1200, 576, 512, false, 700, -1, true}, /* decode split, sinks, window */
};
enum { NSPECS = sizeof specs / sizeof *specs };

static void run_on(int isa, bool backward) { dvcase_run_isa(isa, backward, specs, NSPECS, 60); }

DVCASE_ISA_TESTS(wide_heads, run_on)

/* Past the limits: each refusal names the limit and what was asked. */
Test(wide_heads, refusals) {
  static const struct {
    int64_t d, dv;
    const char *words[3];
  } bad[] = {
      {577, 512, {"head_dim", "576", "577"}},
      {576, 513, {"head_dim_v", "512", "513"}},
      {520, 0, {"head_dim_v", "512", "520"}}, /* v as wide as q: Dv 520 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const dvspec s = {1, 1, 1, 2, 2, 4, 0, false, -1, -1, false};
    dvcase c;
    dvcase_init(&c, &s, ATTN_F32, 3);
    c.r.head_dim = bad[i].d, c.r.head_dim_v = bad[i].dv;
    attn_status st = {0};
    cr_expect_eq(attn_request_validate(&c.r, &st), ATTN_ESHAPE, "D %lld Dv %lld",
                 (long long)bad[i].d, (long long)bad[i].dv);
    for (int w = 0; w < 3; w++)
      cr_expect(strstr(st.message, bad[i].words[w]), "no \"%s\" in %s", bad[i].words[w],
                st.message);
    dvcase_free(&c);
  }
}
