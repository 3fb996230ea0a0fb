/*
 * test_config.c — attnd's flags parsed on their own (server/config.c): the
 * values the session flags give, with their suffixes, defaults, environment
 * fallbacks and refusals, and the API keys the config holds; values no HTTP
 * reply shows. tests/server/test_server.c drives the flags through attnd.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Each test runs in a process of its own (Criterion forks), so the
 * variables set here end with it; none from the shell may leak in. */
static void clear_env(void) {
  static const char *const vars[] = {"ATTND_SESSION_MEMORY", "ATTND_SESSION_DIR",
                                     "ATTND_SESSION_BATCH",  "ATTND_SESSION_TTL_MAX",
                                     "ATTND_API_KEY",        "ATTND_API_KEY_FILE",
                                     "ATTND_DETERMINISTIC",  "ATTND_SESSION_MEMORY_PER_KEY",
                                     "ATTND_TINY_FLOPS",     "ATTND_MAX_PAIRS",
                                     "ATTND_HANDOVER",       "ATTND_HANDOVER_TIMEOUT"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    unsetenv(vars[i]);
}
TestSuite(config, .init = clear_env);

static attnd_config C;

/* attnd_config_parse of "attnd" and the NULL-ended args. */
static int parse(const char *const *args) {
  static char store[16][1200];
  char *argv[18] = {store[0]};
  snprintf(store[0], sizeof store[0], "attnd");
  int argc = 1;
  for (; args && args[argc - 1] && argc < 16; argc++) {
    snprintf(store[argc], sizeof store[argc], "%s", args[argc - 1]);
    argv[argc] = store[argc];
  }
  return attnd_config_parse(&C, argc, argv);
}

#define PARSE(...) parse((const char *[]){__VA_ARGS__, NULL})

static char *tmpdir(void) {
  static char dir[64];
  snprintf(dir, sizeof dir, "/tmp/attnd-config-XXXXXX");
  cr_assert(mkdtemp(dir), "mkdtemp");
  return dir;
}

Test(config, session_defaults) {
  cr_assert_eq(parse(NULL), 0);
  uint64_t quarter = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGE_SIZE) / 4;
  cr_expect_eq(C.session_memory, quarter, "a quarter of physical memory: %llu, want %llu",
               (unsigned long long)C.session_memory, (unsigned long long)quarter);
  cr_expect(quarter > 0);
  cr_expect_str_empty(C.session_dir);
  cr_expect(C.session_batch);
  cr_expect_eq(C.session_ttl_max, 86400);
}

/* --handover: none by default; a base URL read once (its path without a
 * trailing '/', the port http's when not given), from the flag or the
 * variable; what the handover cannot use refused. */
Test(config, handover_url_and_timeout) {
  cr_assert_eq(parse(NULL), 0);
  cr_expect_str_empty(C.handover);
  cr_expect_eq(C.handover_timeout, 30);
  cr_assert_eq(PARSE("--handover", "http://proxy/base/", "--handover-timeout", "2.5"), 0);
  cr_expect_str_eq(C.handover, "http://proxy/base/");
  cr_expect_str_eq(C.handover_url.host, "proxy");
  cr_expect_eq(C.handover_url.port, 80);
  cr_expect_str_eq(C.handover_url.path, "/base");
  cr_expect_eq(C.handover_timeout, 2.5);
  setenv("ATTND_HANDOVER", "http://[::1]:8080", 1);
  cr_assert_eq(parse(NULL), 0);
  cr_expect(C.handover_url.ipv6 && C.handover_url.port == 8080);
  cr_expect_str_empty(C.handover_url.path);
  static const char *const bad[] = {"https://proxy", "proxy:8080?x", "http://u@proxy",
                                    "http://proxy:0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(PARSE("--handover", bad[i]), -1, "%s", bad[i]);
  cr_expect_eq(PARSE("--handover-timeout", "0"), -1);
  cr_expect_eq(PARSE("--handover-timeout", "3601"), -1);
}

Test(config, session_values_and_suffixes) {
  static const struct {
    const char *v;
    uint64_t want;
  } sizes[] = {
      {"0", 0},           {"1048576", 1048576}, {"512K", 512ull << 10}, {"512M", 512ull << 20},
      {"3g", 3ull << 30}, {"1024G", 1ull << 40}};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    cr_assert_eq(PARSE("--session-memory", sizes[i].v), 0, "%s", sizes[i].v);
    cr_expect_eq(C.session_memory, sizes[i].want, "%s: %llu", sizes[i].v,
                 (unsigned long long)C.session_memory);
  }
  cr_assert_eq(
      PARSE("--session-memory=auto", "--session-batch", "off", "--session-ttl-max", "3600"), 0);
  cr_expect_gt(C.session_memory, 0);
  cr_expect(!C.session_batch);
  cr_expect_eq(C.session_ttl_max, 3600);
  cr_assert_eq(PARSE("--session-batch", "on", "--session-ttl-max", "1"), 0);
  cr_expect(C.session_batch);
  cr_expect_eq(C.session_ttl_max, 1);
}

