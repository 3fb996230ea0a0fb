/*
 * test_proxy.c — trusted proxies (server/proxy.c) on their own: the
 * --trusted-proxy list, matching addresses and networks, and the client
 * found in X-Forwarded-For. tests/server/test_proxy.c checks them in attnd's
 * log lines and connection caps.
 */
#include "proxy.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static attnd_proxies parsed(const char *list) {
  attnd_proxies p = {0};
  char err[160] = "";
  cr_assert_eq(attnd_proxies_parse(&p, list, err, sizeof err), 0, "%s: %s", list, err);
  return p;
}

Test(proxy, addresses_and_networks_match) {
  attnd_proxies p = parsed("10.0.0.0/8, 192.168.1.7,fd00::/8 , ::1, 172.16.0.0/12");
  cr_expect_eq(p.n, 5);
  static const char *const yes[] = {"10.1.2.3", "10.255.255.255", "192.168.1.7",    "fd12:3456::1",
                                    "::1",      "172.31.0.1",     "::ffff:10.9.9.9"};
  static const char *const no[] = {"11.0.0.1",   "192.168.1.8",    "fe80::1", "::2",
                                   "172.32.0.1", "not an address", ""};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    cr_expect(attnd_proxies_trusts(&p, yes[i]), "%s", yes[i]);
  for (size_t i = 0; i < sizeof no / sizeof *no; i++)
    cr_expect(!attnd_proxies_trusts(&p, no[i]), "%s", no[i]);
}

Test(proxy, prefix_lengths_at_their_edges) {
  attnd_proxies p = parsed("0.0.0.0/0");
  cr_expect(attnd_proxies_trusts(&p, "203.0.113.1"));
  cr_expect(!attnd_proxies_trusts(&p, "2001:db8::1"), "an IPv4 network holds no IPv6 address");
  p = parsed("203.0.113.128/25,2001:db8::/127");
  cr_expect(attnd_proxies_trusts(&p, "203.0.113.200"));
  cr_expect(!attnd_proxies_trusts(&p, "203.0.113.127"));
  cr_expect(attnd_proxies_trusts(&p, "2001:db8::1"));
  cr_expect(!attnd_proxies_trusts(&p, "2001:db8::2"));
  p = parsed("");
  cr_expect_eq(p.n, 0);
  cr_expect(!attnd_proxies_trusts(&p, "127.0.0.1"), "an empty list trusts nobody");
}

Test(proxy, bad_lists_are_refused_by_entry) {
  static const char *const bad[] = {"10.0.0.0/33", "::/129",      "10.0.0.1/",    "10.0.0.1/x",
                                    "10.0.0.1/-1", "proxy.local", "10.0.0.1/8/8", "1.2.3"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    attnd_proxies p = {0};
    char err[160] = "";
    char list[64];
    snprintf(list, sizeof list, "127.0.0.1,%s", bad[i]);
    cr_expect_eq(attnd_proxies_parse(&p, list, err, sizeof err), -1, "%s", list);
    cr_expect(strstr(err, bad[i]), "the message names '%s': %s", bad[i], err);
  }
  char many[33 * 12] = "";
  for (int i = 0; i < ATTND_MAX_PROXIES + 1; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "10.0.0.%d,", i);
  attnd_proxies p = {0};
  char err[160];
  cr_expect_eq(attnd_proxies_parse(&p, many, err, sizeof err), -1);
  cr_expect(strstr(err, "more than"), "%s", err);
}

static const char *client(const attnd_proxies *p, const char *peer, const char *const *xff, int n) {
  static char out[ATTND_ADDR_MAX];
  attnd_proxies_client(p, peer, xff, n, out);
  return out;
}

Test(proxy, the_client_is_the_first_untrusted_hop_from_the_right) {
  attnd_proxies p = parsed("10.0.0.0/8");
  const char *one[] = {"198.51.100.7"};
  cr_expect_str_eq(client(&p, "10.0.0.1", one, 1), "198.51.100.7");
  cr_expect_str_eq(client(&p, "192.0.2.1", one, 1), "192.0.2.1", "an untrusted peer's header");
  const char *chain[] = {"203.0.113.9, 198.51.100.7 ,10.2.2.2"};
  cr_expect_str_eq(client(&p, "10.0.0.1", chain, 1), "198.51.100.7");
  const char *lines[] = {"198.51.100.1", "10.3.3.3, 10.4.4.4"};
  cr_expect_str_eq(client(&p, "10.0.0.1", lines, 2), "198.51.100.1");
  const char *all_trusted[] = {"10.5.5.5, 10.6.6.6"};
  cr_expect_str_eq(client(&p, "10.0.0.1", all_trusted, 1), "10.5.5.5", "the leftmost then");
  cr_expect_str_eq(client(&p, "10.0.0.1", NULL, 0), "10.0.0.1");
  const char *empty[] = {" , ,"};
  cr_expect_str_eq(client(&p, "10.0.0.1", empty, 1), "10.0.0.1");
}

Test(proxy, ports_brackets_and_garbage_in_the_header) {
  attnd_proxies p = parsed("10.0.0.0/8");
  const char *ported[] = {"198.51.100.7:4711"};
  cr_expect_str_eq(client(&p, "10.0.0.1", ported, 1), "198.51.100.7");
  const char *v6[] = {"[2001:db8::5]:443"};
  cr_expect_str_eq(client(&p, "10.0.0.1", v6, 1), "2001:db8::5");
  const char *bare6[] = {"2001:DB8:0:0::6"};
  cr_expect_str_eq(client(&p, "10.0.0.1", bare6, 1), "2001:db8::6", "written canonically");
  const char *mapped[] = {"::ffff:198.51.100.8"};
  cr_expect_str_eq(client(&p, "10.0.0.1", mapped, 1), "198.51.100.8");
  /* left of an entry that is no address, nobody trusted wrote anything */
  const char *junk[] = {"198.51.100.9, <script>, 10.7.7.7"};
  cr_expect_str_eq(client(&p, "10.0.0.1", junk, 1), "10.7.7.7");
  const char *junk_last[] = {"198.51.100.9, unknown"};
  cr_expect_str_eq(client(&p, "10.0.0.1", junk_last, 1), "10.0.0.1");
  const char *spoof[] = {"10.8.8.8\r\nX-Evil: 1"};
  cr_expect_str_eq(client(&p, "10.0.0.1", spoof, 1), "10.0.0.1");
}
