/*
 * test_bench_cmd.c — `attn bench`: a row for a custom shape, and its
 * --backend choice (bad names refused; cuda without a device says why).
 */
#include "helpers.h"

#include <criterion/criterion.h>
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
