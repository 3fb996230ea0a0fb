/*
 * test_options.c — the one option parser (query string, __metadata__, JSON
 * fields all end in attn_options_set), precedence, and the error table that
 * maps every engine and wire-format code to an HTTP status and code string.
 */
#include "proto.h"

#include "errors.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(options, defaults) {
  attn_options o;
  attn_options_init(&o);
  cr_expect(!o.causal && !o.stats && isnan(o.scale));
  cr_expect_eq(o.window_left, -1);
  cr_expect_eq(o.window_right, -1);
  cr_expect_str_eq(o.backend, "auto");
  cr_expect_eq(o.set, 0);
}

Test(options, query_string) {
  attn_options o;
  attn_status st;
  attn_options_init(&o);
  cr_assert_eq(
      attn_options_parse_query(
          &o, "causal=true&scale=0.125&window_left=64&window_right=0&stats=1&backend=cpu", &st),
      0, "%s", st.message);
  cr_expect(o.causal && o.stats);
  cr_expect_eq(o.scale, 0.125);
  cr_expect_eq(o.window_left, 64);
  cr_expect_eq(o.window_right, 0);
  cr_expect_str_eq(o.backend, "cpu");
  cr_expect_eq(o.set, ATTN_OPT_CAUSAL | ATTN_OPT_SCALE | ATTN_OPT_WINDOW_LEFT |
                          ATTN_OPT_WINDOW_RIGHT | ATTN_OPT_STATS | ATTN_OPT_BACKEND);
  attn_options_init(&o); /* percent-encoding, a bare flag, empty pairs */
  cr_assert_eq(attn_options_parse_query(&o, "&causal&scale=%2E5&&backend=refer%65nce&", &st), 0,
               "%s", st.message);
  cr_expect(o.causal);
  cr_expect_eq(o.scale, 0.5);
  cr_expect_str_eq(o.backend, "reference");
  cr_expect_eq(attn_options_parse_query(&o, NULL, &st), 0);
  cr_expect_eq(attn_options_parse_query(&o, "", &st), 0);
}

static void bad(const char *query, int code, const char *needle) {
  attn_options o;
  attn_status st = {0};
  attn_options_init(&o);
  cr_expect_eq(attn_options_parse_query(&o, query, &st), code, "%s: %s", query, st.message);
  cr_expect(strstr(st.message, needle), "%s: message \"%s\" lacks \"%s\"", query, st.message,
            needle);
}

Test(options, errors_name_the_option) {
  bad("frobnicate=1", ATTN_PROTO_EOPTION, "unknown option \"frobnicate\" in the query string");
  bad("causal=yes", ATTN_PROTO_EOPTVALUE,
      "option \"causal\" in the query string must be true or false (got \"yes\")");
  bad("stats=", ATTN_PROTO_EOPTVALUE, "\"stats\"");
  bad("scale=abc", ATTN_PROTO_EOPTVALUE, "must be a finite number");
  bad("scale=inf", ATTN_PROTO_EOPTVALUE, "finite");
  bad("scale=nan", ATTN_PROTO_EOPTVALUE, "finite");
  bad("scale=1e999", ATTN_PROTO_EOPTVALUE, "finite");
  bad("window_left=-2", ATTN_PROTO_EOPTVALUE, "integer >= -1");
  bad("window_right=1.5", ATTN_PROTO_EOPTVALUE, "\"window_right\"");
  bad("window_left=99999999999999999999", ATTN_PROTO_EOPTVALUE, "\"window_left\"");
  bad("backend=tpu", ATTN_PROTO_EOPTVALUE, "auto, cpu, cuda or reference");
  bad("Causal=true", ATTN_PROTO_EOPTION, "\"Causal\"");  /* names are case-sensitive */
  bad("caus%00al=1", ATTN_PROTO_EOPTION, "caus\\x00al"); /* bytes shown escaped */
}

Test(options, set_directly_and_kinds) {
  attn_options o;
  attn_status st;
  attn_options_init(&o);
  cr_expect_eq(attn_options_set(&o, "stats", 5, "true", 4, "__metadata__", &st), 0);
  cr_expect(o.stats);
  cr_expect_eq(attn_options_set(&o, "stats", 5, "True", 4, "__metadata__", &st),
               ATTN_PROTO_EOPTVALUE);
  cr_expect(strstr(st.message, "in the __metadata__"), "%s", st.message);
  cr_expect_eq(attn_option_kind_of("causal", 6), ATTN_OPTK_BOOL);
  cr_expect_eq(attn_option_kind_of("scale", 5), ATTN_OPTK_NUMBER);
  cr_expect_eq(attn_option_kind_of("window_left", 11), ATTN_OPTK_INT);
  cr_expect_eq(attn_option_kind_of("backend", 7), ATTN_OPTK_STRING);
  cr_expect_eq(attn_option_kind_of("causa", 5), ATTN_OPTK_NONE);
}

/* The body's options win over the query string's; unset ones do not. */
Test(options, merge_precedence) {
  attn_options q, b;
  attn_status st;
  attn_options_init(&q);
  attn_options_init(&b);
  attn_options_parse_query(&q, "causal=true&scale=0.25&backend=cpu", &st);
  attn_options_parse_query(&b, "causal=false&window_left=8", &st);
  attn_options_merge(&q, &b);
  cr_expect(!q.causal);
  cr_expect_eq(q.scale, 0.25);
  cr_expect_eq(q.window_left, 8);
  cr_expect_str_eq(q.backend, "cpu");
}

