/*
 * test_reqid.c — request ids (server/reqid.c) on their own: which ids a
 * client may send, and that made ones are unique and valid.
 * tests/server/test_request_ids.c checks them echoed and logged by attnd.
 */
#include "reqid.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(reqid, valid_ids) {
  cr_expect(attnd_reqid_valid("abc-123"));
  cr_expect(attnd_reqid_valid("3f2a9c1e-7b4d-4e8a-9f00-0123456789ab"));
  char longest[ATTND_REQID_MAX + 2];
  memset(longest, 'a', sizeof longest);
  longest[ATTND_REQID_MAX] = 0;
  cr_expect(attnd_reqid_valid(longest));
  longest[ATTND_REQID_MAX] = 'a';
  longest[ATTND_REQID_MAX + 1] = 0;
  cr_expect(!attnd_reqid_valid(longest), "one past the limit");
  cr_expect(!attnd_reqid_valid(NULL));
  cr_expect(!attnd_reqid_valid(""));
  cr_expect(!attnd_reqid_valid("a b"));
  cr_expect(!attnd_reqid_valid("a\nb"));
  cr_expect(!attnd_reqid_valid("a\"b"));
  cr_expect(!attnd_reqid_valid("a\\b"));
  cr_expect(!attnd_reqid_valid("caf\xc3\xa9"));
}

Test(reqid, made_ids_are_unique_and_valid) {
  attnd_reqid_gen g;
  attnd_reqid_init(&g);
  enum { N = 2000 };
  static char ids[N][33];
  for (int i = 0; i < N; i++) {
    attnd_reqid_make(&g, ids[i]);
    cr_assert_eq(strlen(ids[i]), 32);
    cr_assert(attnd_reqid_valid(ids[i]));
    cr_assert_eq(strspn(ids[i], "0123456789abcdef"), 32, "%s", ids[i]);
  }
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      cr_assert(strcmp(ids[i], ids[j]), "ids %d and %d repeat: %s", i, j, ids[i]);
}
