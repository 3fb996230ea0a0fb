/*
 * test_safetensors.c — the safetensors codec: files written here decode to
 * the request they describe (in place when aligned), run, and encode back;
 * options come from __metadata__ over the query's; and every way a file can
 * be broken is refused with its own code and a message naming the spot.
 */
#include "helpers.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small writer ------------------------------------------------------ */

typedef struct wtensor {
  const char *name, *dtype;
  int rank;
  int64_t shape[4];
  const void *data;
  size_t nbytes;
} wtensor;

static void put_le64(unsigned char *p, uint64_t n) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(n >> (8 * i));
}

/* 8-byte length, hdr padded with spaces to a multiple of 8, then data. The
 * result is malloc'd, so 8 + N + an offset that is a multiple of 4 is an
 * aligned address. */
static unsigned char *raw_file(const char *hdr, size_t hlen, const void *data, size_t dlen,
                               size_t *plen) {
  size_t padded = (hlen + 7) & ~(size_t)7;
  unsigned char *b = malloc(8 + padded + dlen + 1);
  cr_assert(b);
  put_le64(b, padded);
  memcpy(b + 8, hdr, hlen);
  memset(b + 8 + hlen, ' ', padded - hlen);
  if (dlen)
    memcpy(b + 8 + padded, data, dlen);
  *plen = 8 + padded + dlen;
  return b;
}

/* A file of the tensors given, contiguous in that order; meta is the text
 * of the __metadata__ object or NULL. */
static unsigned char *write_file(const wtensor *t, int n, const char *meta, size_t *plen) {
  char hdr[4096];
  size_t o = (size_t)snprintf(hdr, sizeof hdr, "{");
  size_t off = 0, total = 0;
  for (int i = 0; i < n; i++)
    total += t[i].nbytes;
  unsigned char *data = malloc(total + 1);
  cr_assert(data);
  for (int i = 0; i < n; i++) {
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                          i ? "," : "", t[i].name, t[i].dtype);
    for (int d = 0; d < t[i].rank; d++)
      o +=
          (size_t)snprintf(hdr + o, sizeof hdr - o, d ? ",%lld" : "%lld", (long long)t[i].shape[d]);
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, "],\"data_offsets\":[%zu,%zu]}", off,
                          off + t[i].nbytes);
    memcpy(data + off, t[i].data, t[i].nbytes);
    off += t[i].nbytes;
  }
  if (meta)
    o += (size_t)snprintf(hdr + o, sizeof hdr - o, ",\"__metadata__\":%s", meta);
  o += (size_t)snprintf(hdr + o, sizeof hdr - o, "}");
  cr_assert(o < sizeof hdr);
  unsigned char *b = raw_file(hdr, o, data, total, plen);
  free(data);
  return b;
}

/* ---- round trips ------------------------------------------------------- */

static size_t shape_count(const int64_t *s, int rank) {
  size_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= (size_t)s[i];
  return n;
}

/* Reads an encoded reply back: checks the length, padding and one tensor's
 * entry, and returns its bytes. */
/* The reply as parts (attn_proto_encode_safetensors_parts) is the same
 * bytes as the whole reply, with every tensor byte read from pr's outputs
 * where the engine wrote them, not copied. */
static void expect_parts_same(const attn_proto_req *pr, const void *whole, size_t len) {
  void *head;
  size_t hlen, at;
  attn_proto_part parts[ATTN_PROTO_MAX_PARTS];
  int n;
  attn_status st;
  cr_assert_eq(attn_proto_encode_safetensors_parts(pr, &head, &hlen, parts, &n, &st), 0, "%s",
               st.message);
  cr_assert(n >= 1 && n <= ATTN_PROTO_MAX_PARTS);
  cr_expect(hlen <= len && !memcmp(head, whole, hlen), "the heads differ");
  at = hlen;
  for (int i = 0; i < n; i++) {
    const char *p = parts[i].data, *out = pr->out;
    cr_expect(p >= out && p < out + len, "part %d is not in pr->out", i);
    cr_expect(at + parts[i].len <= len && !memcmp(p, (const char *)whole + at, parts[i].len),
              "part %d differs", i);
    at += parts[i].len;
  }
  cr_expect_eq(at, len, "the parts add up to %zu bytes, the reply is %zu", at, len);
  free(head);
}

static const unsigned char *read_entry(const unsigned char *buf, size_t len, const char *name,
                                       const char *dtype, const int64_t *shape, int rank,
                                       size_t *pbytes) {
  cr_assert(len >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)buf[i] << (8 * i);
  cr_assert((8 + n) % 8 == 0, "8 + N = %llu is not a multiple of 8", (unsigned long long)(8 + n));
  cr_assert(8 + n <= len);
  cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)n);
  cr_assert(root && cJSON_IsObject(root), "the reply's header is not a JSON object");
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, name);
  cr_assert(cJSON_IsObject(e), "the reply lacks \"%s\"", name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  cr_assert(cJSON_IsString(dt));
  cr_expect_str_eq(dt->valuestring, dtype);
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
  cr_assert_eq(cJSON_GetArraySize(sh), rank, "\"%s\" has the wrong rank", name);
  for (int i = 0; i < rank; i++)
    cr_expect_eq(cJSON_GetArrayItem(sh, i)->valuedouble, (double)shape[i]);
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  cr_assert_eq(cJSON_GetArraySize(off), 2);
  size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
  size_t en = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
  cJSON_Delete(root);
  cr_assert(b <= en && 8 + n + en <= len, "\"%s\" at [%zu, %zu] past the reply", name, b, en);
  *pbytes = en - b;
  return buf + 8 + n + b;
}

