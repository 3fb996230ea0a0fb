/*
 * test_session_entries.c — a decoded session call cut into the store's
 * entries (attn_proto_session_entries), and the decoders' checks that keep
 * that cut safe: a batch's offsets refused as POST /attention refuses them
 * (ATTN_ESHAPE) before any arithmetic, list limits a 422, numbers past any
 * integer, strings with a NUL, and a ttl_s under a second.
 */
#include "proto.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int decode(const char *body, const char *query, bool batch, attn_proto_session *ps,
                  attn_proto_req *pr, attn_status *st) {
  attn_proto_session_init(ps, batch);
  return attn_proto_decode_session(body, strlen(body), true, query, ps, pr, st);
}

#define BQ "\"q\": [[1], [2], [3]], \"cu_seqlens_q\": [0, 1, 1, 3]"
#define BKV "\"k\": [[1], [2], [3], [4]], \"v\": [[1], [2], [3], [4]]"

Test(session_entries, a_batch_cut_by_its_offsets) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  const char *b = "{" BQ ", " BKV ", \"cu_seqlens_kv\": [0, 1, 1, 4], \"sessions\": [\"a\", \"b\", "
                  "\"c\"], \"pos\": [5, 0, 2]}";
  cr_assert_eq(decode(b, NULL, true, &ps, &pr, &st), 0, "%s", st.message);
  attn_kv_entry en[ATTN_PROTO_MAX_BATCH];
  cr_assert_eq(attn_proto_session_entries(&ps, &pr.req, "unused", en), 3);
  const int64_t off[] = {0, 1, 1}, nn[] = {1, 0, 3}, pos[] = {5, 0, 2};
  const char *ids[] = {"a", "b", "c"};
  for (int e = 0; e < 3; e++)
    cr_expect(!strcmp(en[e].id, ids[e]) && en[e].kv_off == off[e] && en[e].n_new == nn[e] &&
                  en[e].pos == pos[e],
              "entry %d: %s %lld + %lld at %lld", e, en[e].id, (long long)en[e].kv_off,
              (long long)en[e].n_new, (long long)en[e].pos);
  attn_proto_req_free(&pr);
  /* without new tokens: ids only */
  cr_assert_eq(decode("{" BQ ", \"sessions\": [\"a\", \"b\", \"c\"]}", NULL, true, &ps, &pr, &st),
               0, "%s", st.message);
  cr_expect_eq(attn_proto_session_entries(&ps, &pr.req, "unused", en), 3);
  cr_expect(en[2].n_new == 0 && en[2].kv_off == 0 && !strcmp(en[2].id, "c"));
  attn_proto_req_free(&pr);
  /* one session's route: the route's id, every new row */
  cr_assert_eq(decode("{\"q\": [[1]], \"k\": [[1], [2]], \"v\": [[1], [2]], \"pos\": 4}", NULL,
                      false, &ps, &pr, &st),
               0, "%s", st.message);
  cr_expect_eq(attn_proto_session_entries(&ps, &pr.req, "route", en), 1);
  cr_expect(!strcmp(en[0].id, "route") && en[0].pos == 4 && en[0].n_new == 2 && en[0].kv_off == 0);
  attn_proto_req_free(&pr);
}

Test(session_entries, offsets_refused_before_any_arithmetic) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  const struct {
    const char *kv, *q, *needle;
  } cases[] = {
      {"[0, 1, 0, 4]", "[0, 1, 1, 3]", "must not decrease"},
      {"[1, 1, 1, 4]", "[0, 1, 1, 3]", "must start at 0"},
      {"[0, 1, 1, 5]", "[0, 1, 1, 3]", "the last offset"},
      {"[0, 1, 1, 4]", "[0, 2, 1, 3]", "cu_seqlens_q[2] = 1"},
      {"[0, 1, 1, 4]", "[0, 1, 1, 2]", "q has 3"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char b[400];
    snprintf(b, sizeof b,
             "{\"q\": [[1], [2], [3]], \"cu_seqlens_q\": %s, " BKV ", \"cu_seqlens_kv\": %s, "
             "\"sessions\": [\"a\", \"b\", \"c\"], \"pos\": [0, 0, 0]}",
             cases[i].q, cases[i].kv);
    cr_expect_eq(decode(b, NULL, true, &ps, &pr, &st), ATTN_ESHAPE, "case %zu", i);
    cr_expect(strstr(st.message, cases[i].needle), "case %zu: %s", i, st.message);
    attn_proto_req_free(&pr);
  }
}

