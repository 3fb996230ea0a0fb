/*
 * test_auth.c — the API keys (server/auth.c) on their own: the
 * constant-time comparison, the Authorization header matched against several
 * keys, the key file's lines (names, comments, duplicates, bad names and
 * keys), the open probes. tests/server/test_api_key.c drives the keys
 * through attnd.
 */
#include "auth.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(auth, equal_is_equality) {
  cr_expect(attnd_auth_equal("abc", 3, "abc", 3));
  cr_expect(attnd_auth_equal("", 0, "", 0));
  cr_expect(!attnd_auth_equal("abd", 3, "abc", 3), "last byte differs");
  cr_expect(!attnd_auth_equal("xbc", 3, "abc", 3), "first byte differs");
  cr_expect(!attnd_auth_equal("ab", 2, "abc", 3), "a prefix of the key");
  cr_expect(!attnd_auth_equal("abcd", 4, "abc", 3), "the key and more");
  cr_expect(!attnd_auth_equal("ab\0", 3, "ab", 2), "a NUL past the key");
  cr_expect(!attnd_auth_equal("", 0, "abc", 3), "empty against a key");
  /* every single-bit difference at every position */
  char key[33] = "0123456789abcdefghijklmnopqrstuv";
  for (int i = 0; i < 32; i++)
    for (int b = 0; b < 8; b++) {
      char g[33];
      memcpy(g, key, 33);
      g[i] = (char)(g[i] ^ (1 << b));
      cr_expect(!attnd_auth_equal(g, 32, key, 32), "bit %d of byte %d", b, i);
    }
  cr_expect(attnd_auth_equal(key, 32, key, 32));
}

Test(auth, bearer_header) {
  cr_expect(attnd_auth_check("Bearer s3cret", "s3cret"));
  cr_expect(attnd_auth_check("bearer   s3cret  ", "s3cret"), "scheme in any case, spaces");
  cr_expect(attnd_auth_check("BEARER\ts3cret", "s3cret"));
  cr_expect(!attnd_auth_check(NULL, "s3cret"), "no header");
  cr_expect(!attnd_auth_check("s3cret", "s3cret"), "no scheme");
  cr_expect(!attnd_auth_check("Basic s3cret", "s3cret"), "another scheme");
  cr_expect(!attnd_auth_check("Bearers3cret", "s3cret"), "no space after the scheme");
  cr_expect(!attnd_auth_check("Bearer s3cre", "s3cret"));
  cr_expect(!attnd_auth_check("Bearer s3crett", "s3cret"));
  cr_expect(!attnd_auth_check("Bearer ", "s3cret"));
}

Test(auth, open_routes) {
  cr_expect(attnd_auth_open("/healthz"));
  cr_expect(attnd_auth_open("/readyz"));
  cr_expect(attnd_auth_open("/v2/health/live"));
  cr_expect(attnd_auth_open("/v2/health/ready"));
  cr_expect(!attnd_auth_open("/attention"));
  cr_expect(!attnd_auth_open("/metrics"));
  cr_expect(!attnd_auth_open("/v1/info"));
  cr_expect(!attnd_auth_open("/healthz/"));
  cr_expect(!attnd_auth_open("/v2"));
}

/* ---- several keys --------------------------------------------------------- */

static attnd_keys KS;

/* Parses text into KS; the message (when refused) into err. */
static int parse(const char *text, char *err, size_t cap) {
  err[0] = 0;
  return attnd_keys_parse(&KS, text, strlen(text), err, cap);
}

Test(auth, match_finds_the_key_among_several) {
  char err[512];
  cr_assert_eq(parse("alice:k-alice-1\nbob:k-bob-22\nk-carol-333\n", err, sizeof err), 0, "%s",
               err);
  cr_expect_eq(attnd_auth_match("Bearer k-alice-1", &KS), 0);
  cr_expect_eq(attnd_auth_match("Bearer k-bob-22", &KS), 1);
  cr_expect_eq(attnd_auth_match("bearer  k-carol-333 ", &KS), 2);
  cr_expect_eq(attnd_auth_match("Bearer k-dave-4444", &KS), -1, "a third string");
  cr_expect_eq(attnd_auth_match("Bearer k-alice-", &KS), -1, "a prefix of a key");
  cr_expect_eq(attnd_auth_match("Bearer k-alice-1k-bob-22", &KS), -1, "two keys run together");
  cr_expect_eq(attnd_auth_match("Bearer alice", &KS), -1, "a name is not a key");
  cr_expect_eq(attnd_auth_match("Basic k-alice-1", &KS), -1);
  cr_expect_eq(attnd_auth_match("Bearer ", &KS), -1);
  cr_expect_eq(attnd_auth_match(NULL, &KS), -1);
  attnd_keys none = {.n = 0};
  cr_expect_eq(attnd_auth_match("Bearer k-alice-1", &none), -1);
}

