/*
 * test_session_client.c — `attn session` (clients/session_cmd.c) and `attn
 * load --session` (clients/load_session.c) against a real attnd: a session's
 * whole life from the command line (create, a retried create, get, attend
 * with random inputs and from a file, a conflict, truncate, delete), a
 * session with values of their own head dim and a latent one, attend with
 * --sinks (o against the float64 reference of the inputs the CLI drew), the
 * decoding load's counts in its JSON report, and the exit statuses of
 * refusals, bad usage and a server that is not there.
 *
 * No latency or rate is asserted (make test must pass on a loaded machine).
 * The CLI is $ATTN_BIN (default build/attn), its stdout and stderr read
 * together.
 */
#include "harness.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static srv S;
static void teardown(void) { srv_cleanup(&S); }
TestSuite(session_client, .fini = teardown, .timeout = 120);

static const char *attn_bin(void) {
  const char *b = getenv("ATTN_BIN");
  return b && *b ? b : "build/attn";
}

/* Runs `$ATTN_BIN <args>` (a printf format) with stdout and stderr in *out
 * (malloc'd); the exit status, -1 when it did not exit. */
static int run(char **out, const char *fmt, ...) {
  char args[2048], cmd[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s %s 2>&1 </dev/null", attn_bin(), args);
  cr_assert(access(attn_bin(), X_OK) == 0, "%s not found (set ATTN_BIN)", attn_bin());
  FILE *f = popen(cmd, "r");
  cr_assert(f, "popen %s", cmd);
  size_t cap = 1 << 14, len = 0, n;
  char *b = malloc(cap);
  while ((n = fread(b + len, 1, cap - len - 1, f)) > 0)
    if ((len += n) + 1 >= cap)
      b = realloc(b, cap *= 2);
  b[len] = 0;
  int ws = pclose(f);
  cr_expect(!strstr(b, "Sanitizer") && !strstr(b, "runtime error:"),
            "%s printed a sanitizer report:\n%s", cmd, b);
  *out = b;
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* run() expecting status rc and every needle (NULL-terminated) in the output. */
static void expect_run(int rc, const char *args, ...) {
  char *out;
  int got = run(&out, "%s", args);
  cr_expect_eq(got, rc, "attn %s: exit %d, not %d:\n%s", args, got, rc, out);
  va_list ap;
  va_start(ap, args);
  const char *needle;
  while ((needle = va_arg(ap, const char *)) != NULL)
    cr_expect(strstr(out, needle), "attn %s: no \"%s\" in:\n%s", args, needle, out);
  va_end(ap);
  free(out);
}

/* ---- attn session ------------------------------------------------------- */

Test(session_client, lifecycle) {
  srv_start(&S, NULL);
  char a[512];
  snprintf(a, sizeof a, "session create %s cli-1 --heads-kv 2 --head-dim 16 --max-tokens 32",
           S.url);
  expect_run(0, a, "session cli-1 created (HTTP 201)", "32 tokens, 2 kv heads x 16, F32", NULL);
  expect_run(0, a, "exists, same parameters (HTTP 200)", NULL);
  snprintf(a, sizeof a, "session create %s cli-1 --heads-kv 2 --head-dim 16 --max-tokens 33",
           S.url);
  expect_run(1, a, "HTTP 409 session_exists", NULL);
  snprintf(a, sizeof a, "session get %s cli-1", S.url);
  expect_run(0, a, "1 layer of 32 tokens", "lengths 0\n", NULL);
  snprintf(a, sizeof a, "session attend %s cli-1 --heads-q 4 --new 5", S.url);
  expect_run(0, a, "layer 0: 5 new at pos 0 -> length 5 (HTTP 200", "o [4,5,16] F32", NULL);
  snprintf(a, sizeof a, "session attend %s cli-1 --heads-q 4 --seed 2", S.url);
  expect_run(0, a, "1 new at pos 5 -> length 6", "o [4,1,16] F32", NULL);
  snprintf(a, sizeof a, "session attend %s cli-1 --pos 2 --seed 3", S.url);
  expect_run(1, a, "HTTP 409 session_conflict", NULL);
  snprintf(a, sizeof a, "session get %s cli-1", S.url);
  expect_run(0, a, "lengths 6\n", NULL);
  snprintf(a, sizeof a, "session truncate %s cli-1 --length 3", S.url);
  expect_run(0, a, "session cli-1 truncated to 3", NULL);
  snprintf(a, sizeof a, "session fork %s cli-1 cli-2 --length 2 --ttl 30", S.url);
  expect_run(0, a, "session cli-2 forked from cli-1 (HTTP 201): 2 tokens", NULL);
  snprintf(a, sizeof a, "session get %s cli-2", S.url);
  expect_run(0, a, "lengths 2\n", "shared with its forks; ttl 30 s", NULL);
  snprintf(a, sizeof a, "session fork %s cli-1 cli-2", S.url);
  expect_run(1, a, "HTTP 409 session_exists", NULL);
  snprintf(a, sizeof a, "session delete %s cli-2", S.url);
  expect_run(0, a, "session cli-2 deleted (HTTP 204)", NULL);
  snprintf(a, sizeof a, "session attend %s cli-1 --new 0 --no-causal --stats", S.url);
  expect_run(0, a, "no new tokens -> length 3", "o [2,1,16] F32", "with m, l, lse", NULL);
  snprintf(a, sizeof a, "session delete %s cli-1", S.url);
  expect_run(0, a, "session cli-1 deleted (HTTP 204)", NULL);
  snprintf(a, sizeof a, "session get %s cli-1", S.url);
  expect_run(1, a, "HTTP 404 session_not_found", NULL);
}

/* A safetensors request file of q [4, n, 8] and k, v [2, n, 8], F32: all
 * ones but v, whose element i is i % 7 (so |o| <= 6). */
static void write_request(const char *path, int n) {
  char hdr[400];
  size_t q = 4u * (size_t)n * 8 * 4, kv = 2u * (size_t)n * 8 * 4;
  int hl = snprintf(hdr, sizeof hdr,
                    "{\"q\":{\"dtype\":\"F32\",\"shape\":[4,%d,8],\"data_offsets\":[0,%zu]},"
                    "\"k\":{\"dtype\":\"F32\",\"shape\":[2,%d,8],\"data_offsets\":[%zu,%zu]},"
                    "\"v\":{\"dtype\":\"F32\",\"shape\":[2,%d,8],\"data_offsets\":[%zu,%zu]}}",
                    n, q, n, q, q + kv, n, q + kv, q + 2 * kv);
  while ((8 + hl) % 8)
    hdr[hl++] = ' ';
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  uint64_t len = (uint64_t)hl; /* little-endian on the machines this runs on */
  fwrite(&len, 8, 1, f);
  fwrite(hdr, 1, (size_t)hl, f);
  for (size_t i = 0; i < (q + 2 * kv) / 4; i++) {
    float x = i < (q + kv) / 4 ? 1.0f : (float)(i % 7);
    fwrite(&x, 4, 1, f);
  }
  fclose(f);
}

Test(session_client, attend_from_file) {
  srv_start(&S, NULL);
  char a[512], in[] = "/tmp/attn-session-in-XXXXXX", out[] = "/tmp/attn-session-out-XXXXXX";
  close(mkstemp(in));
  close(mkstemp(out));
  write_request(in, 3);
  snprintf(a, sizeof a, "session create %s cli-file --heads-kv 2 --head-dim 8 --max-tokens 8",
           S.url);
  expect_run(0, a, "created", NULL);
  snprintf(a, sizeof a, "session attend %s cli-file --in %s --out %s", S.url, in, out);
  expect_run(0, a, "3 new at pos 0 -> length 3", "o [4,3,8] F32", "wrote ", NULL);
  /* the same file again is a replay at pos 0: the length stays 3 */
  snprintf(a, sizeof a, "session attend %s cli-file --in %s --pos 0", S.url, in);
  expect_run(0, a, "3 new at pos 0 -> length 3", NULL);
  /* and appended at the end it fills the session; a third time is past max_tokens */
  snprintf(a, sizeof a, "session attend %s cli-file --in %s", S.url, in);
  expect_run(0, a, "3 new at pos 3 -> length 6", NULL);
  snprintf(a, sizeof a, "session attend %s cli-file --in %s", S.url, in);
  expect_run(1, a, "HTTP 422 session_full", NULL);
  char *body;
  int rc = run(&body, "session get %s cli-file --json", S.url);
  cr_expect_eq(rc, 0);
  cJSON *j = cJSON_Parse(body);
  cr_assert(j, "not JSON: %s", body);
  const cJSON *lengths = cJSON_GetObjectItemCaseSensitive(j, "lengths");
  cr_expect(cJSON_IsArray(lengths) && cJSON_GetArrayItem(lengths, 0)->valuedouble == 6);
  cJSON_Delete(j);
  free(body);
  FILE *f = fopen(out, "rb");
  cr_assert(f);
  fseek(f, 0, SEEK_END);
  cr_expect_gt(ftell(f), 4 * 3 * 8 * 4, "the reply file holds o");
  fclose(f);
  unlink(in);
  unlink(out);
}

/* The CLI's random inputs (clients/session_wire.c): count F32 values
 * uniform in [-1, 1) from splitmix64 seeded with seed. */
static float *cli_random(int64_t count, uint64_t seed) {
  float *x = malloc((size_t)count * sizeof *x);
  for (int64_t i = 0; i < count; i++) {
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    x[i] = (float)((double)((z ^ (z >> 31)) >> 11) * 0x1p-52 - 1.0);
  }
  return x;
}

/* Tensor o of a safetensors file (F32, n elements), malloc'd. */
static float *file_o(const char *path, size_t n) {
  size_t len;
  char *b = read_file_all(path, &len);
  cr_assert(b && len > 8, "%s", path);
  uint64_t hl = 0;
  memcpy(&hl, b, 8);
  cJSON *h = cJSON_ParseWithLength(b + 8, (size_t)hl);
  const cJSON *offs = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "o"), "data_offsets");
  cr_assert(offs, "no o in %s", path);
  size_t at = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
  cr_assert_eq((size_t)cJSON_GetArrayItem(offs, 1)->valuedouble - at, n * sizeof(float));
  float *o = malloc(n * sizeof *o);
  memcpy(o, b + 8 + hl + at, n * sizeof *o);
  cJSON_Delete(h);
  free(b);
  return o;
}

