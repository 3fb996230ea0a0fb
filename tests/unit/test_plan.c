/*
 * test_plan.c — the memory plan of seed exercise 1, through the library and
 * through `attn plan`, table and JSON.
 */
#include "engine.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

Test(plan, seed_exercise_one) {
  attn_plan_params p = {.batch = 1,
                        .heads_q = 1,
                        .seq_q = 4096,
                        .seq_kv = 4096,
                        .head_dim = 64,
                        .dtype = ATTN_F32,
                        .threads = 2};
  attn_plan pl;
  attn_status st;
  cr_assert_eq(attn_plan_compute(&p, &pl, &st), 0, "%s", st.message);
  cr_expect_eq(pl.q, 1048576); /* N·d·4 = 1 MiB */
  cr_expect_eq(pl.k, 1048576);
  cr_expect_eq(pl.o, 1048576);
  cr_expect_eq(pl.s, 67108864); /* N·N·4 = 64 MiB */
  cr_expect_eq(pl.p, 67108864);
  cr_expect_eq(pl.s_plus_p, 134217728); /* 128 MiB */
  cr_expect_eq(pl.s_over_q, 64.0);      /* 1:64 */
  cr_expect_eq(pl.m, 4096 * 4);
  cr_expect_eq(pl.l, 4096 * 4);
  cr_expect_eq(pl.threads, 2);
  cr_expect_eq(pl.workspace, 2 * pl.workspace_per_thread);
  cr_expect_eq(pl.standard_total, 4 * 1048576 + 134217728);
  cr_expect_eq(pl.flash_total, 4 * 1048576 + 2 * 16384 + pl.workspace);
  cr_expect_gt(pl.standard_over_flash, 20);
}

Test(plan, gqa_cross_attention_bf16) {
  attn_plan_params p = {.batch = 2,
                        .heads_q = 8,
                        .heads_kv = 2,
                        .seq_q = 100,
                        .seq_kv = 300,
                        .head_dim = 128,
                        .dtype = ATTN_BF16,
                        .threads = 1};
  attn_plan pl;
  attn_status st;
  cr_assert_eq(attn_plan_compute(&p, &pl, &st), 0, "%s", st.message);
  cr_expect_eq(pl.q, 2ull * 8 * 100 * 128 * 2);
  cr_expect_eq(pl.k, 2ull * 2 * 300 * 128 * 2);
  cr_expect_eq(pl.s, 2ull * 8 * 100 * 300 * 2);
  cr_expect_eq(pl.m, 2ull * 8 * 100 * 4);
  cr_expect_eq(pl.s_over_q, 300.0 / 128.0);
}

/* Seed exercise 5's analysis: standard backward holds four N×N matrices
 * (S, P, dP, dS); flash backward holds two F32 numbers per query row (lse
 * and D) and F32 dQ accumulators instead. Numbers worked out by hand. */
Test(plan, backward_holds_four_matrices_or_two_rows) {
  attn_plan_params p = {.batch = 1,
                        .heads_q = 2,
                        .heads_kv = 1,
                        .seq_q = 1024,
                        .seq_kv = 2048,
                        .head_dim = 64,
                        .dtype = ATTN_F16,
                        .threads = 3,
                        .pass = ATTN_BACKWARD};
  attn_plan pl;
  attn_status st;
  cr_assert_eq(attn_plan_compute(&p, &pl, &st), 0, "%s", st.message);
  const uint64_t q = 2 * 1024 * 64 * 2, k = 1 * 2048 * 64 * 2, nn = 2ull * 1024 * 2048 * 2;
  cr_expect_eq(pl.pass, ATTN_BACKWARD);
  cr_expect_eq(pl.dout, q);
  cr_expect_eq(pl.dq, q);
  cr_expect_eq(pl.dk, k);
  cr_expect_eq(pl.dv, k);
  cr_expect_eq(pl.dp, nn);
  cr_expect_eq(pl.ds, nn);
  cr_expect_eq(pl.lse, 2 * 1024 * 4);
  cr_expect_eq(pl.delta, 2 * 1024 * 4);
  /* The CPU backend's dQ partials: 2048 keys are 32 blocks of 64, cut in
   * 4 chunks (its most) for a single KV head; one F32 dQ per chunk. */
  cr_expect_eq(pl.dq_accum, 4ull * 2 * 1024 * 64 * 4);
  const uint64_t io = 4 * q + 4 * k; /* q, o, do, dq and k, v, dk, dv */
  cr_expect_eq(pl.standard_total, io + 4 * nn);
  cr_expect_eq(pl.flash_total, io + 2 * 2 * 1024 * 4 + pl.dq_accum + 3 * pl.workspace_per_thread);
  p.pass = ATTN_FORWARD;
  cr_assert_eq(attn_plan_compute(&p, &pl, &st), 0, "%s", st.message);
  cr_expect_eq(pl.dq, 0, "a forward plan has no gradients");
  cr_expect_eq(pl.standard_total, 2 * q + 2 * k + 2 * nn);
  p.pass = (attn_pass)7;
  cr_expect_eq(attn_plan_compute(&p, &pl, &st), ATTN_EINVAL);
}

