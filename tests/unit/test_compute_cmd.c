/*
 * test_compute_cmd.c — `attn compute IN OUT` end to end: a request file in, a
 * reply file out that decodes to the float64 reference; options from flags
 * and from __metadata__ (which wins); bad files get one line and status 2,
 * an unwritable OUT status 1, and OUT is never left half-written.
 */
#define _GNU_SOURCE
#include "helpers.h"
#include "reference.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/attn-compute-XXXXXX");
  cr_assert(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_expect_eq(system(cmd), 0);
}

static int run(const char *args, char *out, size_t cap) { return tattn("compute", args, out, cap); }

static void write_bytes(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f && fwrite(b, 1, n, f) == n);
  fclose(f);
}

static char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *b = malloc(1 << 22);
  *n = fread(b, 1, 1 << 22, f);
  fclose(f);
  return b;
}

/* c's tensors (with optional __metadata__) into DIR/in.safetensors; the
 * input and output paths into in and outp (128 bytes each). */
static void write_case(const tcase *c, const char *meta, char *in, char *outp) {
  size_t len;
  char *body = tsafetensors(c, meta, &len);
  snprintf(in, 128, "%s/in.safetensors", dir);
  snprintf(outp, 128, "%s/out.safetensors", dir);
  write_bytes(in, body, len);
  free(body);
}

/* The "o" (and "lse") tensors of a reply file, by a plain read of its
 * header: the tests do not trust the decoder they test. */
static const char *tensor_data(const char *file, size_t len, const char *name) {
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)(unsigned char)file[i] << (8 * i);
  cr_assert(8 + n <= len && (8 + n) % 8 == 0, "header of %llu bytes", (unsigned long long)n);
  char key[32];
  snprintf(key, sizeof key, "\"%s\":", name);
  const char *h = memmem(file + 8, n, key, strlen(key));
  cr_assert(h, "no tensor %s in the reply", name);
  const char *off = strstr(h, "data_offsets");
  cr_assert(off);
  unsigned long long begin = strtoull(strchr(off, '[') + 1, NULL, 10);
  return file + 8 + n + begin;
}

Test(compute, file_to_file, .init = setup, .fini = teardown) {
  tprob p = tprob_make(1, 4, 2, 33, 47, 24, ATTN_F32);
  p.causal = true;
  p.stats = true;
  tcase c;
  tcase_init(&c, &p, 5);
  char in[128], outp[128], args[400], msg[4096];
  write_case(&c, NULL, in, outp);
  snprintf(args, sizeof args, "%s %s --causal --stats --threads 2", in, outp);
  cr_assert_eq(run(args, msg, sizeof msg), 0, "%s", msg);
  cr_expect(strstr(msg, "GFLOP/s"), "%s", msg);
  size_t olen = 0;
  char *out = read_bytes(outp, &olen);
  cr_assert(out);
  /* put the reply's o and lse where tcheck() looks, and compare */
  memcpy(c.o, tensor_data(out, olen, "o"), (size_t)(4 * 33 * 24) * 4);
  memcpy(c.m, tensor_data(out, olen, "m"), 4 * 33 * 4);
  memcpy(c.l, tensor_data(out, olen, "l"), 4 * 33 * 4);
  memcpy(c.lse, tensor_data(out, olen, "lse"), 4 * 33 * 4);
  terr e = tcheck(&c);
  cr_expect_lt(e.o, 1e-5);
  cr_expect_lt(e.stats, 1e-5);
  cr_expect(e.masked_ok);
  free(out);
  tcase_free(&c);
}

/* __metadata__ says causal; the flags do not: the file wins, as over HTTP. */
Test(compute, metadata_options, .init = setup, .fini = teardown) {
  tprob p = tprob_make(1, 1, 1, 20, 20, 8, ATTN_BF16);
  p.causal = true;
  tcase c;
  tcase_init(&c, &p, 6);
  char in[128], outp[128], args[400], msg[4096];
  write_case(&c, "{\"causal\":\"true\"}", in, outp);
  snprintf(args, sizeof args, "%s %s", in, outp);
  cr_assert_eq(run(args, msg, sizeof msg), 0, "%s", msg);
  size_t olen = 0;
  char *out = read_bytes(outp, &olen);
  cr_assert(out);
  memcpy(c.o, tensor_data(out, olen, "o"), 20 * 8 * 2);
  cr_expect_lt(tcheck(&c).o, ttol(ATTN_BF16));
  free(out);
  tcase_free(&c);
}