Test(session_entries, lists_numbers_and_nuls) {
  attn_proto_session ps;
  attn_proto_req pr;
  attn_status st;
  /* 257 ids: a value out of range, not a body too large */
  char *q = malloc(257 * 6 + 32), *p = q;
  p += sprintf(p, "sessions=");
  for (int i = 0; i < 257; i++)
    p += sprintf(p, "%ss%d", i ? "," : "", i);
  cr_expect_eq(decode("{\"q\": [[1]], \"cu_seqlens_q\": [0, 1]}", q, true, &ps, &pr, &st),
               ATTN_PROTO_EOPTVALUE, "%s", st.message);
  cr_expect(strstr(st.message, "256"), "%s", st.message);
  attn_proto_req_free(&pr);
  free(q);
  const char *bad[] = {
      "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"pos\": 1e300}",
      "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"pos\": -1e300}",
      "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"pos\": 0, \"layer\": 1e19}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(decode(bad[i], NULL, false, &ps, &pr, &st), ATTN_PROTO_EOPTVALUE, "case %zu", i);
    attn_proto_req_free(&pr);
  }
  cr_expect_eq(decode("{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"cu_seqlens_q\": [0, 1], "
                      "\"cu_seqlens_kv\": [0, 1], \"sessions\": [\"a\"], \"pos\": [1e300]}",
                      NULL, true, &ps, &pr, &st),
               ATTN_PROTO_EOPTVALUE);
  attn_proto_req_free(&pr);
  cr_expect_eq(decode("{\"q\": [[1]], \"cu_seqlens_q\": [0, 1], \"sessions\": [\"a\\u0000b\"]}",
                      NULL, true, &ps, &pr, &st),
               ATTN_PROTO_EOPTVALUE);
  attn_proto_req_free(&pr);
}

Test(session_entries, create_and_truncate_refusals) {
  attn_kv_shape sh;
  double ttl;
  int64_t n;
  attn_status st;
  const struct {
    const char *body;
    int code;
  } cases[] = {
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\\u0000x\", \"max_tokens\": 1}",
       ATTN_EDTYPE},
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 1, "
       "\"ttl_s\\u0000\": 5}",
       ATTN_PROTO_EOPTION},
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 1, \"ttl_s\": "
       "1e-300}",
       ATTN_PROTO_EOPTVALUE},
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 1, \"ttl_s\": "
       "0.999}",
       ATTN_PROTO_EOPTVALUE},
      /* an escaped backslash then u0000 is no NUL: F32\u0000 is no dtype either */
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\\\\u0000\", \"max_tokens\": 1}",
       ATTN_EDTYPE},
      {"{\"heads_kv\": 1, \"head_dim\": 1, \"dtype\": \"F32\", \"max_tokens\": 1, \"ttl_s\": 1}",
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    cr_expect_eq(
        attn_proto_session_create_decode(cases[i].body, strlen(cases[i].body), 60, &sh, &ttl, &st),
        cases[i].code, "case %zu: %s", i, st.message);
  const char *esc = cases[4].body; /* the scan skips an escaped backslash */
  attn_proto_session_create_decode(esc, strlen(esc), 60, &sh, &ttl, &st);
  cr_expect(!strstr(st.message, "NUL"), "%s", st.message);
  const char *nul = "{\"length\": 1, \"length\\u0000\": 2}";
  cr_expect_eq(attn_proto_session_truncate_decode(nul, strlen(nul), &n, &st), ATTN_PROTO_EJSON,
               "%s", st.message);
  const char *two = "{\"length\": 1} {\"length\": 2}";
  cr_expect_eq(attn_proto_session_truncate_decode(two, strlen(two), &n, &st), ATTN_PROTO_EJSON,
               "%s", st.message);
  nul = "{\"length\\u0000x\": 2}";
  cr_expect_eq(attn_proto_session_truncate_decode(nul, strlen(nul), &n, &st), ATTN_PROTO_EOPTION,
               "%s", st.message);
}