Test(plan, bad_shapes_are_refused) {
  attn_plan pl;
  attn_status st;
  attn_plan_params p = {
      .batch = 1, .heads_q = 6, .heads_kv = 4, .seq_q = 1, .seq_kv = 1, .head_dim = 64};
  cr_expect_eq(attn_plan_compute(&p, &pl, &st), ATTN_EHEADS);
  p.heads_kv = 0;
  p.seq_q = p.seq_kv = (int64_t)1 << 40;
  p.batch = 1 << 20;
  cr_expect_eq(attn_plan_compute(&p, &pl, &st), ATTN_EOVERFLOW);
  p.batch = 1;
  p.head_dim = ATTN_MAX_HEAD_DIM + 1;
  cr_expect_eq(attn_plan_compute(&p, &pl, &st), ATTN_ESHAPE);
}

/* Runs build/attn with args; returns its exit status and output (stdout and
 * stderr together). */
static int attn_cli(const char *args, char *out, size_t cap) {
  const char *bin = getenv("ATTN_BIN") ? getenv("ATTN_BIN") : "build/attn";
  char cmd[512];
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
  FILE *f = popen(cmd, "r");
  cr_assert(f, "cannot run %s", cmd);
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = 0;
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(plan, cli_table) {
  char out[8192];
  cr_assert_eq(
      attn_cli("plan --batch 1 --heads 1 --seq 4096 --head-dim 64 --dtype F32", out, sizeof out), 0,
      "%s", out);
  const char *want[] = {"1048576",   "1.00 MiB",   "67108864", "64.00 MiB",
                        "134217728", "128.00 MiB", "1:64"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(strstr(out, want[i]), "attn plan output lacks \"%s\":\n%s", want[i], out);
}

Test(plan, cli_json_and_cross) {
  char out[8192];
  cr_assert_eq(attn_cli("plan --json --seq-q 128 --seq-kv 4096 --head-dim 64", out, sizeof out), 0,
               "%s", out);
  cr_expect(strstr(out, "\"q\": 32768,"), "%s", out);
  cr_expect(strstr(out, "\"s\": 2097152,"), "%s", out);
  cr_expect(strstr(out, "\"s_over_q\": 64,"), "%s", out);
}

Test(plan, cli_backward) {
  char out[8192];
  cr_assert_eq(attn_cli("plan --backward --seq 4096 --head-dim 64", out, sizeof out), 0, "%s", out);
  const char *want[] = {"backward memory plan", "dP = dO*V^T", "67108864", "D = rowsum(dO*O)",
                        "16384"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(strstr(out, want[i]), "attn plan --backward output lacks \"%s\":\n%s", want[i], out);
  cr_assert_eq(attn_cli("plan --backward --json --seq 1024 --head-dim 64", out, sizeof out), 0,
               "%s", out);
  cr_expect(strstr(out, "\"pass\": \"backward\""), "%s", out);
  cr_expect(strstr(out, "\"ds\": 4194304,"), "%s", out);
  cr_expect(strstr(out, "\"delta\": 4096,"), "%s", out);
}

Test(plan, cli_errors_exit_2) {
  char out[8192];
  cr_expect_eq(attn_cli("plan --seq 0", out, sizeof out), 2);
  cr_expect(strstr(out, "--seq expects an integer from 1"), "%s", out);
  cr_expect_eq(attn_cli("plan --dtype F64", out, sizeof out), 2);
  cr_expect(strstr(out, "--dtype expects F32, F16 or BF16"), "%s", out);
  cr_expect_eq(attn_cli("plan --heads 6 --heads-kv 4", out, sizeof out), 2);
  cr_expect(strstr(out, "not a multiple"), "%s", out);
  cr_expect_eq(attn_cli("plan --frobnicate", out, sizeof out), 2);
  cr_expect_eq(attn_cli("frobnicate", out, sizeof out), 2);
  cr_expect_eq(attn_cli("plan --help", out, sizeof out), 0);
  cr_expect(strstr(out, "usage: attn plan"), "%s", out);
}