/* o of the CLI's first call (hq query heads, n new tokens at pos 0, --seed
 * seed, sinks or NULL) against the float64 reference: q, k and v (a latent
 * session's: k's first dv columns) drawn as the CLI draws them. */
static void expect_cli_o(const char *path, int64_t hq, int64_t hkv, int64_t n, int64_t d,
                         int64_t dv, bool latent, uint64_t seed, const float *sinks) {
  int64_t nq = hq * n * d, nk = hkv * n * d, nv = latent ? 0 : hkv * n * dv;
  float *x = cli_random(nq + nk + nv, seed), *v = x + nq + nk;
  if (latent) {
    v = malloc((size_t)(hkv * n * dv) * sizeof *v);
    for (int64_t r = 0; r < hkv * n; r++)
      memcpy(v + r * dv, x + nq + r * d, (size_t)dv * sizeof *v);
  }
  attn_request r;
  attn_request_init(&r);
  r.batch = 1, r.heads_q = hq, r.heads_kv = hkv, r.seq_q = n, r.seq_kv = n, r.head_dim = d;
  r.head_dim_v = dv, r.dtype = ATTN_F32, r.causal = true, r.sinks = sinks;
  float *o = file_o(path, (size_t)(hq * n * dv));
  double *want = malloc((size_t)(hq * n * dv) * sizeof *want);
  r.q = x, r.k = x + nq, r.v = v, r.o = o;
  attn_status st;
  cr_assert_eq(attn_reference(&r, want, NULL, NULL, NULL, &st), 0, "%s", st.message);
  double num = 0, den = 0;
  for (int64_t i = 0; i < hq * n * dv; i++)
    num += (o[i] - want[i]) * (o[i] - want[i]), den += want[i] * want[i];
  cr_expect(sqrt(num / den) < ttol(ATTN_F32), "%s: relative error %g", path, sqrt(num / den));
  if (latent)
    free(v);
  free(x), free(o), free(want);
}

