/*
 * test_error_body.c — every error body is strict JSON, whatever bytes the
 * message quotes: messages echo what clients sent (names, values, the
 * Content-Type, the URL) and are cut with %.Ns, which can split a UTF-8
 * character. A strict client must never fail to read why it was refused,
 * and reads it back with attn_proto_error_read.
 */
#include "proto.h"
#include "strict_json.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FFFD "\xef\xbf\xbd"

/* The body for message, checked strict; the decoded message into msg. */
static void body_of(const char *message, char *msg, size_t cap) {
  size_t len = 0;
  char *b = attn_proto_error_body("invalid_option", message, &len);
  cr_assert(b);
  cr_assert_eq(strlen(b), len, "the length counts the whole body and no NUL");
  cr_expect(strict_error_body(b, len, msg, cap), "not strict JSON: %s", b);
  free(b);
}

Test(error_body, a_character_cut_by_a_precision_becomes_fffd) {
  /* what the server's "Content-Type \"%.60s\"" does to a header whose 60th
   * byte is the first half of an "é" */
  char ctype[80], message[128], msg[256];
  memset(ctype, 'a', 59);
  strcpy(ctype + 59, "\xc3\xa9tc");
  snprintf(message, sizeof message, "Content-Type \"%.60s\" is not one this server reads", ctype);
  body_of(message, msg, sizeof msg);
  cr_expect(strstr(msg, "a" FFFD "\" is not one") != NULL, "decoded: %s", msg);
}

Test(error_body, invalid_utf8_is_replaced_byte_by_byte) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"x\xffy", "x" FFFD "y"},                  /* never a UTF-8 byte */
      {"x\x80y", "x" FFFD "y"},                  /* a stray continuation */
      {"\xc0\xaf", FFFD FFFD},                   /* overlong '/' */
      {"\xe0\x80\xaf", FFFD FFFD FFFD},          /* overlong, three bytes */
      {"\xed\xa0\x80", FFFD FFFD FFFD},          /* a surrogate, U+D800 */
      {"\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD}, /* past U+10FFFF */
      {"\xe2\x82", FFFD FFFD},                   /* "€" cut at the end */
      {"\xe2\x82x", FFFD FFFD "x"},              /* ... and in the middle */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char msg[64];
    body_of(cases[i].in, msg, sizeof msg);
    cr_expect_str_eq(msg, cases[i].out, "case %zu", i);
  }
}

Test(error_body, well_formed_utf8_and_escapes_round_trip) {
  static const char *const kept[] = {
      "caf\xc3\xa9",
      "\xe2\x82\xac 5",
      "\xf0\x9f\x98\x80",
      "\xef\xbf\xbf",
      "quote \" backslash \\ slash /",
      "tab\tnew\nline\rcr \x01\x1f del\x7f",
  };
  for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
    char msg[64];
    body_of(kept[i], msg, sizeof msg);
    cr_expect_str_eq(msg, kept[i], "case %zu", i);
  }
  size_t len;
  char *b = attn_proto_error_body("x", "a\x01z\x7f", &len);
  cr_expect(strstr(b, "a\\u0001z\\u007f") != NULL, "control bytes escaped: %s", b);
  free(b);
}

Test(error_body, a_long_message_is_cut_between_characters) {
  /* 1023 ASCII bytes then "é": the cap of 1024 falls inside it */
  size_t n = ATTN_PROTO_MAX_MESSAGE - 1;
  char *m = malloc(n + 3 + 4000);
  memset(m, 'a', n);
  strcpy(m + n, "\xc3\xa9");
  for (int i = 0; i < 2000; i++)
    strcat(m + n, "\xc3\xa9");
  char *msg = malloc(4096);
  body_of(m, msg, 4096);
  cr_expect_eq(strlen(msg), n + 3, "cut before the split character");
  cr_expect_str_eq(msg + n, "...");
  cr_expect(strstr(msg, FFFD) == NULL, "a cut of ours is never a U+FFFD");
  /* all "é": the cut keeps 512 whole ones */
  body_of(m + n, msg, 4096);
  cr_expect_eq(strlen(msg), 1024 + 3);
  free(msg);
  free(m);
}

/* Deterministic noise: any bytes at all give a strict body. */
Test(error_body, random_bytes_always_give_strict_json) {
  uint64_t x = 0x9e3779b97f4a7c15u;
  char m[400], msg[4096];
  for (int t = 0; t < 5000; t++) {
    size_t n = 0, want = (size_t)(t % 397);
    while (n < want) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      /* half ASCII, half high bytes, so sequences sometimes form */
      unsigned char c = (unsigned char)(x >> 24);
      if (c)
        m[n++] = (char)((x & 1) ? c : (c & 0x7f) | 1);
    }
    m[n] = 0;
    body_of(m, msg, sizeof msg);
  }
}

/* The codecs' own messages, from inputs carrying invalid UTF-8. */
Test(error_body, codec_messages_are_strict) {
  static const char *const bodies[] = {
      "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"caf\xc3\": 1}",
      "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]], \"backend\": \"\xff\xfe\"}",
      "{\"q\": {\"shape\": [1, 1], \"dtype\": \"F\xe2\x82\", \"data\": [1]}}",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    attn_proto_req pr;
    attn_status st = {0};
    int rc = attn_proto_decode_json(bodies[i], strlen(bodies[i]), NULL, &pr, &st);
    cr_assert_lt(rc, 0, "case %zu decoded", i);
    char msg[512];
    body_of(st.message, msg, sizeof msg);
  }
  attn_plan_params pp;
  attn_status st = {0};
  cr_assert_lt(attn_proto_parse_plan_query("seq_q=1&head_dim=1&h%C3=%FF", &pp, &st), 0);
  char msg[512];
  body_of(st.message, msg, sizeof msg);
}

/* What a client shows of an error reply is what the body says, escapes
 * decoded and cut to its buffers; anything else is not an error body. */
Test(error_body, read_back_as_written) {
  size_t len;
  char *b = attn_proto_error_body("session_memory_full", "no room for \"s1\"\n(507)", &len);
  char code[8], msg[64];
  cr_assert(attn_proto_error_read(b, len, code, sizeof code, msg, sizeof msg));
  cr_expect_str_eq(code, "session", "the code cut to its buffer");
  cr_expect_str_eq(msg, "no room for \"s1\"\n(507)");
  free(b);
  const char * not [] = {"", "<html>502</html>", "{\"error\": \"gone\"}",
                         "{\"error\": {\"code\": 1, \"message\": \"m\"}}", NULL};
  for (int i = 0; i < 5; i++)
    cr_expect(!attn_proto_error_read(not [i], not [i] ? strlen(not [i]) : 0, code, sizeof code, msg,
                                     sizeof msg),
              "%s", not [i] ? not [i] : "NULL");
}
