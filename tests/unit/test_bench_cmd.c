/*
 * test_bench_cmd.c — `attn bench`: a row for a custom shape, its
 * --backend choice (bad names refused; cuda without a device says why) and
 * its --cpu-tune choice (the kernel column says which ran).
 */
#include "helpers.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static int bench(const char *args, char *out, size_t cap) { return tattn("bench", args, out, cap); }

Test(bench_cmd, custom_shape_prints_one_row) {
  char out[4096];
  int rc = bench("--heads 2 --seq 128 --head-dim 32 --repeat 1 --threads 1", out, sizeof out);
  cr_assert_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "GFLOP/s"), "%s", out);
  cr_expect(strstr(out, "    1    2    128    128   32   F32 no      fwd       1"), "%s", out);
}

Test(bench_cmd, backward_row) {
  char out[4096];
  int rc = bench("--backward --heads 2 --heads-kv 1 --seq 100 --head-dim 32 --repeat 1 --threads 1",
                 out, sizeof out);
  cr_assert_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "    1    2    100    100   32   F32 no      bwd       1"), "%s", out);
}

Test(bench_cmd, backend_choice) {
  char out[4096];
  cr_expect_eq(bench("--backend tpu", out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "--backend expects cpu or cuda"), "%s", out);
  int rc = bench("--backend cuda --heads 1 --seq 64 --repeat 1", out, sizeof out);
  if (tcuda_available()) {
    cr_expect_eq(rc, 0, "%s", out);
  } else {
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "backend \"cuda\" is not available"), "%s", out);
  }
}

/* --cpu-tune: intel shows in the kernel column of the AVX-512 kernels, the
 * only ones with its wide form, and never under amd; a bad name is refused. */
Test(bench_cmd, cpu_tune_choice) {
  char out[4096];
  cr_expect_eq(bench("--cpu-tune zen", out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "--cpu-tune expects auto, intel or amd"), "%s", out);
  const char *shape = "--heads 2 --seq 128 --head-dim 32 --repeat 1 --threads 1 --cpu-tune ";
  char args[160];
  snprintf(args, sizeof args, "%samd", shape);
  cr_assert_eq(bench(args, out, sizeof out), 0, "%s", out);
  cr_expect(!strstr(out, "intel tuning"), "%s", out);
  snprintf(args, sizeof args, "%sintel", shape);
  cr_assert_eq(bench(args, out, sizeof out), 0, "%s", out);
  const bool wide = strstr(out, "avx512") || strstr(out, "amx kernel");
  cr_expect_eq(strstr(out, "intel tuning") != NULL, wide, "%s", out);
}
