/*
 * test_kvpages.c — the session page pool gives the kernel back host pages
 * free for ATTN_KV_TRIM_AGE_S (attn__kvpages_trim), and only those: a page
 * freed a moment ago keeps its memory (a decode after a truncate takes it
 * again at once), a page free long enough reads zeros once trimmed (its
 * memory went back), at most ATTN_KV_TRIM_BATCH pages a call, and a page
 * taken and written after a trim is counted again when freed again. The
 * clock is the test's: trims are called with the times the test chooses.
 */
#include "kv/pages.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static attn_kvpages pool(int64_t pages) {
  attn_kvpages p;
  attn_status st;
  cr_assert_eq(
      attn__kvpages_open(&p, (uint64_t)pages * ATTN_KV_PAGE_BYTES, ATTN_KV_PAGE_BYTES, NULL, &st),
      0, "%s", st.message);
  cr_assert(attn__kvpages_reserve(&p, pages));
  return p;
}

/* Whether every byte of page is zero. */
static bool zero(const void *page) {
  const unsigned char *b = page;
  for (size_t i = 0; i < ATTN_KV_PAGE_BYTES; i++)
    if (b[i])
      return false;
  return true;
}

Test(kvpages, pages_free_long_enough_go_back) {
  attn_kvpages p = pool(8);
  void *pg[8];
  attn__kvpages_trim(&p, 100);
  for (int i = 0; i < 8; i++) {
    pg[i] = attn__kvpages_take(&p);
    memset(pg[i], 0x5a, ATTN_KV_PAGE_BYTES);
  }
  attn__kvpages_trim(&p, 100.5); /* nothing free: nothing to give */
  cr_expect_eq(p.returned, 0);
  for (int i = 0; i < 4; i++)
    attn__kvpages_give(&p, pg[i]); /* stamped 100.5 */
  attn__kvpages_trim(&p, 101);
  for (int i = 4; i < 8; i++)
    attn__kvpages_give(&p, pg[i]); /* stamped 101 */
  const double age = ATTN_KV_TRIM_AGE_S;
  attn__kvpages_trim(&p, 100.2 + age); /* none free that long yet */
  cr_expect_eq(p.returned, 0);
  for (int i = 0; i < 8; i++)
    cr_expect(!zero(pg[i]), "page %d went back before ATTN_KV_TRIM_AGE_S", i);
  attn__kvpages_trim(&p, 100.6 + age); /* the first four */
  cr_expect_eq(p.returned, 4 * ATTN_KV_PAGE_BYTES);
  for (int i = 0; i < 8; i++)
    cr_expect_eq(zero(pg[i]), i < 4, "page %d", i);
  attn__kvpages_trim(&p, 101.1 + age); /* the rest */
  cr_expect_eq(p.returned, 8 * ATTN_KV_PAGE_BYTES);
  attn__kvpages_trim(&p, 200); /* given back once */
  cr_expect_eq(p.returned, 8 * ATTN_KV_PAGE_BYTES);
  /* taken and written again, then freed: given back again, once it has aged */
  void *a = attn__kvpages_take(&p);
  memset(a, 1, ATTN_KV_PAGE_BYTES);
  attn__kvpages_give(&p, a);
  attn__kvpages_trim(&p, 199.5 + age);
  cr_expect(!zero(a));
  attn__kvpages_trim(&p, 200.5 + age);
  cr_expect(zero(a));
  cr_expect_eq(p.returned, 9 * ATTN_KV_PAGE_BYTES);
  attn__kvpages_close(&p);
}

Test(kvpages, a_trim_gives_at_most_a_batch) {
  const int64_t n = ATTN_KV_TRIM_BATCH + 10;
  attn_kvpages p = pool(n);
  void **pg = malloc((size_t)n * sizeof *pg);
  for (int64_t i = 0; i < n; i++) {
    pg[i] = attn__kvpages_take(&p);
    *(char *)pg[i] = 1;
  }
  for (int64_t i = 0; i < n; i++)
    attn__kvpages_give(&p, pg[i]);
  attn__kvpages_trim(&p, 10);
  cr_expect_eq(p.returned, (uint64_t)ATTN_KV_TRIM_BATCH * ATTN_KV_PAGE_BYTES);
  attn__kvpages_trim(&p, 10.1);
  cr_expect_eq(p.returned, (uint64_t)n * ATTN_KV_PAGE_BYTES);
  free(pg);
  attn__kvpages_close(&p);
}
