/*
 * test_inflate.c — bounded gzip/deflate decoding (server/inflate.c) on its
 * own: zip bombs, corrupt and truncated data, the memory budget.
 * tests/server/test_compression.c drives compressed bodies through attnd.
 */
#include "errors.h"
#include "inflate.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

Test(inflate, encoding_names) {
  cr_expect_eq(attnd_encoding_of(NULL), ATTND_ENC_IDENTITY);
  cr_expect_eq(attnd_encoding_of("identity"), ATTND_ENC_IDENTITY);
  cr_expect_eq(attnd_encoding_of(" GZip "), ATTND_ENC_GZIP);
  cr_expect_eq(attnd_encoding_of("x-gzip"), ATTND_ENC_GZIP);
  cr_expect_eq(attnd_encoding_of("deflate"), ATTND_ENC_DEFLATE);
  cr_expect_eq(attnd_encoding_of("br"), ATTND_ENC_UNKNOWN);
  cr_expect_eq(attnd_encoding_of("gzip, deflate"), ATTND_ENC_UNKNOWN);
  cr_expect_eq(attnd_encoding_of(""), ATTND_ENC_UNKNOWN);
}

/* data compressed as gzip (wbits 31), zlib (15) or raw deflate (-15). */
static unsigned char *pack(const void *data, size_t n, int wbits, size_t *out_len) {
  z_stream z;
  memset(&z, 0, sizeof z);
  cr_assert_eq(deflateInit2(&z, 6, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&z, n) + 64;
  unsigned char *out = malloc(cap);
  z.next_in = (Bytef *)(uintptr_t)data;
  z.avail_in = (uInt)n;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
  *out_len = cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

typedef struct budget {
  size_t left, asked;
} budget;

static bool take(void *ctx, size_t more) {
  budget *b = ctx;
  b->asked += more;
  if (more > b->left)
    return false;
  b->left -= more;
  return true;
}

static int run(attnd_encoding enc, const void *in, size_t n, size_t max, budget *b, char **out,
               size_t *out_len, char *msg) {
  return attnd_inflate(enc, in, n, max, take, b, out, out_len, msg, 256);
}

static char *sample(size_t n) {
  char *d = malloc(n);
  for (size_t i = 0; i < n; i++)
    d[i] = (char)('a' + (i * 7 + i / 13) % 26);
  return d;
}

Test(inflate, each_format_round_trips) {
  const int wbits[] = {31, 15, -15};
  const attnd_encoding enc[] = {ATTND_ENC_GZIP, ATTND_ENC_DEFLATE, ATTND_ENC_DEFLATE};
  const size_t sizes[] = {0, 1, 1000, 300000};
  for (int f = 0; f < 3; f++)
    for (int s = 0; s < 4; s++) {
      char *d = sample(sizes[s]);
      size_t zn;
      unsigned char *z = pack(d, sizes[s], wbits[f], &zn);
      budget b = {SIZE_MAX, 0};
      char *out, msg[256];
      size_t n;
      int e = run(enc[f], z, zn, 1 << 20, &b, &out, &n, msg);
      cr_expect_eq(e, 0, "wbits %d, %zu bytes: %s", wbits[f], sizes[s], e ? msg : "");
      cr_expect_eq(n, sizes[s]);
      cr_expect(!e && !memcmp(out, d, sizes[s]), "wbits %d, %zu bytes: contents", wbits[f],
                sizes[s]);
      free(out);
      free(z);
      free(d);
    }
}

Test(inflate, concatenated_gzip_members) {
  size_t n1, n2;
  unsigned char *a = pack("hello ", 6, 31, &n1), *b2 = pack("world", 5, 31, &n2);
  unsigned char *both = malloc(n1 + n2);
  memcpy(both, a, n1);
  memcpy(both + n1, b2, n2);
  budget b = {SIZE_MAX, 0};
  char *out, msg[256];
  size_t n;
  cr_assert_eq(run(ATTND_ENC_GZIP, both, n1 + n2, 100, &b, &out, &n, msg), 0, "%s", msg);
  cr_expect_eq(n, 11);
  cr_expect(!memcmp(out, "hello world", 11));
  free(out);
  free(both);
  free(a);
  free(b2);
}

/* A bomb stops at max: it asks the budget for max + 1 bytes at most,
 * whatever it would decode to. */
Test(inflate, bomb_stops_at_the_limit) {
  size_t big = (size_t)64 << 20, zn;
  char *zeros = calloc(1, big);
  unsigned char *z = pack(zeros, big, 31, &zn);
  free(zeros);
  cr_assert_lt(zn, (size_t)1 << 20, "a bomb: %zu bytes", zn);
  const size_t maxes[] = {1000, 65536, 65537, (size_t)3 << 20};
  for (int i = 0; i < 4; i++) {
    budget b = {SIZE_MAX, 0};
    char *out, msg[256];
    size_t n;
    int e = run(ATTND_ENC_GZIP, z, zn, maxes[i], &b, &out, &n, msg);
    cr_expect_eq(e, ATTND_ETOO_LARGE, "max %zu: %d %s", maxes[i], e, msg);
    cr_expect_leq(b.asked, maxes[i] + 1, "max %zu: the budget was asked for %zu", maxes[i],
                  b.asked);
    cr_expect(strstr(msg, "--max-body"), "%s", msg);
    cr_expect_null(out);
  }
  free(z);
}

Test(inflate, exactly_the_limit_fits) {
  char *d = sample(70000);
  size_t zn;
  unsigned char *z = pack(d, 70000, 31, &zn);
  budget b = {SIZE_MAX, 0};
  char *out, msg[256];
  size_t n;
  cr_expect_eq(run(ATTND_ENC_GZIP, z, zn, 70000, &b, &out, &n, msg), 0, "%s", msg);
  cr_expect_eq(n, 70000);
  free(out);
  cr_expect_eq(run(ATTND_ENC_GZIP, z, zn, 69999, &b, &out, &n, msg), ATTND_ETOO_LARGE);
  free(z);
  free(d);
}

Test(inflate, budget_refusal) {
  char *d = sample(300000);
  size_t zn;
  unsigned char *z = pack(d, 300000, 31, &zn);
  budget b = {100000, 0};
  char *out, msg[256];
  size_t n;
  cr_expect_eq(run(ATTND_ENC_GZIP, z, zn, 1 << 20, &b, &out, &n, msg), ATTND_EQUEUE_FULL);
  cr_expect_null(out);
  free(z);
  free(d);
}

Test(inflate, corrupt_truncated_and_trailing) {
  char *d = sample(5000);
  size_t zn;
  unsigned char *z = pack(d, 5000, 31, &zn);
  budget b = {SIZE_MAX, 0};
  char *out, msg[256];
  size_t n;
  /* truncated anywhere: never a success */
  for (size_t cut = 0; cut < zn; cut += (cut < 20 ? 1 : 97)) {
    cr_expect_eq(run(ATTND_ENC_GZIP, z, cut, 1 << 20, &b, &out, &n, msg), ATTND_EBAD_REQUEST,
                 "cut at %zu of %zu", cut, zn);
    cr_expect_null(out);
  }
  /* a flipped byte in the data or the CRC */
  unsigned char *bad = malloc(zn + 3);
  memcpy(bad, z, zn);
  bad[zn - 6] ^= 0x55;
  cr_expect_eq(run(ATTND_ENC_GZIP, bad, zn, 1 << 20, &b, &out, &n, msg), ATTND_EBAD_REQUEST);
  /* valid data followed by other bytes */
  memcpy(bad, z, zn);
  memcpy(bad + zn, "xyz", 3);
  cr_expect_eq(run(ATTND_ENC_GZIP, bad, zn + 3, 1 << 20, &b, &out, &n, msg), ATTND_EBAD_REQUEST);
  cr_expect(strstr(msg, "gzip"), "%s", msg);
  /* not compressed at all */
  cr_expect_eq(run(ATTND_ENC_GZIP, "{\"q\": 1}", 8, 1 << 20, &b, &out, &n, msg),
               ATTND_EBAD_REQUEST);
  cr_expect_eq(run(ATTND_ENC_DEFLATE, "{\"q\": 1}", 8, 1 << 20, &b, &out, &n, msg),
               ATTND_EBAD_REQUEST);
  free(bad);
  free(z);
  free(d);
}