Test(session_client, value_head_dim_latent_and_sinks) {
  srv_start(&S, "--session-memory", "16M", NULL);
  char a[512], out[] = "/tmp/attn-session-dv-XXXXXX";
  close(mkstemp(out));
  snprintf(a, sizeof a,
           "session create %s cli-dv --heads-kv 2 --head-dim 16 --head-dim-v 24 --max-tokens 8",
           S.url);
  expect_run(0, a, "created", "2 kv heads x 16, values 24 wide, F32", NULL);
  snprintf(a, sizeof a, "session get %s cli-dv", S.url);
  expect_run(0, a, "2 kv heads x 16, values 24 wide, F32", NULL);
  snprintf(a, sizeof a,
           "session attend %s cli-dv --heads-q 4 --new 3 --seed 5 --sinks 0.5,-1,2,0 --out %s",
           S.url, out);
  expect_run(0, a, "3 new at pos 0 -> length 3", "o [4,3,24] F32", NULL);
  const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
  expect_cli_o(out, 4, 2, 3, 16, 24, false, 5, sinks);
  snprintf(a, sizeof a, "session attend %s cli-dv --heads-q 4 --sinks 1,2", S.url);
  expect_run(2, a, "--sinks has 2 numbers; give Hq = 4", NULL);
  snprintf(a, sizeof a,
           "session create %s cli-mla --heads-kv 1 --head-dim 16 --v-from-k 8 --max-tokens 8",
           S.url);
  expect_run(0, a, "created", "1 kv heads x 16, latent: v the first 8 columns of k", NULL);
  snprintf(a, sizeof a, "session get %s cli-mla", S.url);
  expect_run(0, a, "latent: v the first 8 columns of k", NULL);
  snprintf(a, sizeof a, "session attend %s cli-mla --heads-q 4 --new 3 --seed 6 --out %s", S.url,
           out);
  expect_run(0, a, "3 new at pos 0 -> length 3", "o [4,3,8] F32", NULL);
  expect_cli_o(out, 4, 1, 3, 16, 8, true, 6, NULL);
  snprintf(a, sizeof a,
           "session create %s x --heads-kv 1 --head-dim 16 --v-from-k 8 --head-dim-v 4 "
           "--max-tokens 8",
           S.url);
  expect_run(2, a, "--head-dim-v and --v-from-k differ", NULL);
  snprintf(a, sizeof a,
           "session create %s x --heads-kv 1 --head-dim 16 --v-from-k 17 "
           "--max-tokens 8",
           S.url);
  expect_run(1, a, "HTTP 422 invalid_option", "v_from_k", NULL);
  unlink(out);
}

