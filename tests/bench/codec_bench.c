/*
 * codec_bench.c — `make bench`, part two: throughput of the wire formats,
 * each against its floor measured in the same run on the same bytes.
 *
 *  safetensors: decode and encode of a ~64 MB body (q, k, v F32), against
 *  memcpy of the body. Decoding is zero-copy when the data is aligned, so it
 *  should beat memcpy; encoding copies O once.
 *  JSON: decode of a ~10 MB body against cJSON_Parse of the same text (a
 *  tree parser's cost; the codec reads in place and converts each number
 *  into its tensor), and encode of O.
 * MB/s are of the body bytes (decode) or of the reply bytes (encode).
 */
#include "benchlib.h"
#include "proto.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef double (*timed_fn)(void *arg);

/* Median seconds of reps runs of fn. */
static double time_it(timed_fn fn, void *arg, int reps) {
  double t[16];
  fn(arg); /* warm-up */
  for (int i = 0; i < reps; i++)
    t[i] = fn(arg);
  return tool_bench_median(t, reps);
}

typedef struct ctx {
  char *body;
  size_t len;
  char *dst;
  attn_proto_req pr; /* a decoded request, for encoding */
  size_t out_len;
} ctx;

static double run_memcpy(void *a) {
  ctx *c = a;
  double t0 = tool_bench_now();
  memcpy(c->dst, c->body, c->len);
  return tool_bench_now() - t0;
}

static double run_st_decode(void *a) {
  ctx *c = a;
  attn_proto_req pr;
  attn_status st;
  double t0 = tool_bench_now();
  if (attn_proto_decode_safetensors(c->body, c->len, NULL, &pr, &st) < 0) {
    fprintf(stderr, "bench: %s\n", st.message);
    exit(1);
  }
  double t = tool_bench_now() - t0;
  attn_proto_req_free(&pr);
  return t;
}

static double run_st_encode(void *a) {
  ctx *c = a;
  void *buf;
  attn_status st;
  double t0 = tool_bench_now();
  if (attn_proto_encode_safetensors(&c->pr, &buf, &c->out_len, &st) < 0)
    exit(1);
  double t = tool_bench_now() - t0;
  free(buf);
  return t;
}

static double run_cjson(void *a) {
  ctx *c = a;
  double t0 = tool_bench_now();
  cJSON *j = cJSON_ParseWithLength(c->body, c->len);
  double t = tool_bench_now() - t0;
  if (!j)
    exit(1);
  cJSON_Delete(j);
  return t;
}

static double run_json_decode(void *a) {
  ctx *c = a;
  attn_proto_req pr;
  attn_status st;
  double t0 = tool_bench_now();
  if (attn_proto_decode_json(c->body, c->len, NULL, &pr, &st) < 0) {
    fprintf(stderr, "bench: %s\n", st.message);
    exit(1);
  }
  double t = tool_bench_now() - t0;
  attn_proto_req_free(&pr);
  return t;
}

static double run_json_encode(void *a) {
  ctx *c = a;
  char *buf;
  attn_status st;
  double t0 = tool_bench_now();
  if (attn_proto_encode_json(&c->pr, "cpu", &buf, &c->out_len, &st) < 0)
    exit(1);
  double t = tool_bench_now() - t0;
  free(buf);
  return t;
}

static void report(const char *what, size_t bytes, double t, double base) {
  printf("  %-34s %10.1f MB/s   %8.2f ms   %6.2fx the baseline\n", what, (double)bytes / t * 1e-6,
         t * 1e3, base / t);
}

int main(void) {
  const int reps = 5;
  tool_bench_case bc;
  attn_status st;
  /* safetensors: q, k, v [1, 16, 5461, 64] F32 = 3 x 22.4 MB */
  if (tool_bench_case_init(&bc, 1, 16, 16, 5461, 5461, 64, ATTN_F32, false, 3) < 0)
    return 1;
  ctx c = {0};
  void *sb;
  if (attn_proto_encode_request_safetensors(&bc.req, NULL, &sb, &c.len, &st) < 0)
    return 1;
  c.body = sb;
  c.dst = malloc(c.len);
  memset(c.dst, 1, c.len);
  if (attn_proto_decode_safetensors(c.body, c.len, NULL, &c.pr, &st) < 0) {
    fprintf(stderr, "bench: %s\n", st.message);
    return 1;
  }
  memset(c.pr.out, 0, (size_t)(16 * 5461 * 64) * 4);
  printf("safetensors, %.1f MB body (q, k, v F32 [1, 16, 5461, 64]), median of %d\n",
         (double)c.len * 1e-6, reps);
  double tm = time_it(run_memcpy, &c, reps);
  report("memcpy of the body (baseline)", c.len, tm, tm);
  report("decode (zero-copy)", c.len, time_it(run_st_decode, &c, reps), tm);
  double te = time_it(run_st_encode, &c, reps);
  report("encode o", c.out_len, te, tm * (double)c.out_len / (double)c.len);
  attn_proto_req_free(&c.pr);
  free(c.body);
  free(c.dst);
  tool_bench_case_free(&bc);

  /* JSON: q, k, v [1, 1, 5461, 64] F32 as the shortest text, about 10 MB */
  if (tool_bench_case_init(&bc, 1, 1, 1, 5461, 5461, 64, ATTN_F32, false, 4) < 0)
    return 1;
  c = (ctx){0};
  char *jb;
  if (attn_proto_encode_request_json(&bc.req, NULL, &jb, &c.len, &st) < 0)
    return 1;
  c.body = jb;
  if (attn_proto_decode_json(c.body, c.len, NULL, &c.pr, &st) < 0) {
    fprintf(stderr, "bench: %s\n", st.message);
    return 1;
  }
  memcpy(c.pr.out, bc.req.q, (size_t)(5461 * 64) * 4); /* realistic O values */
  printf("\nJSON, %.1f MB body (q, k, v F32 [1, 1, 5461, 64]), median of %d\n",
         (double)c.len * 1e-6, reps);
  double tc = time_it(run_cjson, &c, reps);
  report("cJSON_Parse of the body (baseline)", c.len, tc, tc);
  report("decode", c.len, time_it(run_json_decode, &c, reps), tc);
  te = time_it(run_json_encode, &c, reps);
  report("encode o", c.out_len, te, tc * (double)c.out_len / (double)c.len);
  attn_proto_req_free(&c.pr);
  free(c.body);
  tool_bench_case_free(&bc);
  printf("\nthe last column: the baseline's time for the same bytes over the codec's time.\n");
  return 0;
}
