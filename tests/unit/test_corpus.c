/*
 * test_corpus.c — every input in the fuzz seed corpora (tests/fuzz/NAME/),
 * crash reproducers included, runs through its decoder here too, so each
 * `make test` (and its SAN=1 run) replays them: whatever a decoder answers,
 * it must not crash, leak or leave a half-built request behind.
 *
 * The decoders a unit test can call directly are replayed here; the others
 * (client replies, inflate) need their fuzz target's harness, and make
 * test replays every seed directory through its fuzzer as well
 * (make fuzz-replay). A seed directory with neither fails corpus.every_dir.
 */
#include "errors.h"
#include "parse.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
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

/* As fuzz_v2.c: four bytes of JSON length, then the body. */
static void replay_v2(const char *data, size_t len) {
  if (len < 4)
    return;
  const unsigned char *u = (const unsigned char *)data;
  size_t json_len = (size_t)(u[0] | u[1] << 8 | u[2] << 16 | (uint32_t)u[3] << 24) % (len - 3);
  attn_proto_req pr;
  attn_v2_info info;
  attn_status st;
  if (attn_proto_decode_v2(data + 4, len - 4, json_len, &pr, &info, &st) == 0) {
    cr_expect(pr.req.q && pr.req.k && pr.req.v && pr.req.o);
    attn_proto_req_free(&pr);
  } else {
    cr_expect(st.message[0], "an error without a message");
    cr_expect_lt(st.code, 0, "a refusal without a code: %s", st.message);
  }
}

/* As fuzz_parse.c: "name: value" lines into a request head, then its
 * verdict, which is 0 or a 400/501 with a message. */
static void replay_parse(const char *data, size_t len) {
  char *text = malloc(len + 1);
  memcpy(text, data, len);
  text[len] = 0;
  attnd_head h = {0};
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *colon = strchr(line, ':');
    if (colon) {
      *colon = 0;
      attnd_head_add(&h, line, colon + 1);
    }
  }
  char msg[300] = "";
  int code = attnd_head_check(&h, "HTTP/1.1", msg, sizeof msg);
  cr_expect(!code || code == ATTND_EBAD_REQUEST || code == ATTND_ENOT_IMPLEMENTED, "code %d", code);
  cr_expect(!code || msg[0], "a refusal without a message");
  free(text);
}

/* Every seed directory is replayed here or only by its fuzzer. */
Test(corpus, every_dir) {
  static const char *const here[] = {"safetensors", "json", "options", "v2", "parse", NULL};
  static const char *const fuzzer_only[] = {
      "http_reply", "inflate", "reply_json", "reply_safetensors", "session", "session_file", NULL};
  DIR *d = opendir("tests/fuzz");
  cr_assert(d, "cannot open tests/fuzz (run from the repository root)");
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || strchr(e->d_name, '.'))
      continue; /* fuzz_*.c and headers */
    bool known = false;
    for (int i = 0; here[i]; i++)
      known |= !strcmp(e->d_name, here[i]);
    for (int i = 0; fuzzer_only[i]; i++)
      known |= !strcmp(e->d_name, fuzzer_only[i]);
    cr_expect(known,
              "tests/fuzz/%s: a seed directory neither replayed in test_corpus.c nor listed "
              "there as replayed by its fuzzer only",
              e->d_name);
  }
  closedir(d);
}

Test(corpus, v2) { cr_expect_gt(replay_dir("tests/fuzz/v2", replay_v2), 0); }
Test(corpus, parse) { cr_expect_gt(replay_dir("tests/fuzz/parse", replay_parse), 0); }

Test(corpus, safetensors) {
  cr_expect_gt(replay_dir("tests/fuzz/safetensors", replay_safetensors), 0);
}
Test(corpus, json) { cr_expect_gt(replay_dir("tests/fuzz/json", replay_json), 0); }
Test(corpus, options) { cr_expect_gt(replay_dir("tests/fuzz/options", replay_options), 0); }
