/*
 * test_prom.c — the Prometheus text writer (proto/prom.c) against text
 * written by hand from the exposition format 0.0.4: family headers,
 * samples with and without labels, the three value forms, histograms with
 * cumulative buckets, and the escapes of label values and HELP.
 */
#include "prom.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The buffer's text, checked to be exactly want, then freed. */
static void expect_text(attn_sbuf *b, const char *want) {
  cr_assert(!b->oom);
  cr_assert_not_null(b->p);
  cr_expect_str_eq(b->p, want);
  cr_expect_eq(b->len, strlen(want));
  free(b->p);
}

Test(prom, counter_and_gauge_families) {
  attn_sbuf b = {0};
  attn_prom_counter(&b, "x_total", "Things done.", 18446744073709551615ull);
  attn_prom_gauge(&b, "x_depth", "Things waiting.", -3);
  expect_text(&b, "# HELP x_total Things done.\n"
                  "# TYPE x_total counter\n"
                  "x_total 18446744073709551615\n"
                  "# HELP x_depth Things waiting.\n"
                  "# TYPE x_depth gauge\n"
                  "x_depth -3\n");
}

Test(prom, samples_with_labels_in_the_order_given) {
  attn_sbuf b = {0};
  attn_prom_label l[] = {{"path", "/attention"}, {"code", "200"}};
  attn_prom_family(&b, "req_total", "counter", "Requests.");
  attn_prom_sample_u64(&b, "req_total", l, 2, 7);
  attn_prom_sample_i64(&b, "req_total", l, 1, -1);
  attn_prom_sample_f64(&b, "req_total", NULL, 0, 0.5);
  expect_text(&b, "# HELP req_total Requests.\n"
                  "# TYPE req_total counter\n"
                  "req_total{path=\"/attention\",code=\"200\"} 7\n"
                  "req_total{path=\"/attention\"} -1\n"
                  "req_total 0.5\n");
}

Test(prom, doubles_shortest_exact_and_the_special_values) {
  attn_sbuf b = {0};
  attn_prom_sample_f64(&b, "a", NULL, 0, 0.1);
  attn_prom_sample_f64(&b, "a", NULL, 0, 0.1 + 0.2); /* needs 17 digits */
  attn_prom_sample_f64(&b, "a", NULL, 0, 3e9);
  attn_prom_sample_f64(&b, "a", NULL, 0, 1e300);
  attn_prom_sample_f64(&b, "a", NULL, 0, NAN);
  attn_prom_sample_f64(&b, "a", NULL, 0, INFINITY);
  attn_prom_sample_f64(&b, "a", NULL, 0, -INFINITY);
  expect_text(&b, "a 0.1\n"
                  "a 0.30000000000000004\n"
                  "a 3000000000\n"
                  "a 1e+300\n"
                  "a NaN\n"
                  "a +Inf\n"
                  "a -Inf\n");
}

Test(prom, label_values_escape_backslash_quote_and_newline) {
  attn_sbuf b = {0};
  attn_prom_label l[] = {{"model", "a\\b\"c\nd"}, {"k", "\\\\\"\"\n\n"}, {"e", ""}};
  attn_prom_sample_u64(&b, "m", l, 3, 1);
  expect_text(&b, "m{model=\"a\\\\b\\\"c\\nd\",k=\"\\\\\\\\\\\"\\\"\\n\\n\",e=\"\"} 1\n");
}

Test(prom, other_bytes_of_a_label_value_go_out_as_they_are) {
  attn_sbuf b = {0};
  attn_prom_label l[] = {{"v", "tab\there, {braces}, caf\xc3\xa9, \x01"}};
  attn_prom_sample_u64(&b, "m", l, 1, 2);
  expect_text(&b, "m{v=\"tab\there, {braces}, caf\xc3\xa9, \x01\"} 2\n");
}

Test(prom, help_escapes_backslash_and_newline_but_not_quotes) {
  attn_sbuf b = {0};
  attn_prom_family(&b, "m", "gauge", "a \"quoted\" C:\\path\nsecond line");
  expect_text(&b, "# HELP m a \"quoted\" C:\\\\path\\nsecond line\n"
                  "# TYPE m gauge\n");
}

Test(prom, histogram_buckets_are_cumulative_with_inf_sum_and_count) {
  static const char *const les[] = {"0.5", "1", "2.5"};
  const uint64_t counts[] = {2, 0, 3, 1}; /* the last above 2.5 */
  attn_prom_hist h = {.les = les, .counts = counts, .nbounds = 3, .sum = 9.25};
  attn_sbuf b = {0};
  attn_prom_family(&b, "d_seconds", "histogram", "Durations.");
  attn_prom_histogram(&b, "d_seconds", NULL, 0, &h);
  expect_text(&b, "# HELP d_seconds Durations.\n"
                  "# TYPE d_seconds histogram\n"
                  "d_seconds_bucket{le=\"0.5\"} 2\n"
                  "d_seconds_bucket{le=\"1\"} 2\n"
                  "d_seconds_bucket{le=\"2.5\"} 5\n"
                  "d_seconds_bucket{le=\"+Inf\"} 6\n"
                  "d_seconds_sum 9.25\n"
                  "d_seconds_count 6\n");
}

Test(prom, histogram_labels_come_before_le_and_on_sum_and_count) {
  static const char *const les[] = {"1"};
  const uint64_t counts[] = {0, 0};
  attn_prom_hist h = {.les = les, .counts = counts, .nbounds = 1, .sum = 0};
  attn_prom_label l[] = {{"path", "/v2"}, {"model", "m\"x"}};
  attn_sbuf b = {0};
  attn_prom_histogram(&b, "d", l, 2, &h);
  expect_text(&b, "d_bucket{path=\"/v2\",model=\"m\\\"x\",le=\"1\"} 0\n"
                  "d_bucket{path=\"/v2\",model=\"m\\\"x\",le=\"+Inf\"} 0\n"
                  "d_sum{path=\"/v2\",model=\"m\\\"x\"} 0\n"
                  "d_count{path=\"/v2\",model=\"m\\\"x\"} 0\n");
}

Test(prom, a_histogram_without_bounds_is_its_inf_bucket) {
  const uint64_t counts[] = {4};
  attn_prom_hist h = {.les = NULL, .counts = counts, .nbounds = 0, .sum = 1e-3};
  attn_sbuf b = {0};
  attn_prom_histogram(&b, "h", NULL, 0, &h);
  expect_text(&b, "h_bucket{le=\"+Inf\"} 4\n"
                  "h_sum 0.001\n"
                  "h_count 4\n");
}

Test(prom, writes_append_to_what_the_buffer_holds) {
  attn_sbuf b = {0};
  attn_sbuf_puts(&b, "before\n");
  attn_prom_counter(&b, "c", "C.", 0);
  expect_text(&b, "before\n# HELP c C.\n# TYPE c counter\nc 0\n");
}

Test(prom, out_of_memory_is_sticky_and_writes_nothing) {
  attn_sbuf b = {.oom = true};
  attn_prom_counter(&b, "c", "C.", 1);
  attn_prom_label l[] = {{"a", "b"}};
  attn_prom_sample_f64(&b, "c", l, 1, 1.5);
  cr_expect(b.oom);
  cr_expect_null(b.p);
  cr_expect_eq(b.len, 0);
}