typedef struct rt_case {
  attn_dtype dt;
  int rank;
  int64_t sq[4], skv[4];
  bool stats;
} rt_case;

static void round_trip(const rt_case *rc, attn_engine *e) {
  int64_t q4[4] = {1, 1, 1, 1}, k4[4] = {1, 1, 1, 1};
  /* [N, D] and [H, N, D] are [B, H, N, D] with leading ones */
  for (int i = 0; i < rc->rank; i++) {
    q4[4 - rc->rank + i] = rc->sq[i];
    k4[4 - rc->rank + i] = rc->skv[i];
  }
  tprob p = tprob_make(q4[0], q4[1], k4[1], q4[2], k4[2], q4[3], rc->dt);
  p.stats = rc->stats;
  tcase c;
  tcase_init(&c, &p, 42 + (uint64_t)rc->rank);
  size_t es = attn_dtype_size(rc->dt);
  size_t qb = shape_count(rc->sq, rc->rank) * es, kb = shape_count(rc->skv, rc->rank) * es;
  const char *dn = attn_dtype_name(rc->dt);
  wtensor t[3] = {
      {"q", dn, rc->rank, {0}, c.q, qb},
      {"k", dn, rc->rank, {0}, c.k, kb},
      {"v", dn, rc->rank, {0}, c.v, kb},
  };
  for (int i = 0; i < rc->rank; i++) {
    t[0].shape[i] = rc->sq[i];
    t[1].shape[i] = t[2].shape[i] = rc->skv[i];
  }
  size_t len;
  unsigned char *body = write_file(t, 3, rc->stats ? "{\"stats\":\"true\"}" : NULL, &len);

  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(body, len, NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.rank, rc->rank);
  cr_expect_eq(pr.req.dtype, rc->dt);
  cr_expect_eq(pr.req.batch, q4[0]);
  cr_expect_eq(pr.req.heads_q, q4[1]);
  cr_expect_eq(pr.req.heads_kv, k4[1]);
  cr_expect_eq(pr.req.seq_q, q4[2]);
  cr_expect_eq(pr.req.seq_kv, k4[2]);
  cr_expect_eq(pr.req.head_dim, q4[3]);
  for (int i = 0; i < rc->rank; i++)
    cr_expect_eq(pr.shape_q[i], rc->sq[i]);
  cr_expect_eq(pr.opts.stats, rc->stats);
  cr_expect(memcmp(pr.req.q, c.q, qb) == 0);
  cr_expect(memcmp(pr.req.k, c.k, kb) == 0);
  cr_expect(memcmp(pr.req.v, c.v, kb) == 0);
  /* the writer's body is aligned: every tensor is read in place */
  const unsigned char *lo = body, *hi = body + len;
  cr_expect((const unsigned char *)pr.req.q >= lo && (const unsigned char *)pr.req.q < hi);
  cr_expect((const unsigned char *)pr.req.v >= lo && (const unsigned char *)pr.req.v < hi);
  cr_expect(!pr.owned[0] && !pr.owned[1] && !pr.owned[2]);

  cr_assert_eq(attn_engine_run(e, &pr.req, NULL, &st), 0, "%s", st.message);
  size_t rows = (size_t)(q4[0] * q4[1] * q4[2]);
  memcpy(c.o, pr.req.o, qb);
  if (rc->stats) {
    cr_assert(pr.req.m && pr.req.l && pr.req.lse);
    memcpy(c.m, pr.req.m, rows * 4);
    memcpy(c.l, pr.req.l, rows * 4);
    memcpy(c.lse, pr.req.lse, rows * 4);
  }
  terr err = tcheck(&c);
  char d[256];
  cr_expect(err.o <= ttol(rc->dt), "%s: O error %g", tdesc(&p, d, sizeof d), err.o);
  if (rc->stats)
    cr_expect(err.stats <= 1e-4, "%s: stats error %g", tdesc(&p, d, sizeof d), err.stats);

  void *out;
  size_t olen, nb;
  cr_assert_eq(attn_proto_encode_safetensors(&pr, &out, &olen, &st), 0, "%s", st.message);
  expect_parts_same(&pr, out, olen);
  const unsigned char *ob = read_entry(out, olen, "o", dn, rc->sq, rc->rank, &nb);
  cr_expect_eq(nb, qb);
  cr_expect(memcmp(ob, pr.req.o, qb) == 0, "o's bytes differ");
  cr_expect_eq(ob, (const unsigned char *)out + olen - (rc->stats ? 3 * rows * 4 : 0) - qb);
  if (rc->stats) {
    const char *names[3] = {"m", "l", "lse"};
    const float *src[3] = {pr.req.m, pr.req.l, pr.req.lse};
    for (int i = 0; i < 3; i++) {
      const unsigned char *sb = read_entry(out, olen, names[i], "F32", rc->sq, rc->rank - 1, &nb);
      cr_expect_eq(nb, rows * 4);
      cr_expect(memcmp(sb, src[i], rows * 4) == 0, "%s's bytes differ", names[i]);
      cr_expect_eq(sb, ob + qb + (size_t)i * rows * 4, "%s is not contiguous", names[i]);
    }
  } else {
    cJSON *root = cJSON_ParseWithLength((const char *)out + 8, olen - 8 - qb);
    cr_expect_eq(cJSON_GetArraySize(root), 1, "only o without stats");
    cJSON_Delete(root);
  }
  /* padding is spaces */
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)((unsigned char *)out)[i] << (8 * i);
  const char *h = (const char *)out + 8;
  size_t hl = (size_t)n;
  while (hl && h[hl - 1] == ' ')
    hl--;
  cr_expect(hl && h[hl - 1] == '}' && n - hl < 8, "header padding is not up to 7 spaces");
  free(out);
  attn_proto_req_free(&pr);
  free(body);
  tcase_free(&c);
}