/* --reserve grow: nothing reserved until tokens arrive, then their pages
 * (2 KV heads, K and V: 4 pages of 64 KiB); the output against float64. */
Test(session_client, reserve_grow) {
  srv_start(&S, "--session-memory", "16M", NULL);
  char a[512], out[] = "/tmp/attn-session-grow-XXXXXX";
  close(mkstemp(out));
  snprintf(a, sizeof a,
           "session create %s cli-g --heads-kv 2 --head-dim 16 --max-tokens 8 --reserve grow",
           S.url);
  expect_run(0, a, "created", NULL);
  snprintf(a, sizeof a, "session get %s cli-g", S.url);
  expect_run(0, a, "reserved 0 bytes (reserve grow", NULL);
  snprintf(a, sizeof a, "session attend %s cli-g --heads-q 4 --new 3 --seed 7 --out %s", S.url,
           out);
  expect_run(0, a, "3 new at pos 0 -> length 3", NULL);
  expect_cli_o(out, 4, 2, 3, 16, 16, false, 7, NULL);
  snprintf(a, sizeof a, "session get %s cli-g", S.url);
  expect_run(0, a, "reserved 262144 bytes (reserve grow", NULL);
  snprintf(a, sizeof a, "session create %s cli-g --heads-kv 2 --head-dim 16 --max-tokens 8", S.url);
  expect_run(1, a, "HTTP 409 session_exists", NULL);
  snprintf(a, sizeof a,
           "session create %s x --heads-kv 2 --head-dim 16 --max-tokens 8 --reserve some", S.url);
  expect_run(2, a, "--reserve is whole or grow", NULL);
  unlink(out);
}

Test(session_client, usage_and_unreachable) {
  srv_start(&S, NULL);
  char a[512];
  expect_run(0, "session --help", "usage: attn session create", NULL);
  expect_run(2, "session", "usage:", NULL);
  expect_run(2, "session frobnicate http://127.0.0.1:1 x", "unknown subcommand", NULL);
  snprintf(a, sizeof a, "session get %s", S.url);
  expect_run(2, a, "give URL and ID", NULL);
  snprintf(a, sizeof a, "session get %s _x", S.url);
  expect_run(2, a, "ID is 1-128", NULL);
  snprintf(a, sizeof a, "session create %s x --heads-kv 2 --head-dim 8", S.url);
  expect_run(2, a, "create needs --heads-kv, --head-dim and --max-tokens", NULL);
  snprintf(a, sizeof a, "session attend %s x --length 3", S.url);
  expect_run(2, a, "--length does not apply", NULL);
  snprintf(a, sizeof a, "session truncate %s x", S.url);
  expect_run(2, a, "truncate needs --length", NULL);
  snprintf(a, sizeof a, "session fork %s x", S.url);
  expect_run(2, a, "give URL, ID and NEW", NULL);
  snprintf(a, sizeof a, "session fork %s x _y", S.url);
  expect_run(2, a, "ID is 1-128", NULL);
  snprintf(a, sizeof a, "session attend %s nobody", S.url);
  expect_run(1, a, "HTTP 404 session_not_found", NULL);
  snprintf(a, sizeof a, "session get http://127.0.0.1:%d x", free_port());
  expect_run(1, a, "attn session: GET http://127.0.0.1:", NULL);
}