Test(auth, key_file_names_comments_and_blanks) {
  char err[512];
  const char *text = "# the tenants\n"
                     "\n"
                     "  alice:sk-a:with:colons  \r\n"
                     "sk-unnamed-one\n"
                     "   # indented comment\n"
                     "\t\n"
                     "bob.ops_2-x : sk-b\n"
                     "sk-unnamed-two"; /* no newline at the end */
  cr_assert_eq(parse(text, err, sizeof err), 0, "%s", err);
  cr_assert_eq(KS.n, 4);
  const char *names[] = {"alice", "key1", "bob.ops_2-x", "key2"};
  const char *keys[] = {"sk-a:with:colons", "sk-unnamed-one", "sk-b", "sk-unnamed-two"};
  for (int i = 0; i < 4; i++) {
    cr_expect_str_eq(KS.k[i].name, names[i], "key %d", i);
    cr_expect_str_eq(KS.k[i].key, keys[i], "key %d", i);
    cr_expect_eq(KS.k[i].len, strlen(keys[i]), "key %d", i);
  }
  /* the old format, one key and a newline, is one key named key1 */
  cr_assert_eq(parse("s3cret\n", err, sizeof err), 0, "%s", err);
  cr_expect(KS.n == 1 && !strcmp(KS.k[0].name, "key1") && !strcmp(KS.k[0].key, "s3cret"));
  char name63[80];
  memset(name63, 'n', 63);
  snprintf(name63 + 63, sizeof name63 - 63, ":k");
  cr_expect_eq(parse(name63, err, sizeof err), 0, "a name of 63: %s", err);
}

/* Expects text refused with a message that holds each of want (NULL-ended)
 * and never the secret. */
static void expect_refused(const char *text, const char *secret, const char *const *want) {
  char err[512];
  cr_expect_eq(parse(text, err, sizeof err), -1, "accepted: %s", text);
  for (int i = 0; want[i]; i++)
    cr_expect(strstr(err, want[i]), "\"%s\" not in the message: %s", want[i], err);
  if (secret)
    cr_expect(!strstr(err, secret), "the key in the message: %s", err);
}

Test(auth, key_file_duplicates_are_refused_naming_the_line) {
  expect_refused("alice:sk-1\n# c\nalice:sk-2\n", "sk-",
                 (const char *[]){"line 3", "\"alice\"", "line 1", NULL});
  expect_refused("alice:sk-same\nbob:sk-same\n", "sk-same",
                 (const char *[]){"line 2", "\"bob\"", "\"alice\"", "same", "line 1", NULL});
  expect_refused("sk-same\nsk-same\n", "sk-same", (const char *[]){"line 2", "line 1", NULL});
  /* a name given on a line meets the name a later unnamed line is given */
  expect_refused("key2:sk-x\nsk-y\nsk-z\n", "sk-",
                 (const char *[]){"line 3", "\"key2\"", "line 1", "name this key", NULL});
}

Test(auth, key_file_bad_names_and_keys_are_refused) {
  const char *const bad_name[] = {"line 1", "name", NULL};
  expect_refused(":sk-no-name\n", "sk-no-name", bad_name);
  expect_refused("al ice:sk-1\n", "sk-1", bad_name);
  expect_refused("al/ice:sk-1\n", "sk-1", bad_name);
  expect_refused("s3cr$t:part\n", "s3cr$t", bad_name); /* what is before ':' is not shown */
  char name64[80];
  memset(name64, 'n', 64);
  snprintf(name64 + 64, sizeof name64 - 64, ":k");
  expect_refused(name64, NULL, bad_name);
  const char *const bad_key[] = {"line 2", "key", "not shown", NULL};
  expect_refused("ok:sk-1\nalice:\n", NULL, bad_key);
  expect_refused("ok:sk-1\nalice:two words\n", "two words", bad_key);
  expect_refused("ok:sk-1\nsk two\n", "sk two", bad_key);
  char long_key[300];
  memset(long_key, 'x', 256);
  long_key[256] = 0;
  expect_refused(long_key, NULL, (const char *[]){"line 1", "255", NULL});
  long_key[255] = 0;
  char err[512];
  cr_expect_eq(parse(long_key, err, sizeof err), 0, "a key of 255: %s", err);
}

Test(auth, key_file_without_keys_or_with_too_many) {
  const char *const none[] = {"no key", NULL};
  expect_refused("", NULL, none);
  expect_refused("\n  \n# only a comment\n", NULL, none);
  char text[ATTND_MAX_KEYS * 16 + 32] = "";
  size_t n = 0;
  for (int i = 0; i <= ATTND_MAX_KEYS; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "sk-%d\n", i);
  char want[32];
  snprintf(want, sizeof want, "line %d", ATTND_MAX_KEYS + 1);
  expect_refused(text, NULL, (const char *[]){want, "more than 64", NULL});
  char err[512];
  text[strlen(text) - strlen("sk-64\n")] = 0;
  cr_expect_eq(parse(text, err, sizeof err), 0, "%d keys: %s", ATTND_MAX_KEYS, err);
  cr_expect_eq(KS.n, ATTND_MAX_KEYS);
  cr_expect_eq(attnd_keys_parse(&KS, "a\0b\n", 4, err, sizeof err), -1, "a NUL byte");
  cr_expect(strstr(err, "NUL"), "%s", err);
}

Test(auth, add_one_key) {
  attnd_keys ks = {.n = 0};
  char err[256];
  int dup;
  cr_expect_eq(attnd_keys_add(&ks, "default", "k3y", 3, &dup, err, sizeof err), 0, "%s", err);
  cr_expect_eq(attnd_keys_add(&ks, "other", "k3y", 3, &dup, err, sizeof err), -1);
  cr_expect_eq(dup, 0);
  cr_expect_eq(attnd_keys_add(&ks, "bad name", "k4y", 3, &dup, err, sizeof err), -1);
  cr_expect_eq(dup, -1);
  cr_expect(attnd_key_name_valid("a.b_c-D9", 8));
  cr_expect(!attnd_key_name_valid("", 0));
  cr_expect(!attnd_key_name_valid("a:b", 3));
  cr_expect(attnd_key_valid("~!x", 3));
  cr_expect(!attnd_key_valid("a\x7f", 2));
}