Test(safetensors, round_trips) {
  static const rt_case cases[] = {
      {ATTN_F32, 2, {5, 8}, {7, 8}, false},
      {ATTN_F16, 2, {3, 16}, {9, 16}, true},
      {ATTN_BF16, 2, {4, 4}, {4, 4}, false},
      {ATTN_F32, 3, {2, 5, 8}, {2, 6, 8}, true},
      {ATTN_F16, 3, {4, 3, 8}, {2, 5, 8}, false},
      {ATTN_BF16, 3, {2, 7, 16}, {1, 3, 16}, true},
      {ATTN_F32, 4, {1, 4, 5, 8}, {1, 2, 7, 8}, true},
      {ATTN_F16, 4, {2, 4, 5, 8}, {2, 2, 7, 8}, true},
      {ATTN_BF16, 4, {1, 4, 5, 8}, {1, 2, 7, 8}, false},
      {ATTN_F16, 4, {1, 1, 1, 3}, {1, 1, 2, 3}, true}, /* odd byte counts */
  };
  attn_engine *e = topen(2, NULL);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    round_trip(&cases[i], e);
  attn_engine_close(e);
}

/* ---- options --------------------------------------------------------- */

static float qkv[3][8]; /* q, k, v as F32 [2, 4] */

static unsigned char *small_file(const char *meta, size_t *plen) {
  for (int i = 0; i < 8; i++) {
    qkv[0][i] = (float)i * 0.25f;
    qkv[1][i] = 1.0f - (float)i * 0.125f;
    qkv[2][i] = (float)(i % 3);
  }
  wtensor t[3] = {{"q", "F32", 2, {2, 4}, qkv[0], 32},
                  {"k", "F32", 2, {2, 4}, qkv[1], 32},
                  {"v", "F32", 2, {2, 4}, qkv[2], 32}};
  return write_file(t, 3, meta, plen);
}

Test(safetensors, metadata_options) {
  size_t len;
  unsigned char *b = small_file(
      "{\"causal\":\"true\",\"scale\":\"0.5\",\"window_left\":\"3\",\"stats\":\"true\"}", &len);
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  cr_expect(pr.opts.causal && pr.req.causal);
  cr_expect_eq(pr.opts.scale, 0.5);
  cr_expect_eq(pr.req.scale, 0.5);
  cr_expect_eq(pr.req.window_left, 3);
  cr_expect_eq(pr.req.window_right, -1);
  cr_expect(pr.opts.stats && pr.req.m && pr.req.l && pr.req.lse);
  attn_engine *e = topen(2, NULL);
  cr_expect_eq(attn_engine_run(e, &pr.req, NULL, &st), 0, "%s", st.message);
  attn_engine_close(e);
  attn_proto_req_free(&pr);
  free(b);
}

Test(safetensors, metadata_over_query) {
  attn_options q;
  attn_status st;
  attn_options_init(&q);
  cr_assert_eq(attn_options_parse_query(&q, "causal=false&scale=0.25&backend=cpu", &st), 0);
  size_t len;
  unsigned char *b = small_file("{\"causal\":\"true\"}", &len);
  attn_proto_req pr;
  cr_assert_eq(attn_proto_decode_safetensors(b, len, &q, &pr, &st), 0, "%s", st.message);
  cr_expect(pr.opts.causal && pr.req.causal, "__metadata__ wins over the query");
  cr_expect_eq(pr.req.scale, 0.25, "the query's scale stays when __metadata__ lacks one");
  cr_expect_str_eq(pr.req.backend, "cpu");
  cr_expect(!pr.opts.stats && !pr.req.m);
  attn_proto_req_free(&pr);
  /* without __metadata__ the query alone decides; NULL means defaults */
  free(b);
  b = small_file(NULL, &len);
  cr_assert_eq(attn_proto_decode_safetensors(b, len, &q, &pr, &st), 0, "%s", st.message);
  cr_expect(!pr.req.causal);
  cr_expect_eq(pr.req.scale, 0.25);
  attn_proto_req_free(&pr);
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  cr_expect(isnan(pr.req.scale) && !pr.req.causal && pr.req.window_left == -1);
  cr_expect_str_eq(pr.req.backend, "auto");
  attn_proto_req_free(&pr);
  free(b);
}

