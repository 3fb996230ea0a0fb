/*
 * test_args.c — the command-line value helpers every attn command shares
 * (clients/args.h): integers and numbers within a range, the comma lists
 * behind --shape, --cu-seqlens-* and --alibi-slopes, and what each refuses.
 */
#include "args.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>

Test(args, integers_within_their_range, .init = cr_redirect_stderr) {
  int64_t v = 0;
  cr_expect_eq(tool_arg_i64("--n", "42", 1, 100, &v), 0);
  cr_expect_eq(v, 42);
  cr_expect_eq(tool_arg_i64("--n", "-5", -5, 5, &v), 0);
  cr_expect_eq(v, -5);
  v = 7;
  cr_expect_eq(tool_arg_i64("--n", "101", 1, 100, &v), -1);
  cr_expect_eq(tool_arg_i64("--n", "", 1, 100, &v), -1);
  cr_expect_eq(tool_arg_i64("--n", "4x", 1, 100, &v), -1);
  cr_expect_eq(tool_arg_i64("--n", "99999999999999999999", 1, INT64_MAX, &v), -1);
  cr_expect_eq(tool_arg_i64("--n", NULL, 1, 100, &v), -1);
  cr_expect_eq(v, 7, "a refused value leaves the output alone");
  int i = 0;
  cr_expect_eq(tool_arg_int("--threads", "16", 0, 1024, &i), 0);
  cr_expect_eq(i, 16);
}

Test(args, numbers_within_their_range, .init = cr_redirect_stderr) {
  double d = 1;
  cr_expect_eq(tool_arg_double("--rate", "2.5", 1e-3, 1e7, &d), 0);
  cr_expect_eq(d, 2.5);
  cr_expect_eq(tool_arg_double("--rate", "1e3", 1e-3, 1e7, &d), 0);
  cr_expect_eq(d, 1000);
  cr_expect_eq(tool_arg_double("--timeout", "0", 0, 1e6, &d), 0);
  cr_expect_eq(d, 0);
  d = 9;
  const char *bad[] = {"", "x", "1s", "nan", "inf", "1e999", "-1", "2e7"};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
    cr_expect_eq(tool_arg_double("--rate", bad[k], 0, 1e7, &d), -1, "%s", bad[k]);
  cr_expect_eq(d, 9, "a refused value leaves the output alone");
}

Test(args, refusals_name_the_flag_and_the_value, .init = cr_redirect_stderr) {
  double d;
  tool_arg_double("--duration", "soon", 1e-3, 1e7, &d);
  fflush(stderr);
  cr_expect_stderr_eq_str("attn: --duration expects a number from 0.001 to 1e+07 (got \"soon\")\n");
}

Test(args, dims_are_four_positive_integers, .init = cr_redirect_stderr) {
  int64_t s[4];
  cr_expect_eq(tool_arg_dims("--shape", "1,8,512,64", s), 0);
  cr_expect(s[0] == 1 && s[1] == 8 && s[2] == 512 && s[3] == 64);
  const char *bad[] = {"1,8,512", "1,8,512,64,1", "1,0,512,64", "1,8,,64", "1,8,512,64,", "a,b,c,d",
                       ""};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
    cr_expect_eq(tool_arg_dims("--shape", bad[k], s), -1, "%s", bad[k]);
}

Test(args, comma_lists) {
  cr_expect_eq(tool_arg_list_len("0,3,7"), 3);
  cr_expect_eq(tool_arg_list_len("5"), 1);
  cr_expect_eq(tool_arg_list_len(""), 1);
  const char *p = "0,3,7";
  int64_t v[3];
  cr_expect(tool_arg_list_i64(&p, 0, 10, false, &v[0]));
  cr_expect(tool_arg_list_i64(&p, 0, 10, false, &v[1]));
  cr_expect(tool_arg_list_i64(&p, 0, 10, true, &v[2]));
  cr_expect(v[0] == 0 && v[1] == 3 && v[2] == 7);
  p = "0,3";
  cr_expect(!tool_arg_list_i64(&p, 0, 10, true, &v[0]), "a comma where the end belongs");
  p = "3";
  cr_expect(!tool_arg_list_i64(&p, 0, 10, false, &v[0]), "the end where a comma belongs");
  p = "11";
  cr_expect(!tool_arg_list_i64(&p, 0, 10, true, &v[0]), "past hi");
  double d[2];
  p = "0.5,-0.25";
  cr_expect(tool_arg_list_double(&p, false, &d[0]));
  cr_expect(tool_arg_list_double(&p, true, &d[1]));
  cr_expect(d[0] == 0.5 && d[1] == -0.25);
  p = "inf";
  cr_expect(!tool_arg_list_double(&p, true, &d[0]), "not finite");
  p = "1e999";
  cr_expect(!tool_arg_list_double(&p, true, &d[0]), "overflows");
}