Test(errors, http_table) {
  cr_expect_eq(attn_proto_http_status(0), 200);
  cr_expect_eq(attn_proto_http_status(ATTN_PROTO_EJSON), 400);
  cr_expect_str_eq(attn_proto_code_name(ATTN_PROTO_EJSON), "malformed_json");
  cr_expect_eq(attn_proto_http_status(ATTN_PROTO_ETOOLARGE), 413);
  cr_expect_eq(attn_proto_http_status(ATTN_PROTO_EMEDIATYPE), 415);
  cr_expect_eq(attn_proto_http_status(ATTN_PROTO_EMISSING), 422);
  cr_expect_eq(attn_proto_http_status(ATTN_EHEADS), 422);
  cr_expect_eq(attn_proto_http_status(ATTN_ENONFINITE), 422);
  cr_expect_str_eq(attn_proto_code_name(ATTN_ENONFINITE), "non_finite");
  cr_expect_eq(attn_proto_http_status(ATTN_ESHUTDOWN), 503);
  cr_expect_eq(attn_proto_http_status(ATTN_EDEVICE), 500);
  cr_expect_eq(attn_proto_http_status(-12345), 500);
  cr_expect_str_eq(attn_proto_code_name(-12345), "internal_error");
  /* every code has a status in 4xx/5xx and a non-empty code string */
  for (int c = ATTN__ERRNO_BASE + 1; c < ATTN__ERRNO_END; c++) {
    int s = attn_proto_http_status(c);
    cr_expect(s >= 400 && s < 600 && *attn_proto_code_name(c), "engine code %d", c);
  }
  for (int c = ATTN_PROTO__ERRNO_BASE + 1; c < ATTN_PROTO__ERRNO_END; c++) {
    int s = attn_proto_http_status(c);
    cr_expect(s >= 400 && s < 600 && *attn_proto_code_name(c), "proto code %d", c);
  }
}

/* proto/openapi.yaml lists every code the table can produce. */
Test(errors, openapi_lists_every_code) {
  FILE *f = fopen("proto/openapi.yaml", "r");
  cr_assert(f, "run from the repository root");
  char *text = calloc(1, 1 << 20);
  size_t n = fread(text, 1, (1 << 20) - 1, f);
  fclose(f);
  text[n] = 0;
  int lo[2] = {ATTN__ERRNO_BASE + 1, ATTN_PROTO__ERRNO_BASE + 1};
  int hi[2] = {ATTN__ERRNO_END, ATTN_PROTO__ERRNO_END};
  for (int r = 0; r < 2; r++)
    for (int c = lo[r]; c < hi[r]; c++) {
      char want[80];
      snprintf(want, sizeof want, "        - %s\n", attn_proto_code_name(c));
      cr_expect(strstr(text, want), "openapi.yaml's ErrorCode lacks %s", attn_proto_code_name(c));
    }
    /* and every code of the server's own that goes on the wire */
#define WANT_CODE(name, status, reason, code, refusal)                        \
  if (status != 499) {                                                        \
    char want[80];                                                            \
    snprintf(want, sizeof want, "        - %s\n", code);                      \
    cr_expect(strstr(text, want), "openapi.yaml's ErrorCode lacks %s", code); \
  }
  ATTND_ERRNO_MAP(WANT_CODE)
#undef WANT_CODE
  free(text);
}

/* diag_offset: any integer within +-2^40 (negative ones too), default
 * "auto", the body's over the query's, and through the request encoders. */
Test(options, diag_offset) {
  attn_options o, b;
  attn_status st;
  attn_options_init(&o);
  cr_expect_eq(o.diag_offset, ATTN_DIAG_AUTO);
  cr_assert_eq(attn_options_parse_query(&o, "diag_offset=-1099511627776", &st), 0, "%s",
               st.message);
  cr_expect_eq(o.diag_offset, -((int64_t)1 << 40));
  cr_expect(o.set & ATTN_OPT_DIAG_OFFSET);
  cr_expect_eq(attn_options_parse_query(&o, "diag_offset=1099511627777", &st),
               ATTN_PROTO_EOPTVALUE);
  cr_expect(strstr(st.message, "diag_offset") && strstr(st.message, "2^40"), "%s", st.message);
  cr_expect_eq(attn_options_parse_query(&o, "diag_offset=1.5", &st), ATTN_PROTO_EOPTVALUE);
  attn_options_init(&b);
  attn_options_parse_query(&b, "diag_offset=0", &st);
  attn_options_merge(&o, &b);
  cr_expect_eq(o.diag_offset, 0);
  /* -7 through the JSON body into the engine request */
  const char *body = "{\"q\":[[1,2]],\"k\":[[1,0],[0,1]],\"v\":[[1,2],[3,4]],\"diag_offset\":-7}";
  attn_proto_req pr;
  cr_assert_eq(attn_proto_decode_json(body, strlen(body), NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.req.diag_offset, -7);
  attn_proto_req_free(&pr);
}
