/*
 * test_bench_cmd.c — `attn bench`: a row for a custom shape, and its
 * --backend choice (bad names refused; cuda without a device says why).
 */
#include "engine.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int bench(const char *args, char *out, size_t cap) {
  const char *bin = getenv("ATTN_BIN") ? getenv("ATTN_BIN") : "build/attn";
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s bench %s 2>&1", bin, args);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = 0;
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static bool cuda_works(void) {
  attn_engine *e;
  attn_status st;
  if (attn_engine_open(NULL, &e, &st) < 0)
    return false;
  attn_backend_info info[8];
  int n = attn_engine_backends(e, info, 8);
  bool up = false;
  for (int i = 0; i < n && i < 8; i++)
    up |= !strcmp(info[i].name, "cuda") && info[i].available;
  attn_engine_close(e);
  return up;
}

Test(bench_cmd, custom_shape_prints_one_row) {
  char out[4096];
  int rc = bench("--heads 2 --seq 128 --head-dim 32 --repeat 1 --threads 1", out, sizeof out);
  cr_assert_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "GFLOP/s"), "%s", out);
  cr_expect(strstr(out, "    1    2    128    128   32   F32 no           1"), "%s", out);
}

Test(bench_cmd, backend_choice) {
  char out[4096];
  cr_expect_eq(bench("--backend tpu", out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "--backend expects cpu or cuda"), "%s", out);
  int rc = bench("--backend cuda --heads 1 --seq 64 --repeat 1", out, sizeof out);
  if (cuda_works()) {
    cr_expect_eq(rc, 0, "%s", out);
  } else {
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "backend \"cuda\" is not available"), "%s", out);
  }
}