/* ---- zero copy ---------------------------------------------------------- */

Test(safetensors, zero_copy_when_aligned) {
  size_t len;
  unsigned char *b = small_file(NULL, &len);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)b[i] << (8 * i);
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.req.q, b + 8 + n);
  cr_expect_eq(pr.req.k, b + 8 + n + 32);
  cr_expect_eq(pr.req.v, b + 8 + n + 64);
  cr_expect(!pr.owned[0] && !pr.owned[1] && !pr.owned[2]);
  attn_proto_req_free(&pr);
  free(b);
}

static void misaligned(size_t shift, const char *dtype, size_t es, bool expect_copy) {
  size_t len;
  unsigned char src[96];
  for (size_t i = 0; i < sizeof src; i++)
    src[i] = (unsigned char)(i * 7 % 61); /* finite in every dtype */
  size_t nb = 8 * es;
  wtensor t[3] = {{"q", dtype, 2, {2, 4}, src, nb},
                  {"k", dtype, 2, {2, 4}, src + nb, nb},
                  {"v", dtype, 2, {2, 4}, src + 2 * nb, nb}};
  unsigned char *b = write_file(t, 3, NULL, &len);
  unsigned char *mem = malloc(len + shift), *body = mem + shift;
  memcpy(body, b, len);
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(body, len, NULL, &pr, &st), 0, "%s", st.message);
  const void *p[3] = {pr.req.q, pr.req.k, pr.req.v};
  for (int i = 0; i < 3; i++) {
    cr_expect_eq((uintptr_t)p[i] % es, 0, "tensor %d misaligned", i);
    cr_expect(memcmp(p[i], src + (size_t)i * nb, nb) == 0, "tensor %d's bytes", i);
    cr_expect_eq(pr.owned[i] != NULL, expect_copy, "shift %zu %s: copy %d", shift, dtype,
                 pr.owned[i] != NULL);
    bool inside = (const unsigned char *)p[i] >= body && (const unsigned char *)p[i] < body + len;
    cr_expect_eq(inside, !expect_copy);
  }
  attn_engine *e = topen(2, NULL);
  cr_expect_eq(attn_engine_run(e, &pr.req, NULL, &st), 0, "%s", st.message);
  attn_engine_close(e);
  attn_proto_req_free(&pr);
  free(mem);
  free(b);
}

Test(safetensors, copies_when_misaligned) {
  misaligned(1, "F32", 4, true);
  misaligned(2, "F32", 4, true);
  misaligned(2, "F16", 2, false);
  misaligned(1, "BF16", 2, true);
  misaligned(4, "F32", 4, false);
}

/* ---- malformed input ------------------------------------------------------ */

static int expect_fail(const void *body, size_t len, int code, const char *needle) {
  attn_proto_req pr;
  attn_status st = {0};
  int rc = attn_proto_decode_safetensors(body, len, NULL, &pr, &st);
  cr_expect_eq(rc, code, "want %s, got %s (%s)", attn_proto_code_name(code),
               attn_proto_code_name(rc), st.message);
  cr_expect_eq(st.code, code);
  cr_expect(strstr(st.message, needle) != NULL, "message \"%s\" lacks \"%s\"", st.message, needle);
  cr_expect(!pr.out && !pr.owned[0] && !pr.owned[1] && !pr.owned[2] && !pr.req.q,
            "a failed decode leaves nothing behind");
  if (rc == 0)
    attn_proto_req_free(&pr);
  return rc;
}

static const unsigned char zeros[256];

/* A header as text over `dlen` zero bytes of data. */
static void expect_hdr(const char *hdr, size_t dlen, int code, const char *needle) {
  size_t len;
  unsigned char *b = raw_file(hdr, strlen(hdr), zeros, dlen, &len);
  expect_fail(b, len, code, needle);
  free(b);
}

/* The entries of q, k and v as F32 [2, 2] each, 16 bytes, for headers. */
#define TQ "\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"
#define TK "\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]}"
#define TV "\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[32,48]}"
#define GOOD "{" TQ "," TK "," TV "}"

Test(safetensors, good_header_passes) {
  size_t len;
  unsigned char *b = raw_file(GOOD, strlen(GOOD), zeros, 48, &len);
  attn_proto_req pr;
  attn_status st;
  cr_expect_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  attn_proto_req_free(&pr);
  free(b);
  /* tabs and newlines are JSON whitespace; trailing spaces are padding; the
   * conventional {"format": "pt"} metadata is let through */
  const char *ws = "\n{\t" TQ ",\r\n" TK ",\r\n" TV ",\"__metadata__\":{\"format\":\"pt\"}}   ";
  b = raw_file(ws, strlen(ws), zeros, 48, &len);
  cr_expect_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  attn_proto_req_free(&pr);
  free(b);
}