/* ---- attn load --session ------------------------------------------------ */

static double num(const cJSON *j, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
  cr_assert(cJSON_IsNumber(x), "no number %s", key);
  return x->valuedouble;
}

/* `attn load URL --session ... --json`'s object (the caller deletes it). */
static cJSON *load_json(int want_rc, const char *args) {
  char *out;
  int rc = run(&out, "load %s %s --json", S.url, args);
  cr_expect_eq(rc, want_rc, "attn load %s: exit %d:\n%s", args, rc, out);
  const char *brace = strchr(out, '{'); /* after the lines on stderr, if any */
  cJSON *j = brace ? cJSON_Parse(brace) : NULL;
  cr_assert(j, "attn load %s: not JSON:\n%s", args, out);
  free(out);
  return j;
}

Test(session_client, load_decodes) {
  srv_start(&S, NULL);
  cJSON *j = load_json(0, "--session 3 --steps 8 --shape 1,4,1,16 --shape-kv 1,2,1,16");
  cr_expect_eq(num(j, "sessions"), 3);
  cr_expect_eq(num(j, "steps_ok"), 24);
  cr_expect_eq(num(j, "steps_failed"), 0);
  cr_expect_eq(num(j, "created"), 3);
  cr_expect_eq(num(j, "deleted"), 3);
  cr_expect_eq(num(j, "stopped_early"), 0);
  cr_expect_eq(num(j, "tokens"), 24);
  /* the report carries a rate, which a benchmark judges, not this test */
  cr_expect(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "tokens_per_s")));
  const cJSON *lat = cJSON_GetObjectItemCaseSensitive(j, "latency_ms");
  cr_expect_eq(num(lat, "count"), 24);
  double p50 = num(lat, "p50"), p99 = num(lat, "p99"), mx = num(lat, "max");
  cr_expect(p50 >= 0 && p50 <= p99 && p99 <= mx, "percentiles out of order: p50 %g p99 %g max %g",
            p50, p99, mx);
  cJSON_Delete(j);
  /* a prefill first, two tokens a step, F16 */
  j = load_json(0, "--session 2 --steps 4 --prefill 9 --shape 1,2,2,8 --dtype F16");
  cr_expect_eq(num(j, "steps_ok"), 8);
  cr_expect_eq(num(j, "tokens"), 16);
  cr_expect_eq(num(j, "deleted"), 2);
  cJSON_Delete(j);
}

Test(session_client, load_refused_and_usage) {
  /* 1 MiB of session memory, and each session asks for about 33 MB: all 507 */
  srv_start(&S, "--session-memory", "1048576", NULL);
  cJSON *j = load_json(1, "--session 4 --steps 2 --shape 1,8,1,128 --prefill 4000");
  cr_expect_eq(num(j, "created"), 0);
  cr_expect_eq(num(j, "created"), num(j, "deleted"));
  cr_expect_eq(num(j, "first_error_status"), 507);
  cJSON_Delete(j);
  char a[512];
  snprintf(a, sizeof a, "load %s --session 2 --rate 5", S.url);
  expect_run(2, a, "--session excludes", NULL);
  snprintf(a, sizeof a, "load %s --steps 5", S.url);
  expect_run(2, a, "--steps and --prefill need --session", NULL);
  snprintf(a, sizeof a, "load %s --session 2 --shape 2,8,1,64", S.url);
  expect_run(2, a, "1,H,T,D", NULL);
  snprintf(a, sizeof a, "load http://127.0.0.1:%d --session 2 --steps 2", free_port());
  expect_run(1, a, "2 of 2 sessions could not be created", NULL);
}
