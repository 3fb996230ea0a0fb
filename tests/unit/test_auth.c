/*
 * test_auth.c — the API key check (server/auth.c) on its own: the
 * constant-time comparison, the Authorization header, the open probes.
 * tests/server/test_api_key.c drives the key through attnd.
 */
#include "auth.h"

#include <criterion/criterion.h>
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