/* A header whose parse outgrows the decoder's stack scratch (proto/scratch.c):
 * its nodes then come from the heap, the two kinds freed together, and the
 * answer is the one a small header gets (under SAN=1, no leak or bad free). */
Test(safetensors, a_header_past_the_parse_scratch_decodes_the_same) {
  const size_t n = 20000;
  char *big = malloc(n + 256), *p = big;
  p += sprintf(p, "{" TQ "," TK "," TV ",\"__metadata__\":{\"format\":\"");
  memset(p, 'p', n);
  strcpy(p + n, "\"}}");
  size_t len;
  unsigned char *b = raw_file(big, strlen(big), zeros, 48, &len);
  attn_proto_req pr;
  attn_status st;
  cr_expect_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  cr_expect_eq(pr.req.head_dim, 2);
  attn_proto_req_free(&pr);
  free(b);
  p = big + sprintf(big, "{\"q\":{\"dtype\":\"");
  memset(p, 'F', n);
  sprintf(p + n, "\",\"shape\":[2,2],\"data_offsets\":[0,16]}," TK "," TV "}");
  expect_hdr(big, 48, ATTN_PROTO_ETENSOR, "tensor \"q\": dtype \"FFFF");
  free(big);
}

/* The tensors must tile the data exactly (the published format refuses
 * holes: they are how polyglot files hide content). */
Test(safetensors, data_must_be_tiled_exactly) {
  expect_hdr("{" TQ "," TK ",\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[40,56]}}",
             56, ATTN_PROTO_ESAFETENSORS, "data bytes [32, 40) between tensors \"k\" and \"v\"");
  expect_hdr(GOOD, 52, ATTN_PROTO_ESAFETENSORS, "data bytes [48, 52) after the last tensor");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
             "\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[24,40]},"
             "\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[40,56]}}",
             56, ATTN_PROTO_ESAFETENSORS, "data bytes [0, 8) before the first tensor");
}

Test(safetensors, malformed_framing) {
  unsigned char b[64] = {0};
  expect_fail(b, 0, ATTN_PROTO_EEMPTY, "empty");
  expect_fail(NULL, 0, ATTN_PROTO_EEMPTY, "empty");
  expect_fail(b, 3, ATTN_PROTO_ESAFETENSORS, "body of 3 bytes is shorter than the 8-byte");
  /* A length the body cannot hold is a broken file, not a large one: the
   * client sent few bytes, so "too large" would send them looking for a
   * limit they are nowhere near. */
  put_le64(b, (uint64_t)1 << 63);
  expect_fail(b, 16, ATTN_PROTO_ESAFETENSORS,
              "header length 9223372036854775808 runs past the end of the body: only 8 bytes");
  put_le64(b, UINT64_MAX);
  expect_fail(b, 16, ATTN_PROTO_ESAFETENSORS, "18446744073709551615 runs past the end");
  put_le64(b, (uint64_t)ATTN_PROTO_MAX_HEADER + 1);
  expect_fail(b, 64, ATTN_PROTO_ESAFETENSORS, "runs past the end of the body: only 56 bytes");
  put_le64(b, 57);
  expect_fail(b, 64, ATTN_PROTO_ESAFETENSORS,
              "header length 57 runs past the end of the body: only 56 bytes");
  put_le64(b, 0);
  expect_fail(b, 64, ATTN_PROTO_ESAFETENSORS, "header length is 0");
}

/* Ten bytes of anything that is not safetensors (here a PNG's signature,
 * whose first eight bytes read as a length of ~2^60) are malformed. */
Test(safetensors, garbage_body_is_malformed_not_too_large) {
  static const unsigned char png[10] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0};
  expect_fail(png, sizeof png, ATTN_PROTO_ESAFETENSORS, "runs past the end of the body");
  const char *json = "{\"q\": [[1]], \"k\": [[1]], \"v\": [[1]]}"; /* sent as octet-stream */
  expect_fail(json, strlen(json), ATTN_PROTO_ESAFETENSORS, "runs past the end of the body");
}

/* The cap is a 413 only for a header the body really holds. The bytes after
 * the length are never read before the cap refuses them, so the 100 MiB
 * buffer costs address space only (malloc'd, left untouched). */
Test(safetensors, header_within_the_body_but_over_the_cap_is_too_large) {
  size_t n = (size_t)ATTN_PROTO_MAX_HEADER + 1, len = 8 + n;
  unsigned char *b = malloc(len);
  cr_assert(b);
  put_le64(b, n);
  expect_fail(b, len, ATTN_PROTO_ETOOLARGE,
              "header length 104857601 is over the limit of "
              "104857600 bytes");
  /* one byte short of holding it: malformed, as any length past the body */
  expect_fail(b, len - 1, ATTN_PROTO_ESAFETENSORS, "runs past the end of the body");
  free(b);
}

