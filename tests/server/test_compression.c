/*
 * test_compression.c — gzip and deflate request bodies through the real
 * attnd (/attention, backward and /v2 infer; corrupt, truncated and unknown
 * codings refused) and the gzip bomb that must stop at --max-body without
 * the memory decoding it whole would take.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <zlib.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(compression, .fini = teardown, .timeout = 120);

#define JSON_CT "Content-Type: application/json"
#define ST_CT "Content-Type: application/octet-stream"

static unsigned char *pack(const void *data, size_t n, int wbits, size_t *out_len) {
  z_stream z;
  memset(&z, 0, sizeof z);
  cr_assert_eq(deflateInit2(&z, 9, Z_DEFLATED, wbits, 9, Z_DEFAULT_STRATEGY), Z_OK);
  size_t cap = deflateBound(&z, n) + 64;
  unsigned char *out = malloc(cap);
  z.next_out = out;
  z.avail_out = (uInt)cap;
  const unsigned char *in = data;
  size_t left = n;
  int rc;
  do { /* avail_in is 32 bits: step through large inputs */
    size_t step = left > (1u << 30) ? (1u << 30) : left;
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)step;
    in += step;
    left -= step;
    rc = deflate(&z, left ? Z_NO_FLUSH : Z_FINISH);
  } while (left);
  cr_assert_eq(rc, Z_STREAM_END);
  *out_len = cap - z.avail_out;
  deflateEnd(&z);
  return out;
}

