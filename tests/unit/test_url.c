/*
 * test_url.c — the URL parser (proto/url.h) of the clients and --handover against a table
 * written out by hand: scheme, host, IPv6 literals, port (given and
 * default), path, query; then inputs it must refuse, each with a message
 * that quotes the URL and says what is wrong.
 */
#include "url.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* Each URL and what it must read as, written out by hand:
 * "scheme|host|ipv6|port|path|query" (query "-" for no '?'), or for one it
 * must refuse "! " and a phrase of the message, which also quotes the URL. */
static const char *const cases[][2] = {
    {"http://127.0.0.1:8080", "http|127.0.0.1|0|8080||-"},
    {"http://localhost", "http|localhost|0|80||-"},
    {"https://attnd.example", "https|attnd.example|0|443||-"},
    {"HTTP://Host:1/", "http|Host|0|1||-"},
    {"http://h:65535/attention", "http|h|0|65535|/attention|-"},
    {"http://h/api/attention/", "http|h|0|80|/api/attention/|-"},
    {"http://h:8080?causal=true", "http|h|0|8080||causal=true"},
    {"http://h/attention?causal=true&scale=0.5", "http|h|0|80|/attention|causal=true&scale=0.5"},
    {"http://h/?", "http|h|0|80||"},
    {"http://[::1]:8080", "http|::1|1|8080||-"},
    {"http://[::1]", "http|::1|1|80||-"},
    {"https://[2001:db8::7]/v2", "https|2001:db8::7|1|443|/v2|-"},
    {"http://[::ffff:10.0.0.1]:9", "http|::ffff:10.0.0.1|1|9||-"},
    {"127.0.0.1:8080", "|127.0.0.1|0|8080||-"},
    {"localhost/attention", "|localhost|0|80|/attention|-"},
    {"http://h:0080", "http|h|0|80||-"},
    {"ftp://h", "! must start with http:// or https://"},
    {"://h", "! must start with http:// or https://"},
    {"http://", "! no host"},
    {"http://:8080", "! no host"},
    {"http:///attention", "! no host"},
    {"", "! no host"},
    {"http://h:", "! bad port"},
    {"http://h:0", "! bad port"},
    {"http://h:65536", "! bad port"},
    {"http://h:99999999999999999999", "! bad port"},
    {"http://h:80x", "! bad port"},
    {"http://h:+80", "! bad port"},
    {"http://h:-1", "! bad port"},
    {"http://[::1", "! bad IPv6 address"},
    {"http://[]:80", "! bad IPv6 address"},
    {"http://[zz::1]", "! bad IPv6 address"},
    {"http://[127.0.0.1]", "! bad IPv6 address"},
    {"http://[::1]x", "! bad host"},
    {"http://[::1]:", "! bad port"},
    {"http://user:pw@h", "! credentials"},
    {"http://h/a b", "! space or control character"},
    {"http://h/\tx", "! space or control character"},
    {"http://h\r\n", "! space or control character"},
    {"http://h/attention#top", "! #fragment"},
};

Test(url, reads_or_refuses_each) {
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *in = cases[i][0], *want = cases[i][1];
    attn_url u;
    attn_status st = {0};
    int rc = attn_url_parse(in, &u, &st);
    if (want[0] == '!') {
      cr_expect_eq(rc, ATTN_EINVAL, "%s", in);
      cr_expect(strstr(st.message, want + 2) && strstr(st.message, in), "%s: \"%s\" lacks \"%s\"",
                in, st.message, want + 2);
      continue;
    }
    cr_assert_eq(rc, 0, "%s: %s", in, st.message);
    char got[3000];
    snprintf(got, sizeof got, "%s|%s|%d|%d|%s|%s", u.scheme, u.host, u.ipv6, u.port, u.path,
             u.has_query ? u.query : "-");
    cr_expect_str_eq(got, want, "%s", in);
  }
}

Test(url, long_parts_are_refused_not_cut) {
  char s[3000];
  attn_status st;
  attn_url u;
  memset(s, 'a', sizeof s - 1);
  s[sizeof s - 1] = 0;
  memcpy(s, "http://", 7);
  cr_expect_eq(attn_url_parse(s, &u, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "host too long") != NULL, "%s", st.message);
  memcpy(s, "http://h/", 9);
  cr_expect_eq(attn_url_parse(s, &u, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "path too long") != NULL, "%s", st.message);
  memcpy(s, "http://h/?", 10);
  cr_expect_eq(attn_url_parse(s, &u, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "query too long") != NULL, "%s", st.message);
  /* the longest that fit: 255 bytes of host, 1023 of path and of query */
  char ok[7 + 255 + 1023 + 1 + 1023 + 1];
  size_t o = 0;
  memcpy(ok, "http://", 7), o = 7;
  memset(ok + o, 'h', 255), o += 255;
  ok[o++] = '/';
  memset(ok + o, 'p', 1022), o += 1022;
  ok[o++] = '?';
  memset(ok + o, 'q', 1023), o += 1023;
  ok[o] = 0;
  cr_expect_eq(attn_url_parse(ok, &u, &st), 0, "%s", st.message);
  cr_expect_eq(strlen(u.host), 255);
  cr_expect_eq(strlen(u.path), 1023);
  cr_expect_eq(strlen(u.query), 1023);
}

Test(url, a_base_has_no_query) {
  attn_status st;
  cr_expect_eq(attn_url_base("http://127.0.0.1:8080", &st), 0);
  cr_expect_eq(attn_url_base("http://127.0.0.1:8080/attention", &st), 0);
  cr_expect_eq(attn_url_base("https://[::1]:8443/", &st), 0);
  cr_expect_eq(attn_url_base("http://h/?causal=true", &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "must be the server's base") &&
                strstr(st.message, "options are flags"),
            "%s", st.message);
  cr_expect_eq(attn_url_base("http://h?", &st), ATTN_EINVAL);
  cr_expect_eq(attn_url_base("http://h:bad", &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "bad port") != NULL, "%s", st.message);
}