Test(safetensors, malformed_truncated) {
  size_t len;
  unsigned char *b = small_file(NULL, &len);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)b[i] << (8 * i);
  /* every prefix of a valid file is refused, and nothing leaks */
  for (size_t cut = 0; cut < len; cut++) {
    attn_proto_req pr;
    attn_status st;
    int rc = attn_proto_decode_safetensors(b, cut, NULL, &pr, &st);
    cr_expect(rc < 0, "a file cut at %zu of %zu bytes decoded", cut, len);
  }
  expect_fail(b, 5, ATTN_PROTO_ESAFETENSORS, "body of 5 bytes is shorter");
  expect_fail(b, 8 + (size_t)n / 2, ATTN_PROTO_ESAFETENSORS, "runs past the end of the body");
  expect_fail(b, len - 3, ATTN_PROTO_ESAFETENSORS,
              "tensor \"v\": data_offsets [64, 96] end past the 93 bytes of data");
  expect_fail(b, 8 + (size_t)n + 40, ATTN_PROTO_ESAFETENSORS,
              "tensor \"k\": data_offsets [32, 64] end past the 40 bytes");
  /* the same header, its length shortened so the JSON is cut */
  put_le64(b, n - 20);
  expect_fail(b, len, ATTN_PROTO_ESAFETENSORS, "not valid JSON");
  free(b);
}

Test(safetensors, malformed_json) {
  expect_hdr("[]", 0, ATTN_PROTO_ESAFETENSORS, "the header is an array, not a JSON object");
  expect_hdr("\"x\"", 0, ATTN_PROTO_ESAFETENSORS, "the header is a string, not a JSON object");
  expect_hdr("{\"q\":}", 0, ATTN_PROTO_ESAFETENSORS, "not valid JSON (error near header byte 5");
  expect_hdr(GOOD "x", 48, ATTN_PROTO_ESAFETENSORS, "bytes other than spaces follow");
  expect_hdr(GOOD "{}", 48, ATTN_PROTO_ESAFETENSORS, "bytes other than spaces follow");
  /* a NUL inside the header, in a key and between tokens */
  static const char nul[] = "{\"q\0\":1}";
  size_t len;
  unsigned char *b = raw_file(nul, sizeof nul - 1, NULL, 0, &len);
  expect_fail(b, len, ATTN_PROTO_ESAFETENSORS, "header byte 3 (file offset 11) is a NUL");
  free(b);
  static const char nul2[] = "{\0}";
  b = raw_file(nul2, sizeof nul2 - 1, NULL, 0, &len);
  expect_fail(b, len, ATTN_PROTO_ESAFETENSORS, "is a NUL byte");
  free(b);
  expect_hdr("{\"q\\u0000x\":1}", 0, ATTN_PROTO_ESAFETENSORS, "\\u0000");
  expect_hdr("{\x01}", 0, ATTN_PROTO_ESAFETENSORS, "control byte 0x01");
  expect_hdr("{\"a\tb\":1}", 0, ATTN_PROTO_ESAFETENSORS, "control byte 0x09");
  expect_hdr("{\"\xff\":1}", 0, ATTN_PROTO_ESAFETENSORS,
             "header byte 2 (file offset 10) starts invalid UTF-8");
  expect_hdr("{\"\xc0\x80\":1}", 0, ATTN_PROTO_ESAFETENSORS, "invalid UTF-8");
  expect_hdr("{\"q\":[[[[[[1]]]]]]}", 0, ATTN_PROTO_ESAFETENSORS, "nests deeper than 6");
}

Test(safetensors, malformed_keys) {
  expect_hdr("{" TQ "," TQ "," TK "," TV "}", 48, ATTN_PROTO_ESAFETENSORS,
             "the header has the tensor \"q\" twice");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{},\"__metadata__\":{}}", 48,
             ATTN_PROTO_ESAFETENSORS, "\"__metadata__\" twice");
  expect_hdr(
      "{\"q\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}," TK
      "," TV "}",
      48, ATTN_PROTO_ESAFETENSORS, "tensor \"q\" has the field \"dtype\" twice");
  expect_hdr("{" TQ "," TK "}", 48, ATTN_PROTO_EMISSING, "tensor \"v\" is missing");
  expect_hdr("{" TK "," TV "}", 48, ATTN_PROTO_EMISSING, "tensor \"q\" is missing");
  expect_hdr("{}", 0, ATTN_PROTO_EMISSING, "tensor \"q\" is missing");
  expect_hdr("{" TQ "," TK "," TV ",\"x\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[48,52]}}",
             52, ATTN_PROTO_EUNKNOWNTENSOR, "unknown tensor \"x\"");
  expect_hdr("{\"Q\":1}", 0, ATTN_PROTO_EUNKNOWNTENSOR, "unknown tensor \"Q\"");
}

