/*
 * test_variants.c — softcap and alibi_slopes over HTTP: answers equal to the
 * float64 reference from JSON, safetensors and the query string, and each
 * bad value refused with 422 and the error table's code.
 */
#include "harness.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(variants, .fini = teardown, .timeout = 60);

/* ",\"alibi_slopes\": [...]" of c's slopes (nested [B, Hq] when per batch). */
static void slopes_json(const tcase *c, char *buf, size_t cap) {
  const int64_t nb = c->p.alibi == 2 ? c->p.b : 1;
  size_t o = (size_t)snprintf(buf, cap, ",\"alibi_slopes\":%s", nb > 1 ? "[" : "");
  for (int64_t b = 0; b < nb; b++) {
    o += (size_t)snprintf(buf + o, cap - o, "%s[", b ? "," : "");
    for (int64_t h = 0; h < c->p.hq; h++)
      o += (size_t)snprintf(buf + o, cap - o, "%s%.9g", h ? "," : "",
                            (double)c->alibi[b * c->p.hq + h]);
    o += (size_t)snprintf(buf + o, cap - o, "]");
  }
  snprintf(buf + o, cap - o, "%s", nb > 1 ? "]" : "");
}

static bool post(tcase *c, const char *path, const char *extra, const char *what) {
  size_t len;
  char *b = json_body(c, 4, extra, &len);
  http_res r;
  http_post(&S, path, "application/json", b, len, &r);
  bool ok = expect_correct(&r, c, 4, false, what);
  http_res_free(&r);
  free(b);
  return ok;
}

Test(variants, json_and_query_match_the_reference) {
  srv_start(&S, NULL);
  for (int alibi = 0; alibi <= 2; alibi++) {
    tprob p = tprob_make(2, 4, 2, 37, 53, 32, alibi == 1 ? ATTN_BF16 : ATTN_F32);
    p.causal = alibi != 0;
    p.stats = true;
    p.alibi = alibi;
    p.softcap = alibi == 1 ? 0 : 2.5;
    tcase c;
    tcase_init(&c, &p, 40 + (uint64_t)alibi);
    char extra[1024] = "", what[64];
    if (alibi)
      slopes_json(&c, extra, sizeof extra);
    size_t n = strlen(extra);
    snprintf(extra + n, sizeof extra - n, ",\"stats\":true%s%s", p.causal ? ",\"causal\":true" : "",
             p.softcap > 0 ? ",\"softcap\":2.5" : "");
    snprintf(what, sizeof what, "alibi %d, softcap %g", alibi, p.softcap);
    post(&c, "/attention", extra, what);
    if (p.softcap > 0) { /* the same softcap from the query string */
      extra[n] = 0;
      snprintf(extra + n, sizeof extra - n, ",\"stats\":true%s",
               p.causal ? ",\"causal\":true" : "");
      post(&c, "/attention?softcap=2.5", extra, what);
    }
    tcase_free(&c);
  }
}

/* The client's own encoder (which writes alibi_slopes and the options) as
 * a safetensors body, posted; returns the reply. */
static void post_encoded(const tcase *c, const attn_options *o, http_res *r) {
  void *buf;
  size_t len;
  attn_status st;
  cr_assert_eq(attn_proto_encode_request_safetensors(&c->req, o, &buf, &len, &st), 0, "%s",
               st.message);
  http_post(&S, "/attention", "application/octet-stream", buf, len, r);
  free(buf);
}

Test(variants, safetensors_body) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 4, 4, 20, 70, 16, ATTN_F16);
  p.alibi = 1;
  p.softcap = 7;
  tcase c;
  tcase_init(&c, &p, 77);
  attn_options o;
  attn_options_init(&o);
  o.softcap = 7;
  o.set |= ATTN_OPT_SOFTCAP;
  http_res r;
  post_encoded(&c, &o, &r);
  expect_correct(&r, &c, 4, true, "safetensors with alibi_slopes and softcap in __metadata__");
  http_res_free(&r);
  tcase_free(&c);
}

Test(variants, bad_values_are_422) {
  srv_start(&S, NULL);
  tprob p = tprob_make(2, 2, 1, 5, 6, 8, ATTN_F32);
  p.alibi = 2;
  tcase c;
  tcase_init(&c, &p, 5);
  static const struct {
    const char *extra, *code;
  } bad[] = {
      {",\"softcap\":-1", "invalid_option"},
      {",\"softcap\":true", "invalid_option"},
      {",\"softcap\":1e300", "invalid_request"},
      {",\"alibi_slopes\":[1,2,3]", "shape_mismatch"},
      {",\"alibi_slopes\":[[[1,2]]]", "invalid_tensor"},
      {",\"alibi_slopes\":{\"shape\":[2],\"dtype\":\"BF16\",\"data\":[1,2]}", "dtype_mismatch"},
      {",\"alibi_slopes\":[1e38,1]", "out_of_range"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t len;
    char *b = json_body(&c, 4, bad[i].extra, &len);
    http_res r;
    http_post(&S, "/attention", "application/json", b, len, &r);
    expect_error(&r, 422, bad[i].code, bad[i].extra);
    http_res_free(&r);
    free(b);
  }
  http_res r;
  http_post(&S, "/attention?softcap=nan", "application/json", "{}", 2, &r);
  expect_error(&r, 422, "invalid_option", "softcap=nan in the query");
  http_res_free(&r);
  /* A NaN slope (JSON cannot carry one; safetensors can), named by its place. */
  c.alibi[3] = NAN;
  post_encoded(&c, NULL, &r);
  expect_error(&r, 422, "non_finite", "a NaN slope");
  cr_expect(strstr(r.body, "alibi_slopes holds a non-finite value (nan) at [1, 1]"), "%s", r.body);
  http_res_free(&r);
  tcase_free(&c);
}