Test(config, session_environment_and_the_flag_that_wins) {
  char *dir = tmpdir();
  setenv("ATTND_SESSION_MEMORY", "1G", 1);
  setenv("ATTND_SESSION_DIR", dir, 1);
  setenv("ATTND_SESSION_BATCH", "off", 1);
  setenv("ATTND_SESSION_TTL_MAX", "60", 1);
  cr_assert_eq(parse(NULL), 0);
  cr_expect_eq(C.session_memory, 1ull << 30);
  cr_expect_str_eq(C.session_dir, dir);
  cr_expect(!C.session_batch);
  cr_expect_eq(C.session_ttl_max, 60);
  cr_assert_eq(PARSE("--session-memory", "2G", "--session-batch", "on"), 0);
  cr_expect_eq(C.session_memory, 2ull << 30, "the flag wins");
  cr_expect(C.session_batch, "the flag wins");
  setenv("ATTND_SESSION_TTL_MAX", "forever", 1);
  cr_expect_eq(parse(NULL), -1, "a bad variable is refused");
  rmdir(dir);
}

Test(config, session_dir_must_be_a_writable_directory) {
  char *dir = tmpdir(), file[128], ro[128];
  cr_assert_eq(PARSE("--session-dir", dir), 0);
  cr_expect_str_eq(C.session_dir, dir);
  snprintf(file, sizeof file, "%s/file", dir);
  FILE *f = fopen(file, "w");
  cr_assert(f);
  fclose(f);
  cr_expect_eq(PARSE("--session-dir", file), -1, "a file");
  cr_expect_eq(PARSE("--session-dir", "/nonexistent/attnd-sessions"), -1, "missing");
  cr_expect_eq(PARSE("--session-dir="), -1, "given but empty");
  snprintf(ro, sizeof ro, "%s/ro", dir);
  cr_assert_eq(mkdir(ro, 0500), 0);
  if (geteuid() != 0) /* root may write in any directory of a writable file system */
    cr_expect_eq(PARSE("--session-dir", ro), -1, "not writable");
  rmdir(ro);
  unlink(file);
  rmdir(dir);
}