Test(safetensors, malformed_entries) {
  expect_hdr("{\"q\":[1]," TK "," TV "}", 48, ATTN_PROTO_ESAFETENSORS,
             "tensor \"q\" must be an object");
  expect_hdr("{\"q\":{\"shape\":[2,2],\"data_offsets\":[0,16]}," TK "," TV "}", 48,
             ATTN_PROTO_ESAFETENSORS, "tensor \"q\" lacks the field \"dtype\"");
  expect_hdr("{" TQ ",\"k\":{\"dtype\":\"F32\",\"data_offsets\":[16,32]}," TV "}", 48,
             ATTN_PROTO_ESAFETENSORS, "tensor \"k\" lacks the field \"shape\"");
  expect_hdr("{" TQ "," TK ",\"v\":{\"dtype\":\"F32\",\"shape\":[2,2]}}", 48,
             ATTN_PROTO_ESAFETENSORS, "tensor \"v\" lacks the field \"data_offsets\"");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16],\"name\":\"q\"}," TK
             "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS, "tensor \"q\" has the unknown field \"name\"");
  expect_hdr("{\"q\":{\"dtype\":\"F64\",\"shape\":[2,2],\"data_offsets\":[0,32]}," TK "," TV "}",
             48, ATTN_PROTO_ETENSOR, "tensor \"q\": dtype \"F64\" is not supported");
  expect_hdr("{" TQ ",\"k\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[16,32]}," TV "}",
             48, ATTN_PROTO_ETENSOR, "tensor \"k\": dtype \"I32\"");
  expect_hdr("{\"q\":{\"dtype\":4,\"shape\":[2,2],\"data_offsets\":[0,16]}," TK "," TV "}", 48,
             ATTN_PROTO_ESAFETENSORS,
             "tensor \"q\": dtype must be a string such as \"F32\", not a number");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,16]}," TK "," TV "}", 48,
             ATTN_PROTO_ESAFETENSORS, "shape must be an array of integers, not an object");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[-2,2],\"data_offsets\":[0,16]}," TK "," TV "}",
             48, ATTN_PROTO_ETENSOR, "tensor \"q\": shape[0] is -2");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2.5],\"data_offsets\":[0,20]}," TK "," TV "}",
             48, ATTN_PROTO_ETENSOR, "tensor \"q\": shape[1] is 2.5");
  expect_hdr(
      "{\"q\":{\"dtype\":\"F32\",\"shape\":[2,\"4\"],\"data_offsets\":[0,16]}," TK "," TV "}", 48,
      ATTN_PROTO_ESAFETENSORS, "tensor \"q\": shape[1] must be an integer, not a string");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,null],\"data_offsets\":[0,16]}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS, "not null");
  expect_hdr(
      "{\"q\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,16]}," TK
      "," TV "}",
      48, ATTN_PROTO_ETENSOR, "shape[0] is 4.6116860184273879e+18");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,16],"
             "\"data_offsets\":[0,16]}," TK "," TV "}",
             48, ATTN_PROTO_ETENSOR, "holds more bytes than 64-bit sizes can count");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}," TK
             "," TV "}",
             48, ATTN_PROTO_ETENSOR, "more than 8 dimensions");
}

Test(safetensors, malformed_offsets) {
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS,
             "tensor \"q\": data_offsets [16, 0] begin after they end");
  expect_hdr("{" TQ ",\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,4000]}," TV "}",
             48, ATTN_PROTO_ESAFETENSORS,
             "tensor \"k\": data_offsets [0, 4000] end past the 48 bytes of data");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS,
             "data_offsets [0, 12] span 12 bytes but F32 [2, 2] needs 16");
  expect_hdr("{\"q\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,16]}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS, "span 16 bytes but F16 [2, 2] needs 8");
  expect_hdr("{" TQ ",\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]}," TV "}",
             48, ATTN_PROTO_ESAFETENSORS,
             "tensors \"q\" at data_offsets [0, 16] and \"k\" at [8, 24] overlap");
  expect_hdr("{" TQ "," TK ",\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
             48, ATTN_PROTO_ESAFETENSORS, "overlap");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0]}," TK "," TV "}", 48,
             ATTN_PROTO_ESAFETENSORS,
             "data_offsets must be an array [begin, end], not an array of another length");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":\"0-16\"}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS, "not a string");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[-16,0]}," TK "," TV "}",
             48, ATTN_PROTO_ESAFETENSORS, "data_offsets[0] is -16");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,\"16\"]}," TK "," TV
             "}",
             48, ATTN_PROTO_ESAFETENSORS, "data_offsets[1] must be an integer, not a string");
}

Test(safetensors, malformed_from_build) {
  expect_hdr("{" TQ ",\"k\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[16,24]},"
             "\"v\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[24,32]}}",
             32, ATTN_PROTO_EDTYPE, "tensor \"k\" is F16 but \"q\" is F32");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}," TK "," TV "}", 48,
             ATTN_PROTO_ETENSOR, "tensor \"q\" has 1 dimensions");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
             "\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]},"
             "\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[20,36]}}",
             36, ATTN_PROTO_ETENSOR, "has 0 dimensions");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}," TK "," TV
             "}",
             48, ATTN_PROTO_ETENSOR, "has 5 dimensions");
  expect_hdr("{\"q\":{\"dtype\":\"F32\",\"shape\":[0,2],\"data_offsets\":[0,0]},"
             "\"k\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
             "\"v\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]}}",
             32, ATTN_PROTO_ETENSOR, "has a dimension below 1");
  expect_hdr("{" TQ "," TK ",\"v\":{\"dtype\":\"F32\",\"shape\":[4,1],\"data_offsets\":[32,48]}}",
             48, ATTN_PROTO_ESHAPE, "tensor \"v\" has shape [4, 1] but \"k\" has [2, 2]");
}