Test(compression, gzip_and_deflate_bodies) {
  srv_start(&S, NULL);
  tprob p = tprob_make(1, 2, 1, 21, 19, 32, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 31);
  size_t jl, sl, zn;
  char *jb = json_body(&c, 3, NULL, &jl), *sb = st_body(&c, 3, NULL, &sl);
  const struct {
    int wbits;
    const char *enc;
    bool st;
  } cases[] = {{31, "gzip", false},
               {31, "x-gzip", true},
               {15, "deflate", false},
               {15, "Deflate", true},
               {-15, "deflate", false}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    unsigned char *z = pack(cases[i].st ? sb : jb, cases[i].st ? sl : jl, cases[i].wbits, &zn);
    char ce[64], what[96];
    snprintf(ce, sizeof ce, "Content-Encoding: %s", cases[i].enc);
    snprintf(what, sizeof what, "%s (wbits %d)", ce, cases[i].wbits);
    const char *h[] = {cases[i].st ? ST_CT : JSON_CT, ce, NULL};
    http_res r;
    http_call(&S, "POST", "/attention", h, z, zn, &r);
    expect_correct(&r, &c, 3, cases[i].st, what);
    http_res_free(&r);
    free(z);
  }
  free(sb);
  tcase_free(&c);

  /* /attention/backward decodes too: a body without o and do reaches the
   * backward codec, which names what is missing */
  unsigned char *z = pack(jb, jl, 31, &zn);
  const char *hg[] = {JSON_CT, "Content-Encoding: gzip", NULL};
  http_res r;
  http_call(&S, "POST", "/attention/backward", hg, z, zn, &r);
  expect_error(&r, 422, "missing_tensor", "gzip backward without o and do");
  http_res_free(&r);

  /* corrupt, truncated, not compressed, unknown coding */
  z[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/attention", hg, z, zn, &r);
  expect_error(&r, 400, "bad_request", "corrupt gzip");
  cr_expect(strstr(r.body, "gzip"), "%s", r.body);
  http_res_free(&r);
  z[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/attention", hg, z, zn - 9, &r);
  expect_error(&r, 400, "bad_request", "truncated gzip");
  http_res_free(&r);
  http_call(&S, "POST", "/attention", hg, jb, jl, &r);
  expect_error(&r, 400, "bad_request", "plain JSON sent as gzip");
  http_res_free(&r);
  /* /v2 infer too, with the protocol's error shape when the coding is bad */
  static const char v2[] =
      "{\"inputs\": [{\"name\": \"q\", \"shape\": [2, 2], \"datatype\": "
      "\"FP32\", \"data\": [1, 0, 0, 1]}, {\"name\": \"k\", \"shape\": [2, 2], "
      "\"datatype\": \"FP32\", \"data\": [1, 0, 0, 1]}, {\"name\": \"v\", "
      "\"shape\": [2, 2], \"datatype\": \"FP32\", \"data\": [1, 2, 3, 4]}]}";
  unsigned char *zv = pack(v2, sizeof v2 - 1, 31, &zn);
  http_call(&S, "POST", "/v2/models/attention/infer", hg, zv, zn, &r);
  cr_expect_eq(r.status, 200, "gzip /v2 infer: %ld %s", r.status, r.body);
  cr_expect(r.body && strstr(r.body, "\"model_name\""), "gzip /v2 infer: %s", r.body);
  http_res_free(&r);
  zv[zn / 2] ^= 0x5a;
  http_call(&S, "POST", "/v2/models/attention/infer", hg, zv, zn, &r);
  cr_expect_eq(r.status, 400, "corrupt gzip /v2 infer: %ld %s", r.status, r.body);
  cr_expect(r.body && !strncmp(r.body, "{\"error\": \"", 11), "not the protocol's shape: %s",
            r.body);
  http_res_free(&r);
  free(zv);
  const char *hb[] = {JSON_CT, "Content-Encoding: br", NULL};
  http_call(&S, "POST", "/attention", hb, jb, jl, &r);
  expect_error(&r, 415, "unsupported_media_type", "Content-Encoding: br");
  http_res_free(&r);
  free(z);
  free(jb);
  cr_expect(expect_healthy(&S, "bad encodings"));
}

/* The peak resident memory of pid in bytes (VmHWM), or -1. */
static long long peak_rss(pid_t pid) {
  char path[64], *s;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  if (!(s = read_file_all(path, NULL)))
    return -1;
  const char *p = strstr(s, "VmHWM:");
  long long kb = p ? atoll(p + 6) : -1;
  free(s);
  return kb < 0 ? -1 : kb * 1024;
}

/* 512 MiB of zeros in about 0.5 MiB of gzip, against --max-body 4M: refused
 * with 413 once 4 MiB are decoded, and the server's peak memory stays far
 * below what decoding it whole would take. */
Test(compression, gzip_bomb_is_413_not_memory) {
  srv_start(&S, "--max-body", "4M", "--threads", "1", NULL);
  size_t big = (size_t)512 << 20, zn;
  char *zeros = calloc(1, big);
  cr_assert(zeros);
  unsigned char *z = pack(zeros, big, 31, &zn);
  free(zeros);
  cr_assert_lt(zn, (size_t)4 << 20, "the bomb must fit --max-body: %zu", zn);
  long long before = peak_rss(S.pid);
  cr_assert_gt(before, 0);
  const char *h[] = {JSON_CT, "Content-Encoding: gzip", NULL};
  for (int i = 0; i < 3; i++) {
    http_res r;
    http_call(&S, "POST", "/attention", h, z, zn, &r);
    expect_error(&r, 413, "too_large", "gzip bomb");
    cr_expect(strstr(r.body, "--max-body"), "%s", r.body);
    http_res_free(&r);
  }
  const char *hd[] = {ST_CT, "Content-Encoding: gzip", NULL};
  http_res r;
  http_call(&S, "POST", "/attention/backward", hd, z, zn, &r);
  expect_error(&r, 413, "too_large", "gzip bomb on backward");
  http_res_free(&r);
  long long after = peak_rss(S.pid);
  cr_expect_lt(after - before, 64ll << 20, "peak RSS grew by %lld bytes (from %lld)",
               after - before, before);
  free(z);
  cr_expect(expect_healthy(&S, "gzip bombs"));
}