Test(config, session_values_refused) {
  static const char *const bad[][2] = {
      {"--session-memory", "12Q"},   {"--session-memory", "-1"},   {"--session-memory", "0K"},
      {"--session-memory", "2048G"}, {"--session-memory", ""},     {"--session-batch", "yes"},
      {"--session-ttl-max", "0"},    {"--session-ttl-max", "0.5"}, {"--session-ttl-max", "1e9"},
      {"--session-ttl-max", "nan"},  {"--session-ttl-max", "1h"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(PARSE(bad[i][0], bad[i][1]), -1, "%s %s", bad[i][0], bad[i][1]);
}

/* --deterministic: on unless told, on|off as every boolean flag, the
 * variable as fallback; anything else refused. */
Test(config, deterministic_on_off_and_refused) {
  cr_assert_eq(parse(NULL), 0);
  cr_expect(C.deterministic, "the backward is deterministic by default");
  cr_assert_eq(PARSE("--deterministic", "off"), 0);
  cr_expect(!C.deterministic);
  cr_assert_eq(PARSE("--deterministic=on"), 0);
  cr_expect(C.deterministic);
  setenv("ATTND_DETERMINISTIC", "off", 1);
  cr_assert_eq(parse(NULL), 0);
  cr_expect(!C.deterministic, "the variable");
  cr_assert_eq(PARSE("--deterministic", "on"), 0);
  cr_expect(C.deterministic, "the flag wins");
  unsetenv("ATTND_DETERMINISTIC");
  static const char *const bad[] = {"yes", "true", "1", "", "OFF"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(PARSE("--deterministic", bad[i]), -1, "--deterministic \"%s\"", bad[i]);
}

/* --tiny-flops and --max-pairs: counts from 0, each within its bound, the
 * variable as fallback. */
Test(config, tiny_flops_and_max_pairs) {
  cr_assert_eq(parse(NULL), 0);
  cr_expect_eq(C.tiny_flops, 1048576, "1 MFLOP by default");
  cr_expect_eq(C.max_pairs, 0);
  cr_assert_eq(PARSE("--tiny-flops", "0", "--max-pairs", "4611686018427387904"), 0);
  cr_expect_eq(C.tiny_flops, 0);
  cr_expect_eq(C.max_pairs, 1ull << 62);
  setenv("ATTND_TINY_FLOPS", "8388608", 1);
  cr_assert_eq(parse(NULL), 0);
  cr_expect_eq(C.tiny_flops, 8388608, "the variable");
  unsetenv("ATTND_TINY_FLOPS");
  static const char *const bad[][2] = {
      {"--tiny-flops", "-1"},  {"--tiny-flops", ""},
      {"--tiny-flops", "1e6"}, {"--tiny-flops", "1099511627777"},
      {"--max-pairs", "x"},    {"--max-pairs", "4611686018427387905"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(PARSE(bad[i][0], bad[i][1]), -1, "%s %s", bad[i][0], bad[i][1]);
}

/* --api-key is one key named default; a key file's keys keep their names. */
Test(config, api_keys) {
  cr_assert_eq(parse(NULL), 0);
  cr_expect_eq(C.keys.n, 0);
  cr_assert_eq(PARSE("--api-key", "s3cret"), 0);
  cr_assert_eq(C.keys.n, 1);
  cr_expect_str_eq(C.keys.k[0].name, "default");
  cr_expect_str_eq(C.keys.k[0].key, "s3cret");
  char *dir = tmpdir(), path[128];
  snprintf(path, sizeof path, "%s/keys", dir);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs("# two\nalice:sk-a\nsk-b\n", f);
  fclose(f);
  cr_assert_eq(PARSE("--api-key-file", path), 0);
  cr_assert_eq(C.keys.n, 2);
  cr_expect_str_eq(C.keys.k[0].name, "alice");
  cr_expect_str_eq(C.keys.k[1].name, "key1");
  cr_expect_str_eq(C.api_key_file, path);
  unlink(path);
  rmdir(dir);
}

/* --session-memory-per-key: auto is half of the session memory under two
 * keys or more and no cap under one or none; a percentage is of
 * --session-memory whichever flag comes first; a size as given; 0 no cap. */
Test(config, session_memory_per_key) {
  char *dir = tmpdir(), keys[128];
  snprintf(keys, sizeof keys, "%s/keys", dir);
  FILE *f = fopen(keys, "w");
  cr_assert(f);
  fputs("a:key-aaaaaaaa\nb:key-bbbbbbbb\n", f);
  fclose(f);
  cr_assert_eq(PARSE("--session-memory", "1G", "--api-key-file", keys), 0);
  cr_expect_eq(C.session_memory_per_key, 512ull << 20, "auto under two keys: half");
  cr_assert_eq(PARSE("--session-memory", "1G", "--api-key", "key-aaaaaaaa"), 0);
  cr_expect_eq(C.session_memory_per_key, 0, "auto under one key: no cap");
  cr_assert_eq(PARSE("--session-memory", "1G"), 0);
  cr_expect_eq(C.session_memory_per_key, 0, "auto without keys: no cap");
  cr_assert_eq(PARSE("--session-memory-per-key", "25%", "--session-memory", "1G"), 0);
  cr_expect_eq(C.session_memory_per_key, 256ull << 20, "a percentage of the flag given after");
  cr_assert_eq(PARSE("--session-memory", "1G", "--session-memory-per-key", "300M"), 0);
  cr_expect_eq(C.session_memory_per_key, 300ull << 20);
  cr_assert_eq(
      PARSE("--session-memory", "1G", "--session-memory-per-key", "0", "--api-key-file", keys), 0);
  cr_expect_eq(C.session_memory_per_key, 0, "0: no cap, even under keys");
  setenv("ATTND_SESSION_MEMORY_PER_KEY", "100%", 1);
  cr_assert_eq(PARSE("--session-memory", "1G"), 0);
  cr_expect_eq(C.session_memory_per_key, 1ull << 30, "the variable");
  cr_assert_eq(PARSE("--session-memory", "1G", "--session-memory-per-key", "1M"), 0);
  cr_expect_eq(C.session_memory_per_key, 1ull << 20, "the flag wins");
  unsetenv("ATTND_SESSION_MEMORY_PER_KEY");
  const char *bad[] = {"0%", "101%", "%", "-1", "2.5%", "1T", "half", "50 %"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(PARSE("--session-memory-per-key", bad[i]), -1, "%s", bad[i]);
  unlink(keys);
  rmdir(dir);
}
