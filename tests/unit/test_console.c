/*
 * test_console.c — the web console's table and its If-None-Match check
 * (server/console.h), without a server.
 */
#include "console.h"

#include <criterion/criterion.h>
#include <string.h>

Test(console, every_file_is_found_with_its_type_and_a_strong_etag) {
  static const char *const want[][2] = {{"/", "text/html"},
                                        {"/console/console.js", "text/javascript"},
                                        {"/console/console_plan.js", "text/javascript"},
                                        {"/console/console_live.js", "text/javascript"},
                                        {"/console/console.css", "text/css"}};
  cr_expect_eq(attnd_console_n_assets, 5);
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    const attnd_console_asset *a = attnd_console_find(want[i][0]);
    cr_assert(a, "%s not found", want[i][0]);
    cr_expect(!strncmp(a->type, want[i][1], strlen(want[i][1])), "%s is %s", a->path, a->type);
    cr_expect_gt(a->len, 100);
    cr_expect_eq(a->data[a->len], 0, "the generator ends each file with a NUL past its length");
    cr_expect_eq(strlen(a->etag), 18, "%s: ETag %s", a->path, a->etag);
    cr_expect(a->etag[0] == '"' && a->etag[17] == '"');
  }
  cr_expect_str_neq(attnd_console_find("/")->etag, attnd_console_find("/console/console.js")->etag);
  cr_expect_null(attnd_console_find("/index.html"));
  cr_expect_null(attnd_console_find("/console/"));
  cr_expect_null(attnd_console_find(""));
}

Test(console, if_none_match_lists_and_weak_tags) {
  const char *e = "\"0123456789abcdef\"";
  cr_expect(!attnd_console_not_modified(NULL, e));
  cr_expect(!attnd_console_not_modified("", e));
  cr_expect(attnd_console_not_modified("\"0123456789abcdef\"", e));
  cr_expect(attnd_console_not_modified("W/\"0123456789abcdef\"", e), "compared weakly");
  cr_expect(attnd_console_not_modified("\"x\", \"0123456789abcdef\" ", e));
  cr_expect(attnd_console_not_modified(" * ", e));
  cr_expect(!attnd_console_not_modified("\"0123456789abcde\"", e));
  cr_expect(!attnd_console_not_modified("\"0123456789abcdef0\"", e));
  cr_expect(!attnd_console_not_modified("0123456789abcdef", e), "unquoted is another tag");
  cr_expect(!attnd_console_not_modified("\"x\", W/\"y\"", e));
  cr_expect(!attnd_console_not_modified("\"0123456789abcdef", e), "an unclosed quote");
}
