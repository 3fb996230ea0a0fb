/*
 * test_corpus.c — every input in the fuzz seed corpora (tests/fuzz/NAME/),
 * crash reproducers included, runs through its decoder here too, so each
 * `make test` (and its SAN=1 run) replays them: whatever a decoder answers,
 * it must not crash, leak or leave a half-built request behind.
 */
#include "proto.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*replay_fn)(const char *data, size_t len);

static int replay_dir(const char *dir, replay_fn fn) {
  DIR *d = opendir(dir);
  cr_assert(d, "cannot open %s (run from the repository root)", dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    char *buf = malloc(1 << 20);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    fn(buf, len);
    free(buf);
    n++;
  }
  closedir(d);
  return n;
}

static void replay_safetensors(const char *data, size_t len) {
  attn_proto_req pr;
  attn_status st;
  if (attn_proto_decode_safetensors(data, len, NULL, &pr, &st) == 0) {
    cr_expect(pr.req.q && pr.req.k && pr.req.v && pr.req.o);
    attn_proto_req_free(&pr);
  } else {
    cr_expect(st.message[0], "an error without a message");
    cr_expect_neq(attn_proto_http_status(st.code), 500, "%s", st.message);
  }
}

static void replay_json(const char *data, size_t len) {
  attn_proto_req pr;
  attn_status st;
  if (attn_proto_decode_json(data, len, NULL, &pr, &st) == 0) {
    cr_expect(pr.req.q && pr.req.k && pr.req.v && pr.req.o);
    attn_proto_req_free(&pr);
  } else {
    cr_expect(st.message[0], "an error without a message");
    cr_expect_neq(attn_proto_http_status(st.code), 500, "%s", st.message);
  }
}

static void replay_options(const char *data, size_t len) {
  char *s = malloc(len + 1);
  memcpy(s, data, len);
  s[len] = 0;
  attn_options o;
  attn_status st;
  attn_options_init(&o);
  if (attn_options_parse_query(&o, s, &st) < 0)
    cr_expect(st.code == ATTN_PROTO_EOPTION || st.code == ATTN_PROTO_EOPTVALUE, "%s", st.message);
  free(s);
}

Test(corpus, safetensors) {
  cr_expect_gt(replay_dir("tests/fuzz/safetensors", replay_safetensors), 0);
}
Test(corpus, json) { cr_expect_gt(replay_dir("tests/fuzz/json", replay_json), 0); }
Test(corpus, options) { cr_expect_gt(replay_dir("tests/fuzz/options", replay_options), 0); }
