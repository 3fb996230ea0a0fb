/*
 * test_bodybuf.c — large bodies' buffers (server/bodybuf.c) on their own:
 * sized and aligned as asked, reused while warm, bounded in number,
 * unmapped once idle, and filled by a copy that is memcpy's bytes. tests/server/test_attention.c
 * sends bodies through them.
 */
#include "bodybuf.h"
#include "engine.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int idle_count(const attnd_bodybufs *c) {
  int n = 0;
  for (int i = 0; i < ATTND_BODYBUF_KEEP; i++)
    n += c->idle[i].base != NULL;
  return n;
}

Test(bodybuf, sized_aligned_and_writable) {
  attnd_bodybufs c;
  attnd_bodybufs_init(&c, NULL);
  size_t n = 3 * ATTND_BODYBUF_MIN + 7;
  char *p = attnd_bodybuf_get(&c, n);
  cr_assert_not_null(p);
  cr_expect_eq((uintptr_t)p % 64, 0, "64-byte aligned");
  memset(p, 0xab, n); /* every byte asked for is there */
  cr_expect_eq((unsigned char)p[n - 1], 0xab);
  attnd_bodybuf_put(&c, p);
  attnd_bodybufs_close(&c);
}

Test(bodybuf, reused_while_warm_then_unmapped) {
  attnd_bodybufs c;
  attnd_bodybufs_init(&c, NULL);
  char *p = attnd_bodybuf_get(&c, 4 * ATTND_BODYBUF_MIN);
  cr_assert_not_null(p);
  p[0] = 42;
  attnd_bodybuf_put(&c, p);
  cr_expect_eq(idle_count(&c), 1);
  char *q = attnd_bodybuf_get(&c, 3 * ATTND_BODYBUF_MIN);
  cr_expect_eq(q, p, "the idle buffer that fits is handed out again");
  cr_expect_eq(idle_count(&c), 0);
  char *big = attnd_bodybuf_get(&c, 64 * ATTND_BODYBUF_MIN);
  cr_expect_neq(big, q, "a buffer in use is never handed out twice");
  attnd_bodybuf_put(&c, q);
  attnd_bodybuf_put(&c, big);
  attnd_bodybufs_trim(&c, attn_now());
  cr_expect_eq(idle_count(&c), 2, "buffers idle less than ATTND_BODYBUF_IDLE stay");
  attnd_bodybufs_trim(&c, attn_now() + ATTND_BODYBUF_IDLE + 1);
  cr_expect_eq(idle_count(&c), 0, "idle past ATTND_BODYBUF_IDLE: unmapped");
  attnd_bodybufs_close(&c);
}

Test(bodybuf, at_most_keep_idle) {
  attnd_bodybufs c;
  attnd_bodybufs_init(&c, NULL);
  char *p[ATTND_BODYBUF_KEEP + 2];
  for (int i = 0; i < ATTND_BODYBUF_KEEP + 2; i++)
    cr_assert_not_null(p[i] = attnd_bodybuf_get(&c, ATTND_BODYBUF_MIN));
  for (int i = 0; i < ATTND_BODYBUF_KEEP + 2; i++)
    attnd_bodybuf_put(&c, p[i]);
  cr_expect_eq(idle_count(&c), ATTND_BODYBUF_KEEP);
  attnd_bodybuf_put(&c, NULL); /* a no-op */
  cr_expect_eq(idle_count(&c), ATTND_BODYBUF_KEEP);
  cr_expect_null(attnd_bodybuf_get(&c, SIZE_MAX), "a size past the address space");
  attnd_bodybufs_close(&c);
}

Test(bodybuf, copy_is_memcpy_at_every_alignment_and_length) {
  enum { N = 4096 };
  static char src[N + 64], dst[N + 128], want[N + 128];
  for (int i = 0; i < N + 64; i++)
    src[i] = (char)(i * 131 + 7);
  const size_t lens[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 1000, N};
  for (int so = 0; so < 17; so++)
    for (int dof = 0; dof < 17; dof++)
      for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
        memset(dst, 0x5a, sizeof dst);
        memset(want, 0x5a, sizeof want);
        memcpy(want + dof, src + so, lens[l]);
        attnd_bodybuf_copy(dst + dof, src + so, lens[l]);
        cr_assert(!memcmp(dst, want, sizeof dst), "src +%d, dst +%d, %zu bytes", so, dof, lens[l]);
      }
}

/* Pages of p[0, n) resident (mincore), rounded to whole pages. */
static size_t resident(const char *p, size_t n) {
  size_t page = 4096, pages = (n + page - 1) / page, in = 0;
  uintptr_t start = (uintptr_t)p & ~(uintptr_t)(page - 1);
  unsigned char *v = malloc(pages + 1);
  cr_assert_eq(mincore((void *)start, pages * page, v), 0);
  for (size_t i = 0; i < pages; i++)
    in += v[i] & 1;
  free(v);
  return in * page;
}

/* Where transparent huge pages are "always", the kernel backs an aligned
 * mapping 2 MiB at a time whatever attnd asks: one huge page more may be
 * resident than the bytes and the prefault account for. */
static size_t thp_slack(void) {
  char mode[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f) {
    if (!fgets(mode, sizeof mode, f))
      mode[0] = 0;
    fclose(f);
  }
  return strstr(mode, "[always]") ? (size_t)2 << 20 : 0;
}

/* A fresh buffer filled in pieces holds the bytes sent, and is faulted in
 * ahead of them by no more than they came to (a stalled upload holds at
 * most twice what it sent) nor than 4 MiB past them. */
Test(bodybuf, fill_copies_and_faults_in_only_a_little_ahead) {
  attnd_bodybufs c;
  attnd_bodybufs_init(&c, NULL);
  size_t n = 64 * ATTND_BODYBUF_MIN;
  char *p = attnd_bodybuf_get(&c, n), piece[61440];
  cr_assert_not_null(p);
  size_t at = 0;
  for (int k = 0; k < 2; k++, at += sizeof piece) {
    for (size_t i = 0; i < sizeof piece; i++)
      piece[i] = (char)((at + i) * 7);
    attnd_bodybuf_fill(p, at, piece, sizeof piece);
  }
  size_t in = resident(p, n);
  cr_expect_leq(in, 2 * at + 3 * 4096 + thp_slack(), "%zu bytes resident after %zu sent", in, at);
  for (; at + sizeof piece <= 24 * ATTND_BODYBUF_MIN; at += sizeof piece) {
    for (size_t i = 0; i < sizeof piece; i++)
      piece[i] = (char)((at + i) * 7);
    attnd_bodybuf_fill(p, at, piece, sizeof piece);
  }
  in = resident(p, n);
  cr_expect_leq(in, at + 4 * ATTND_BODYBUF_MIN + 3 * 4096 + thp_slack(),
                "%zu bytes resident after %zu sent", in, at);
  for (size_t i = 0; i < at; i++)
    if (p[i] != (char)(i * 7))
      cr_assert_fail("byte %zu is %d, sent %d", i, p[i], (char)(i * 7));
  attnd_bodybuf_put(&c, p);
  attnd_bodybufs_close(&c);
}