Test(compute, bad_inputs_exit_2, .init = setup, .fini = teardown) {
  char in[128], outp[128], args[400], msg[4096];
  snprintf(in, sizeof in, "%s/bad.safetensors", dir);
  snprintf(outp, sizeof outp, "%s/out.safetensors", dir);
  write_bytes(in, "\x05\x00\x00\x00\x00\x00\x00\x00{\"q\":", 13);
  snprintf(args, sizeof args, "%s %s", in, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "%s", msg);
  cr_expect(strstr(msg, "bad.safetensors: "), "%s", msg);
  cr_expect_eq(strchr(msg, '\n'), msg + strlen(msg) - 1, "one line: %s", msg);
  cr_expect_neq(access(outp, F_OK), 0, "no output file after a failure");
  snprintf(args, sizeof args, "%s/missing.safetensors %s", dir, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "%s", msg);
  cr_expect(strstr(msg, "cannot read"), "%s", msg);
  cr_expect_eq(run("--scale abc x y", msg, sizeof msg), 2);
  cr_expect(strstr(msg, "option \"scale\" in the flags must be a finite number"), "%s", msg);
  cr_expect_eq(run("only-one-file", msg, sizeof msg), 2);
  cr_expect_eq(run("--help", msg, sizeof msg), 0);
  /* a valid file whose values are not finite: refused by the engine, status 2 */
  tprob p = tprob_make(1, 1, 1, 4, 4, 4, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 1);
  ((float *)c.k)[3] = NAN;
  size_t len;
  char *body = tsafetensors(&c, NULL, &len);
  write_bytes(in, body, len);
  snprintf(args, sizeof args, "%s %s", in, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "%s", msg);
  cr_expect(strstr(msg, "non-finite"), "%s", msg);
  /* an unwritable destination: status 1, nothing left behind */
  snprintf(args, sizeof args, "%s %s/no/such/dir/out.safetensors", in, dir);
  ((float *)c.k)[3] = 0;
  free(body);
  body = tsafetensors(&c, NULL, &len);
  write_bytes(in, body, len);
  cr_expect_eq(run(args, msg, sizeof msg), 1, "%s", msg);
  cr_expect(strstr(msg, "cannot write"), "%s", msg);
  free(body);
  tcase_free(&c);
}

/* attn compute with args, which must succeed: OUT's bytes (outp), their
 * length in *len. */
static char *run_read(const char *args, const char *outp, size_t *len) {
  char msg[4096];
  cr_assert_eq(run(args, msg, sizeof msg), 0, "%s", msg);
  char *out = read_bytes(outp, len);
  cr_assert(out);
  return out;
}

/* --isa picks the CPU kernel; generic runs everywhere, a name the engine
 * does not know is a usage error (exit 2, one message). */
Test(compute, isa_flag, .init = setup, .fini = teardown) {
  tprob p = tprob_make(1, 2, 1, 17, 29, 40, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 9);
  char in[128], outp[128], args[400], msg[4096];
  write_case(&c, NULL, in, outp);
  snprintf(args, sizeof args, "%s %s --isa generic", in, outp);
  size_t olen = 0;
  char *out = run_read(args, outp, &olen);
  memcpy(c.o, tensor_data(out, olen, "o"), (size_t)(2 * 17 * 40) * 4);
  cr_expect_lt(tcheck(&c).o, 1e-5);
  free(out);
  snprintf(args, sizeof args, "%s %s --isa mmx", in, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "%s", msg);
  cr_expect(strstr(msg, "mmx"), "%s", msg);
  tcase_free(&c);
}

/* --cpu-tune: amd and intel write the same bytes (the tunings change no
 * sum's order; under intel, on an AVX-512 kernel, these 8 heads of 4 query
 * blocks run as pairs of blocks), right against float64; a name not a
 * tuning is a usage error. */
Test(compute, cpu_tune_flag, .init = setup, .fini = teardown) {
  tprob p = tprob_make(1, 8, 8, 256, 256, 64, ATTN_F32);
  tcase c;
  tcase_init(&c, &p, 10);
  char in[128], outp[128], args[400], msg[4096];
  write_case(&c, NULL, in, outp);
  char *out[2] = {NULL, NULL};
  size_t olen[2] = {0, 0};
  const char *tunes[] = {"amd", "intel"};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "%s %s --cpu-tune %s", in, outp, tunes[i]);
    out[i] = run_read(args, outp, &olen[i]);
  }
  cr_expect(olen[0] == olen[1] && !memcmp(out[0], out[1], olen[0]), "amd and intel differ");
  memcpy(c.o, tensor_data(out[1], olen[1], "o"), (size_t)(8 * 256 * 64) * 4);
  cr_expect_lt(tcheck(&c).o, 1e-5);
  snprintf(args, sizeof args, "%s %s --cpu-tune zen", in, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "%s", msg);
  cr_expect(strstr(msg, "--cpu-tune expects auto, intel or amd"), "%s", msg);
  free(out[0]);
  free(out[1]);
  tcase_free(&c);
}

