/*
 * test_cpu_selfcheck.c — the cpu backend's start-up self-check of the amx kernel
 * (engine/cpu/selfcheck.c): on a CPU with AMX it passes and the amx kernel runs (asked for
 * or chosen by auto); forced to fail (ATTN_TEST_CPU_SELF_CHECK=fail) the avx512bf16 kernel
 * runs instead, one line on stderr says why, and the backend lists amx as disabled with that
 * reason (what /v1/info and /readyz print). The failing side also runs on the emulated amx
 * kernel (cpu_isa "amxemu"), so it is tested on any CPU with AVX512-BF16; other kernels are
 * never checked. A CPU without the kernel a test needs reports "skipped".
 */
#include "amx_emu.h"
#include "helpers.h"

#include "cpu/flash.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cpu backend's entry of e. */
static attn_backend_info cpu_info(attn_engine *e) {
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  for (int i = 0; i < n && i < 8; i++)
    if (!strcmp(info[i].name, "cpu"))
      return info[i];
  cr_assert_fail("no cpu backend listed");
  return info[0];
}

/* A BF16 problem the tile path takes runs right on e; returns the emulated
 * TDPBF16PS it executed. */
static int64_t run_bf16(attn_engine *e) {
  tprob p = tprob_make(1, 4, 2, 130, 200, 128, ATTN_BF16);
  p.causal = true;
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 11);
  attn_status st = {0};
  const int64_t before = tamx_dpbf16ps_count();
  cr_assert_eq(trun(e, &c, "cpu", &st), 0, "%s", st.message);
  const int64_t dp = tamx_dpbf16ps_count() - before;
  terr err = tcheck(&c);
  cr_expect(err.o <= ttol(ATTN_BF16) && err.stats <= 1e-5 && err.masked_ok,
            "O error %.3g, stats %.3g", err.o, err.stats);
  tcase_free(&c);
  return dp;
}

/* The real unit: the check passes and the amx kernel stays. */
Test(cpu_selfcheck, amx_passes_on_this_cpu) {
  attn_engine *e = topen_isa("amx", 2);
  if (!e)
    return;
  attn_backend_info cpu = cpu_info(e);
  cr_expect(!strncmp(cpu.detail, "amx kernel", 10), "cpu backend: %s", cpu.detail);
  cr_expect_eq(cpu.ndisabled, 0, "disabled: %s (%s)", cpu.disabled[0].kernel, cpu.disabled[0].why);
  run_bf16(e);
  attn_engine_close(e);
}

/* What a failed check leaves: avx512bf16 runs, amx is listed with why, and
 * stderr (redirected by the caller, closed here) has the one line. */
static void expect_fallback(attn_engine *e) {
  attn_backend_info cpu = cpu_info(e);
  cr_assert(cpu.available, "%s", cpu.detail);
  cr_expect(!strncmp(cpu.detail, "avx512bf16 kernel", 17), "cpu backend: %s", cpu.detail);
  cr_assert_eq(cpu.ndisabled, 1);
  cr_expect_str_eq(cpu.disabled[0].kernel, "amx");
  cr_expect(strstr(cpu.disabled[0].why, "o error") && strstr(cpu.disabled[0].why, "forced"),
            "why: %s", cpu.disabled[0].why);
  fclose(stderr); /* the pipe's end: the read below then ends */
  char log[2048] = "";
  size_t n = fread(log, 1, sizeof log - 1, cr_get_redirected_stderr());
  log[n] = 0;
  cr_expect(strstr(log, "attn: cpu: the self-check disabled the amx kernel: o error"), "stderr: %s",
            log);
  cr_expect_eq(run_bf16(e), 0, "the emulated tiles ran after the fallback");
}

static attn_engine *open_forced(const char *isa) {
  setenv("ATTN_TEST_CPU_SELF_CHECK", "fail", 1);
  return topen_isa(isa, 2);
}

Test(cpu_selfcheck, forced_failure_on_amx_falls_back, .init = cr_redirect_stderr) {
  attn_engine *e = open_forced("amx");
  if (!e)
    return;
  expect_fallback(e);
  attn_engine_close(e);
}

/* auto picks amx where the CPU has it, and checks it the same way. */
Test(cpu_selfcheck, forced_failure_under_auto, .init = cr_redirect_stderr) {
  attn_status st;
  if (!attn__flash_select("amx", &st)) {
    printf("skipped: %s\n", st.message);
    return;
  }
  attn_engine *e = open_forced("auto");
  expect_fallback(e);
  attn_engine_close(e);
}

Test(cpu_selfcheck, forced_failure_on_emulated_amx, .init = cr_redirect_stderr) {
  attn_engine *e = open_forced("amxemu");
  if (!e)
    return;
  expect_fallback(e);
  attn_engine_close(e);
}

/* Only the amx kernel is checked: the switch leaves the others alone. */
Test(cpu_selfcheck, other_kernels_are_not_checked) {
  static const char *const isas[] = {"generic", "avx2", "avx512", "avx512bf16"};
  setenv("ATTN_TEST_CPU_SELF_CHECK", "fail", 1);
  for (int i = 0; i < 4; i++) {
    attn_engine *e = topen_isa(isas[i], 2);
    if (!e)
      continue;
    attn_backend_info cpu = cpu_info(e);
    cr_expect(!strncmp(cpu.detail, isas[i], strlen(isas[i])), "%s: %s", isas[i], cpu.detail);
    cr_expect_eq(cpu.ndisabled, 0, "%s: disabled %s", isas[i], cpu.disabled[0].kernel);
    attn_engine_close(e);
  }
}