Test(safetensors, malformed_metadata) {
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"causal\":true}}", 48, ATTN_PROTO_EOPTVALUE,
             "__metadata__ value of \"causal\" must be a string, not a boolean");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"scale\":0.5}}", 48, ATTN_PROTO_EOPTVALUE,
             "\"scale\" must be a string, not a number");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"dtype\":\"F16\"}}", 48, ATTN_PROTO_EOPTION,
             "unknown option \"dtype\" in the __metadata__");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"causal\":\"yes\"}}", 48,
             ATTN_PROTO_EOPTVALUE,
             "option \"causal\" in the __metadata__ must be true or false (got \"yes\")");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"stats\":\"1\",\"stats\":\"0\"}}", 48,
             ATTN_PROTO_ESAFETENSORS, "__metadata__ has the key \"stats\" twice");
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":[\"causal\"]}", 48, ATTN_PROTO_ESAFETENSORS,
             "__metadata__ must be an object of strings, not an array");
  /* a valid option the engine refuses still fails, with the engine's code */
  expect_hdr("{" TQ "," TK "," TV ",\"__metadata__\":{\"causal\":\"true\",\"window_right\":\"3\"}}",
             48, ATTN_EWINDOW, "contradicts");
}

Test(safetensors, encode_padding_and_errors) {
  size_t len;
  unsigned char *b = small_file("{\"stats\":\"true\"}", &len);
  attn_proto_req pr;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &pr, &st), 0, "%s", st.message);
  memset(pr.out, 0, 32 + 3 * 2 * 4);
  void *out;
  size_t olen;
  cr_assert_eq(attn_proto_encode_safetensors(&pr, &out, &olen, &st), 0, "%s", st.message);
  const unsigned char *o = out;
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)o[i] << (8 * i);
  cr_expect_eq((8 + n) % 8, 0);
  cr_expect_eq(olen, 8 + n + 32 + 3 * 8);
  static const char want[] = "{\"o\":{\"dtype\":\"F32\",\"shape\":[2,4],\"data_offsets\":[0,32]},"
                             "\"m\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[32,40]},"
                             "\"l\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[40,48]},"
                             "\"lse\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[48,56]}}";
  cr_expect(n >= sizeof want - 1 && !memcmp(o + 8, want, sizeof want - 1), "header %.*s", (int)n,
            (const char *)o + 8);
  for (size_t i = 8 + sizeof want - 1; i < 8 + n; i++)
    cr_expect_eq(o[i], ' ');
  free(out);
  attn_proto_req_free(&pr);
  /* a request with nothing decoded in it is refused, not written */
  cr_expect_lt(attn_proto_encode_safetensors(&pr, &out, &olen, &st), 0);
  cr_expect(out == NULL && olen == 0);
  free(b);
}

/* ---- outputs in a caller's buffer ----------------------------------------- */

static int freed_calls;
static void *freed_ptr;
static void count_free(void *ctx, void *p) {
  cr_expect_eq(ctx, &freed_calls);
  freed_calls++;
  freed_ptr = p;
  free(p);
}

Test(safetensors, outputs_move_into_a_callers_buffer) {
  size_t len;
  unsigned char *b = small_file("{\"stats\":\"true\"}", &len);
  attn_proto_req a, m;
  attn_status st;
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &a, &st), 0, "%s", st.message);
  cr_assert_eq(attn_proto_decode_safetensors(b, len, NULL, &m, &st), 0, "%s", st.message);
  cr_assert_eq(a.out_bytes, 2 * 4 * 4 + 3 * 2 * 4, "O [2, 4] then m, l, lse [2] (F32)");
  char *buf = malloc(m.out_bytes);
  attn_proto_req_set_out(&m, buf, count_free, &freed_calls);
  cr_expect_eq((void *)m.req.o, buf);
  cr_expect_eq((char *)m.req.m - buf, (char *)a.req.m - (char *)a.out);
  cr_expect_eq((char *)m.req.lse - buf, (char *)a.req.lse - (char *)a.out);
  attn_engine *e = topen(2, NULL);
  cr_expect_eq(attn_engine_run(e, &a.req, NULL, &st), 0, "%s", st.message);
  cr_expect_eq(attn_engine_run(e, &m.req, NULL, &st), 0, "%s", st.message);
  attn_engine_close(e);
  cr_expect(memcmp(a.out, buf, a.out_bytes) == 0, "the same outputs, in the caller's buffer");
  attn_proto_req_free(&a);
  attn_proto_req_free(&m);
  cr_expect_eq(freed_calls, 1, "freed once, by the caller's function");
  cr_expect_eq(freed_ptr, buf);
  free(b);
}