/* --backward: q, k, v, o, do in; dq, dk, dv out on the default backend,
 * against the float64 reference backward; o is the float64 forward's,
 * rounded to F32, as a caller would pass it. */
Test(compute, backward_file_to_file, .init = setup, .fini = teardown) {
  tprob p = tprob_make(1, 4, 2, 9, 12, 16, ATTN_F32);
  p.causal = true;
  tcase c;
  tcase_init(&c, &p, 7);
  size_t nq = 4 * 9 * 16, nk = 2 * 12 * 16;
  float *dout = malloc(nq * 4), *o = c.o;
  double *o64 = malloc(nq * sizeof *o64);
  attn_status st;
  cr_assert_eq(attn_reference(&c.req, o64, NULL, NULL, NULL, &st), 0, "%s", st.message);
  uint64_t seed = 3;
  for (size_t i = 0; i < nq; i++) {
    dout[i] = (float)tuniform(&seed);
    o[i] = (float)o64[i];
  }
  free(o64);
  /* the file: q, k, v, o, do back to back, written here */
  char h[512];
  int n = snprintf(h, sizeof h,
                   "{\"q\":{\"dtype\":\"F32\",\"shape\":[4,9,16],\"data_offsets\":[0,%zu]},"
                   "\"k\":{\"dtype\":\"F32\",\"shape\":[2,12,16],\"data_offsets\":[%zu,%zu]},"
                   "\"v\":{\"dtype\":\"F32\",\"shape\":[2,12,16],\"data_offsets\":[%zu,%zu]},"
                   "\"o\":{\"dtype\":\"F32\",\"shape\":[4,9,16],\"data_offsets\":[%zu,%zu]},"
                   "\"do\":{\"dtype\":\"F32\",\"shape\":[4,9,16],\"data_offsets\":[%zu,%zu]}}",
                   nq * 4, nq * 4, nq * 4 + nk * 4, nq * 4 + nk * 4, nq * 4 + nk * 8,
                   nq * 4 + nk * 8, nq * 8 + nk * 8, nq * 8 + nk * 8, nq * 12 + nk * 8);
  size_t len = 8 + (size_t)n + nq * 12 + nk * 8;
  char *file = malloc(len), *d = file + 8 + n;
  for (int i = 0; i < 8; i++)
    file[i] = (char)((uint64_t)n >> (8 * i));
  memcpy(file + 8, h, (size_t)n);
  const void *parts[5] = {c.q, c.k, c.v, o, dout};
  size_t sizes[5] = {nq * 4, nk * 4, nk * 4, nq * 4, nq * 4};
  for (int i = 0; i < 5; i++, d += sizes[i - 1])
    memcpy(d, parts[i], sizes[i]);
  char in[128], outp[128], args[400], msg[4096];
  snprintf(in, sizeof in, "%s/in.safetensors", dir);
  snprintf(outp, sizeof outp, "%s/out.safetensors", dir);
  write_bytes(in, file, len);
  snprintf(args, sizeof args, "%s %s --backward --causal", in, outp);
  cr_assert_eq(run(args, msg, sizeof msg), 0, "%s", msg);
  cr_expect(strstr(msg, "backward"), "%s", msg);
  size_t olen = 0;
  char *out = read_bytes(outp, &olen);
  cr_assert(out);
  attn_request br = c.req;
  br.pass = ATTN_BACKWARD;
  br.dout = dout;
  double *ref = malloc((nq + 2 * nk) * sizeof *ref);
  br.dq = br.dk = br.dv = ref;
  cr_assert_eq(attn_reference_backward(&br, ref, ref + nq, ref + nq + nk, &st), 0, "%s",
               st.message);
  static const char *const names[3] = {"dq", "dk", "dv"};
  for (int g = 0; g < 3; g++) {
    size_t cnt = g ? nk : nq, base = g ? nq + (size_t)(g - 1) * nk : 0;
    const char *x = tensor_data(out, olen, names[g]);
    double num = 0, den = 0;
    for (size_t i = 0; i < cnt; i++) {
      float v;
      memcpy(&v, x + 4 * i, 4);
      num += (v - ref[base + i]) * (v - ref[base + i]);
      den += ref[base + i] * ref[base + i];
    }
    cr_expect_lt(sqrt(num / den), 1e-5, "%s", names[g]);
  }
  snprintf(args, sizeof args, "%s %s --backward --stats", in, outp);
  cr_expect_eq(run(args, msg, sizeof msg), 2, "--backward --stats: %s", msg);
  free(ref);
  free(out);
  free(file);
  free(dout);
  tcase_free(&c);
}
