/*
 * test_kvfile.c — sessions saved to a directory and loaded into a new
 * store (engine/kv/save.c, load.c): every byte of every token, the
 * lengths, shapes, largest |k| and |v| and remaining TTL come back; expired sessions are not saved;
 * a damaged, truncated, foreign or renamed file is moved aside with a log
 * line and never served; a store too small for a file, a session the store
 * has already, a save's stale temporary file, and directories that cannot
 * be used. A file saved from pages of one size loads into pages of
 * another, its next calls computed (against float64) over its history.
 *
 * The sessions are filled through the store's insides (kv/kv_int.h)
 * under its lock, as sched.c stores a call's rows: a call cannot compute
 * over them yet, and persistence is about the bytes, not the attention.
 */
#define _GNU_SOURCE
#include "helpers.h"
#include "kv/file.h"
#include "kvcalls.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/attn-kvfile-XXXXXX");
  cr_assert(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  chmod(dir, 0700);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_expect_eq(system(cmd), 0);
}

/* ---- the log ------------------------------------------------------------- */

typedef struct logbuf {
  int n;
  char lines[16][1024];
} logbuf;

static void on_log(const char *line, void *arg) {
  logbuf *lb = arg;
  cr_expect_null(strchr(line, '\n'), "a log line holds a newline: %s", line);
  if (lb->n < 16)
    snprintf(lb->lines[lb->n], sizeof lb->lines[0], "%s", line);
  lb->n++;
}

/* The line naming file `name` (as "dir/name:"), or NULL. */
static const char *line_of(const logbuf *lb, const char *name) {
  char want[256];
  snprintf(want, sizeof want, "%s/%s:", dir, name);
  for (int i = 0; i < lb->n && i < 16; i++)
    if (strstr(lb->lines[i], want))
      return lb->lines[i];
  return NULL;
}

/* ---- sessions filled through the store's insides ---------------------- */

typedef struct spec {
  const char *tenant, *id;
  attn_kv_shape sh;
  int64_t len[4];
  double made; /* its create (its last use) */
  uint32_t seed;
} spec;

static attn_kv_store *store(uint64_t bytes) {
  attn_kv_store *s;
  attn_status st;
  cr_assert_eq(attn_kv_open(NULL, bytes, false, "cpu", &s, &st), 0, "%s", st.message);
  return s;
}

#define TTL 600.0

/* Byte b of row j of K (t 0) or V (t 1), head h, layer l of a session. */
static unsigned char pat(uint32_t seed, int64_t l, int t, int64_t h, int64_t j, size_t b) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)(l * 1000003 + t * 7919 + h * 104729);
  x ^= (uint64_t)j * 0xbf58476d1ce4e5b9ull + b * 0x94d049bb133111ebull;
  x ^= x >> 31;
  x *= 0xd6e9f5a3c4b2e1f7ull;
  return (unsigned char)(x >> 56);
}

static float amax(int64_t l, int t) { return (float)l + (t ? 0.25f : 0.5f); }

/* Row j of K (t 0) or V (t 1), head h, layer l: pat's bytes with bits of
 * each element's exponent cleared, so that every element is finite and
 * under 0.25 (under amax), as a file must hold. */
static void fill_row(const spec *p, int64_t l, int t, int64_t h, int64_t j, unsigned char *r) {
  const size_t es = attn_dtype_size(p->sh.dtype), row = (size_t)p->sh.head_dim * es;
  for (size_t b = 0; b < row; b++)
    r[b] = pat(p->seed, l, t, h, j, b);
  for (size_t e = 0; e < row; e += es)
    if (es == 4) { /* exponent at most 124 */
      uint32_t x;
      memcpy(&x, r + e, 4);
      x &= ~(0x40000000u | 0x01800000u);
      memcpy(r + e, &x, 4);
    } else { /* F16: exponent at most 12; BF16: as F32 */
      uint16_t x;
      memcpy(&x, r + e, 2);
      x &= (uint16_t) ~(p->sh.dtype == ATTN_F16 ? 0x4c00u : 0x4180u);
      memcpy(r + e, &x, 2);
    }
}

static void make(attn_kv_store *s, const spec *p) {
  bool created;
  attn_status st;
  cr_assert_eq(attn_kv_create(s, p->tenant, p->id, &p->sh, TTL, p->made, &created, &st), 0, "%s",
               st.message);
  const size_t row = (size_t)p->sh.head_dim * attn_dtype_size(p->sh.dtype);
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, p->tenant, p->id, p->made);
  cr_assert(ks);
  unsigned char *r = malloc(row);
  for (int64_t l = 0; l < p->sh.layers; l++) {
    kv_layer *L = &ks->layers[l];
    attn__kv_grow(s, ks, L, p->len[l]);
    for (int t = 0; t < 2; t++)
      for (int64_t h = 0; h < p->sh.heads_kv; h++)
        for (int64_t j = 0; j < p->len[l]; j++) {
          fill_row(p, l, t, h, j, r);
          cr_assert_eq(attn__kv_rows_put(s, ks, L, t, h, j, 1, r, &st), 0, "%s", st.message);
        }
    L->length = p->len[l];
    L->absmax[0] = amax(l, 0);
    L->absmax[1] = amax(l, 1);
  }
  pthread_mutex_unlock(&s->mu);
  free(r);
}

/* Session p in s as it was made, with `left` seconds of its TTL at now. */
static void expect_same(attn_kv_store *s, const spec *p, double now, double left) {
  attn_kv_info info;
  attn_status st;
  int64_t lens[4] = {-1, -1, -1, -1};
  cr_assert_eq(attn_kv_get(s, p->tenant, p->id, now, &info, lens, 4, &st), 0, "('%s', '%s'): %s",
               p->tenant, p->id, st.message);
  const attn_kv_shape *x = &info.shape, *y = &p->sh; /* not memcmp: the padding after dtype */
  cr_expect(x->heads_kv == y->heads_kv && x->head_dim == y->head_dim && x->dtype == y->dtype &&
                x->layers == y->layers && x->max_tokens == y->max_tokens,
            "('%s', '%s'): another shape", p->tenant, p->id);
  cr_expect_eq(info.ttl_s, TTL);
  cr_expect_leq(fabs(info.expires - now - left), 1.0, "('%s', '%s'): %g s left, not %g", p->tenant,
                p->id, info.expires - now, left);
  const size_t row = (size_t)p->sh.head_dim * attn_dtype_size(p->sh.dtype);
  pthread_mutex_lock(&s->mu);
  kv_session *ks = attn__kv_find(s, p->tenant, p->id, now);
  int64_t bad = 0;
  unsigned char *r = malloc(row), *w = malloc(row);
  for (int64_t l = 0; l < p->sh.layers; l++) {
    const kv_layer *L = &ks->layers[l];
    cr_expect_eq(lens[l], p->len[l], "('%s', '%s') layer %lld", p->tenant, p->id, (long long)l);
    cr_expect_eq(L->absmax[0], amax(l, 0));
    cr_expect_eq(L->absmax[1], amax(l, 1));
    for (int t = 0; t < 2; t++)
      for (int64_t h = 0; h < p->sh.heads_kv; h++)
        for (int64_t j = 0; j < L->length && j < p->len[l]; j++) {
          cr_assert_eq(attn__kv_rows_get(s, ks, L, t, h, j, 1, r, &st), 0, "%s", st.message);
          fill_row(p, l, t, h, j, w);
          for (size_t b = 0; b < row; b++)
            bad += r[b] != w[b];
        }
  }
  pthread_mutex_unlock(&s->mu);
  free(r);
  free(w);
  cr_expect_eq(bad, 0, "('%s', '%s'): %lld bytes differ", p->tenant, p->id, (long long)bad);
}

static void expect_gone(attn_kv_store *s, const char *tenant, const char *id, double now) {
  attn_kv_info info;
  attn_status st;
  cr_expect_eq(attn_kv_get(s, tenant, id, now, &info, NULL, 0, &st), ATTN_ESESSION_NOT_FOUND,
               "('%s', '%s') is served", tenant, id);
}

/* ---- files --------------------------------------------------------------- */

static char *path_of(const char *name) {
  static char p[4][256];
  static int i;
  i = (i + 1) % 4;
  snprintf(p[i], sizeof p[i], "%s/%s", dir, name);
  return p[i];
}

static bool exists(const char *name) { return access(path_of(name), F_OK) == 0; }

static long file_size(const char *name) {
  struct stat sb;
  return stat(path_of(name), &sb) ? -1 : (long)sb.st_size;
}

/* The file a format-version-1 file of p is: header, rows, checksum. */
static long expected_size(const spec *p) {
  long n = KVF_FIXED + (long)strlen(p->tenant) + (long)strlen(p->id) + 16 * p->sh.layers + 8;
  for (int64_t l = 0; l < p->sh.layers; l++)
    n += 2 * p->sh.heads_kv * p->len[l] * p->sh.head_dim * (long)attn_dtype_size(p->sh.dtype);
  return n;
}

/* Names in dir ending in suffix. */
static int count_suffix(const char *suffix) {
  DIR *d = opendir(dir);
  int n = 0;
  cr_assert(d);
  for (struct dirent *de; (de = readdir(d));) {
    size_t a = strlen(de->d_name), b = strlen(suffix);
    n += a >= b && !strcmp(de->d_name + a - b, suffix);
  }
  closedir(d);
  return n;
}

static void write_bytes(const char *name, const void *b, size_t n) {
  FILE *f = fopen(path_of(name), "wb");
  cr_assert(f && fwrite(b, 1, n, f) == n);
  fclose(f);
}

static unsigned char *read_bytes(const char *name, size_t *n) {
  FILE *f = fopen(path_of(name), "rb");
  cr_assert(f, "%s: %s", name, strerror(errno));
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  unsigned char *b = malloc(*n ? *n : 1);
  cr_assert(b && fread(b, 1, *n, f) == *n);
  fclose(f);
  return b;
}

static void flip(const char *name, size_t at) {
  size_t n;
  unsigned char *b = read_bytes(name, &n);
  cr_assert_lt(at, n);
  b[at] ^= 0x10;
  write_bytes(name, b, n);
  free(b);
}

static void save_ok(attn_kv_store *s, double now, int64_t want) {
  attn_status st;
  int64_t n = attn_kv_save(s, dir, now, &st);
  cr_assert_eq(n, want, "saved %lld: %s", (long long)n, n < 0 ? st.message : "");
}

/* The server's --session-ttl-max in these tests, past every TTL here. */
#define TTL_MAX 1e9

static int64_t load(attn_kv_store *s, double now, logbuf *lb) {
  attn_status st;
  int64_t n = attn_kv_load(s, dir, now, TTL_MAX, on_log, lb, &st);
  cr_assert_geq(n, 0, "%s", st.message);
  return n;
}

/* ---- tests --------------------------------------------------------------- */

#define F32_2x128                                                                      \
  {                                                                                    \
    .heads_kv = 2, .head_dim = 128, .dtype = ATTN_F32, .layers = 3, .max_tokens = 1000 \
  } /* 128 tokens a page */

static const spec mixed[] = {
    {"", "alpha", F32_2x128, {300, 0, 129}, 1000, 1},
    {"alice",
     "alpha",
     {.heads_kv = 1, .head_dim = 64, .dtype = ATTN_F16, .layers = 2, .max_tokens = 2000},
     {513, 1},
     1100,
     2},
    {"_",
     "alpha",
     {.heads_kv = 3, .head_dim = 80, .dtype = ATTN_BF16, .layers = 1, .max_tokens = 800},
     {385},
     1150,
     3}, /* 384 a page */
    {"t.1-x",
     "a.b_c-9",
     {.heads_kv = 1, .head_dim = 1, .dtype = ATTN_F32, .layers = 2, .max_tokens = 20000},
     {16385, 7},
     1000,
     4},
    {"bob",
     "empty",
     {.heads_kv = 2, .head_dim = 16, .dtype = ATTN_BF16, .layers = 2, .max_tokens = 10},
     {0, 0},
     1199,
     5},
};
#define NMIXED (int)(sizeof mixed / sizeof mixed[0])

static const char *mixed_files[] = {"@alpha.kv", "alice@alpha.kv", "_@alpha.kv", "t.1-x@a.b_c-9.kv",
                                    "bob@empty.kv"};

/* Tenants "", "alice" and "_" with one id, three dtypes, lengths across
 * and short of page ends, empty layers: all back, byte for byte, in a store
 * whose clock starts elsewhere (a new process). */
Test(kvfile, round_trip, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  for (int i = 0; i < NMIXED; i++)
    make(a, &mixed[i]);
  save_ok(a, 1200, NMIXED);
  for (int i = 0; i < NMIXED; i++) {
    cr_expect(exists(mixed_files[i]), "no %s", mixed_files[i]);
    cr_expect_eq(file_size(mixed_files[i]), expected_size(&mixed[i]), "%s: %ld bytes, not %ld",
                 mixed_files[i], file_size(mixed_files[i]), expected_size(&mixed[i]));
  }
  cr_expect_eq(count_suffix(".tmp"), 0);
  logbuf lb = {0};
  cr_assert_eq(load(b, 50, &lb), NMIXED);
  cr_expect_eq(lb.n, 0, "logged: %s", lb.lines[0]);
  for (int i = 0; i < NMIXED; i++)
    expect_same(b, &mixed[i], 50, TTL - (1200 - mixed[i].made));
  attn_kv_stats x, y;
  attn_kv_stats_get(a, &x);
  attn_kv_stats_get(b, &y);
  cr_expect_eq(y.sessions, NMIXED);
  cr_expect_eq(y.reserved_bytes, x.reserved_bytes);
  cr_expect_eq(y.used_bytes, x.used_bytes, "the pages holding tokens: %llu, not %llu",
               (unsigned long long)y.used_bytes, (unsigned long long)x.used_bytes);
  cr_expect_eq(y.expired, 0);
  /* loaded files are removed: a session deleted now must not come back */
  cr_expect_eq(count_suffix(".kv"), 0);
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A second save renames over the first; the load reads the second. */
Test(kvfile, save_replaces, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(16 << 20), *b = store(16 << 20);
  spec p = mixed[0];
  make(a, &p);
  save_ok(a, 1100, 1);
  attn_status st;
  cr_assert_eq(attn_kv_delete(a, p.tenant, p.id, 1100, &st), 0);
  p.len[0] = 77, p.len[1] = 200, p.len[2] = 1, p.seed = 9, p.made = 1150;
  make(a, &p);
  save_ok(a, 1200, 1);
  logbuf lb = {0};
  cr_assert_eq(load(b, 0, &lb), 1);
  expect_same(b, &p, 0, TTL - 50);
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A session whose TTL passed at the save is not written. */
Test(kvfile, expired_not_saved, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(16 << 20);
  spec live = mixed[1], old = mixed[1];
  old.id = "old";
  old.made = 1000 - TTL + 10; /* expires at 1010 */
  live.made = 1000;
  make(a, &live);
  make(a, &old);
  save_ok(a, 1010, 1);
  cr_expect(exists("alice@alpha.kv"));
  cr_expect(!exists("alice@old.kv"));
  save_ok(a, 1000 + TTL, 0); /* both expired */
  attn_kv_close(a);
}

/* Damage of every kind: each file moved to .bad with a line naming it,
 * none served, and the good one loaded. */
Test(kvfile, bad_files_set_aside, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  static const char *ids[] = {"good", "flip", "head", "len", "trunc", "version", "moved"};
  spec p[7];
  for (int i = 0; i < 7; i++) {
    p[i] = mixed[0];
    p[i].id = ids[i];
    p[i].seed = (uint32_t)i;
    make(a, &p[i]);
  }
  save_ok(a, 1100, 7);
  flip("@flip.kv", (size_t)file_size("@flip.kv") / 2); /* a row */
  flip("@head.kv", KVF_FIXED + 4 + 16 * 2 + 8 + 2);    /* layer 2's largest |k|: 2.5 -> 2.75 */
  flip("@len.kv", KVF_FIXED + 3 + 16 * 2 + 2);         /* layer 2's length: 129 + 2^20 */
  cr_assert_eq(truncate(path_of("@trunc.kv"), file_size("@trunc.kv") - 1), 0);
  flip("@version.kv", 8);
  cr_assert_eq(rename(path_of("@moved.kv"), path_of("@other.kv")), 0);
  char junk[200];
  memset(junk, 'G', sizeof junk);
  write_bytes("x@garbage.kv", junk, sizeof junk);
  write_bytes("x@empty.kv", "", 0);
  cr_assert_eq(mkdir(path_of("x@dir.kv"), 0700), 0);
  logbuf lb = {0};
  cr_assert_eq(load(b, 0, &lb), 1, "a damaged file loaded");
  expect_same(b, &p[0], 0, TTL - 100);
  static const struct {
    const char *file, *why;
  } bad[] = {{"@flip.kv", "checksum"},
             {"@head.kv", "checksum"},
             {"@len.kv", "layer 2's length"},
             {"@trunc.kv", "truncated"},
             {"@version.kv", "version 20"},
             {"@other.kv", "@moved.kv"},
             {"x@garbage.kv", "not a session file"},
             {"x@empty.kv", "0 bytes"},
             {"x@dir.kv", "not a regular file"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char aside[128];
    snprintf(aside, sizeof aside, "%s.bad", bad[i].file);
    const char *line = line_of(&lb, bad[i].file);
    cr_expect(line && strstr(line, "moved to") && strstr(line, bad[i].why), "%s: logged '%s'",
              bad[i].file, line ? line : "nothing");
    cr_expect(exists(aside) && !exists(bad[i].file), "%s was not moved aside", bad[i].file);
  }
  cr_expect_eq(lb.n, 9);
  for (int i = 1; i < 7; i++)
    expect_gone(b, "", ids[i], 0);
  expect_gone(b, "x", "garbage", 0);
  /* the sessions made and dropped for the damaged rows hold nothing */
  attn_kv_stats y;
  attn_kv_stats_get(b, &y);
  cr_expect_eq(y.sessions, 1);
  cr_expect_eq(y.reserved_bytes, attn_kv_reserve_bytes(b, &p[0].sh));
  cr_expect_eq(y.expired, 0);
  /* a second start finds only the .bad files, and leaves them */
  lb.n = 0;
  cr_expect_eq(load(b, 0, &lb), 0);
  cr_expect_eq(lb.n, 0);
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A store too small for a file sets it aside, saying what to do; the
 * session that fits loads. */
Test(kvfile, store_too_small, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(1 << 20);
  spec big = mixed[0], small = mixed[1]; /* 6 MiB reserved, and 1 MiB */
  make(a, &big);
  make(a, &small);
  save_ok(a, 1150, 2);
  logbuf lb = {0};
  cr_assert_eq(load(b, 0, &lb), 1);
  expect_same(b, &small, 0, TTL - 50);
  expect_gone(b, "", "alpha", 0);
  const char *line = line_of(&lb, "@alpha.kv");
  cr_expect(line && strstr(line, "--session-memory") && strstr(line, "moved to @alpha.kv.bad"),
            "logged '%s'", line ? line : "nothing");
  attn_kv_stats y;
  attn_kv_stats_get(b, &y);
  cr_expect_eq(y.reserved_bytes, attn_kv_reserve_bytes(b, &small.sh));
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A session the store has already keeps its tokens; the file stays. */
Test(kvfile, already_in_store, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(16 << 20), *b = store(16 << 20);
  spec p = mixed[1], fresh = mixed[1];
  make(a, &p);
  save_ok(a, 1200, 1);
  fresh.len[0] = 5, fresh.len[1] = 0, fresh.seed = 77;
  make(b, &fresh);
  logbuf lb = {0};
  cr_assert_eq(load(b, 1200, &lb), 0);
  const char *line = line_of(&lb, "alice@alpha.kv");
  cr_expect(line && strstr(line, "left in place") && strstr(line, "already"), "logged '%s'",
            line ? line : "nothing");
  cr_expect(exists("alice@alpha.kv"));
  expect_same(b, &fresh, 1200, TTL - (1200 - fresh.made));
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A save that stopped before its rename left a temporary file: removed. */
Test(kvfile, stale_temporary_removed, .init = setup, .fini = teardown) {
  attn_kv_store *b = store(1 << 20);
  write_bytes("a@half.kv.tmp", "ATTNKV1\n", 8);
  logbuf lb = {0};
  cr_expect_eq(load(b, 0, &lb), 0);
  const char *line = line_of(&lb, "a@half.kv.tmp");
  cr_expect(line && strstr(line, "removed"), "logged '%s'", line ? line : "nothing");
  cr_expect(!exists("a@half.kv.tmp"));
  write_bytes("notes.txt", "an operator's", 13); /* not ours: untouched, unlogged */
  lb.n = 0;
  cr_expect_eq(load(b, 0, &lb), 0);
  cr_expect_eq(lb.n, 0);
  cr_expect(exists("notes.txt"));
  write_bytes("x@y.kv", "", 0); /* without a log: still set aside */
  cr_expect_eq(attn_kv_load(b, dir, 0, TTL_MAX, NULL, NULL, NULL), 0);
  cr_expect(exists("x@y.kv.bad"));
  attn_kv_close(b);
}

/* An empty store saves nothing (the directory's fsync still runs); a
 * missing directory, or a file given as one, is an error naming it. */
Test(kvfile, directories, .init = setup, .fini = teardown) {
  attn_kv_store *s = store(1 << 20);
  attn_status st;
  cr_expect_eq(attn_kv_save(s, dir, 0, &st), 0, "%s", st.message);
  char missing[128];
  snprintf(missing, sizeof missing, "%s/none", dir);
  cr_expect_eq(attn_kv_save(s, missing, 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, missing) && strstr(st.message, strerror(ENOENT)), "%s", st.message);
  cr_expect_eq(attn_kv_load(s, missing, 0, TTL_MAX, NULL, NULL, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, missing), "%s", st.message);
  write_bytes("file", "x", 1);
  cr_expect_eq(attn_kv_save(s, path_of("file"), 0, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, strerror(ENOTDIR)), "%s", st.message);
  attn_kv_close(s);
}

/* Saves s into dir, whose mode lets no one write; 0 when the error names
 * the file, EACCES and the count. Runs in a child process under root. */
static int save_refused(attn_kv_store *s) {
  attn_status st;
  if (attn_kv_save(s, dir, 1200, &st) == ATTN_EINVAL && strstr(st.message, "alice@alpha.kv") &&
      strstr(st.message, strerror(EACCES)) && strstr(st.message, "0 of 1"))
    return 0;
  fprintf(stderr, "save into a directory of mode 0500: %s\n", st.message);
  return 1;
}

/* A directory that cannot be written to: the error names the file and the
 * reason. Root writes whatever the mode says, so under root the save runs
 * as nobody, in a child process. */
Test(kvfile, unwritable_directory, .init = setup, .fini = teardown) {
  attn_kv_store *s = store(16 << 20);
  make(s, &mixed[1]);
  cr_assert_eq(chmod(dir, 0500), 0);
  if (geteuid() != 0) {
    cr_expect_eq(save_refused(s), 0);
  } else {
    cr_assert_eq(chown(dir, 65534, 65534), 0);
    pid_t pid = fork();
    if (pid == 0)
      _exit(setgid(65534) || setuid(65534) ? 2 : save_refused(s));
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the child saved (status %d)", ws);
  }
  attn_kv_close(s);
}

/* A write that fails midway (here: past RLIMIT_FSIZE) leaves no
 * temporary file; the sessions that fit are still saved. */
Test(kvfile, write_fails_midway, .init = setup, .fini = teardown) {
  attn_kv_store *s = store(64 << 20);
  spec big = mixed[0], small = mixed[1]; /* 429 KiB of rows, and 512 bytes */
  small.len[0] = 1;
  make(s, &big);
  make(s, &small);
  signal(SIGXFSZ, SIG_IGN); /* the write fails with EFBIG instead */
  struct rlimit rl = {256 << 10, 256 << 10};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  attn_status st;
  cr_expect_eq(attn_kv_save(s, dir, 1200, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "@alpha.kv") && strstr(st.message, strerror(EFBIG)) &&
                strstr(st.message, "1 of 2"),
            "%s", st.message);
  cr_expect(exists("alice@alpha.kv"));
  cr_expect(!exists("@alpha.kv"));
  cr_expect_eq(count_suffix(".tmp"), 0);
  attn_kv_close(s);
}

/* A tenant no file name can hold (the store takes any string: the
 * server's key names are checked there) is refused, never a path out of
 * the directory; the others are saved. */
Test(kvfile, tenant_not_a_name, .init = setup, .fini = teardown) {
  attn_kv_store *s = store(16 << 20);
  spec p = mixed[1], q = mixed[1];
  p.tenant = "../up";
  make(s, &p);
  make(s, &q);
  attn_status st;
  cr_expect_eq(attn_kv_save(s, dir, 1200, &st), ATTN_EINVAL);
  cr_expect(strstr(st.message, "1 of 2") && strstr(st.message, "no file name"), "%s", st.message);
  cr_expect(exists("alice@alpha.kv"));
  cr_expect_eq(count_suffix(".kv"), 1);
  attn_kv_close(s);
}

/* ---- forged files: a valid checksum over values a call would refuse ----- */

/* The file's checksum as the format defines it (kv/file.h): FNV-1a's
 * 64-bit constants a little-endian word at a time, h ^= h >> 32 after each,
 * the last 1-7 bytes zero-padded, then the byte count. */
static uint64_t sum_of(const unsigned char *b, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull, w;
  size_t i = 0;
  for (;; i += 8) {
    w = 0;
    if (i >= n)
      break;
    memcpy(&w, b + i, n - i < 8 ? n - i : 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
  }
  h = (h ^ (uint64_t)n) * 0x100000001b3ull;
  return h ^ (h >> 32);
}

/* n bytes at `at` of file name replaced by v, and the checksum made to
 * match again: a file only someone who can write the directory makes. */
static void forge(const char *name, size_t at, const void *v, size_t n) {
  size_t len;
  unsigned char *b = read_bytes(name, &len);
  cr_assert_leq(at + n, len - 8);
  uint64_t was;
  memcpy(&was, b + len - 8, 8);
  cr_assert_eq(sum_of(b, len - 8), was, "the test's checksum is not the format's");
  memcpy(b + at, v, n);
  uint64_t sum = sum_of(b, len - 8);
  memcpy(b + len - 8, &sum, 8);
  write_bytes(name, b, len);
  free(b);
}

/* Where a header field lies in the file of p (tenant "" and p's id). */
static size_t layer_at(const spec *p, int64_t l) {
  return KVF_FIXED + strlen(p->id) + 16 * (size_t)l;
}

/* Where element e of row j of K (t 0) or V (t 1), head h, layer l lies. */
static size_t elem_at(const spec *p, int64_t l, int t, int64_t h, int64_t j, int64_t e) {
  const size_t es = attn_dtype_size(p->sh.dtype), row = (size_t)p->sh.head_dim * es;
  size_t at = layer_at(p, p->sh.layers);
  for (int64_t i = 0; i < l; i++)
    at += 2 * (size_t)(p->sh.heads_kv * p->len[i]) * row;
  at += (size_t)(2 * h + t) * (size_t)p->len[l] * row;
  return at + (size_t)j * row + (size_t)e * es;
}

/* File name as version v wrote it, its header `fixed` bytes before the
 * tenant: version 4 less the 8 bytes of kv_dtype (version 3), less the 8
 * bytes of reserve too (version 2), and the 16
 * of head_dim_v and v_from_k too (version 1), its checksum over what is
 * left. */
static void as_version(const char *name, uint32_t v, size_t fixed) {
  size_t len;
  unsigned char *b = read_bytes(name, &len);
  uint32_t h;
  memcpy(&h, b + 12, 4);
  h -= (uint32_t)(KVF_FIXED - fixed);
  memcpy(b + 8, &v, 4);
  memcpy(b + 12, &h, 4);
  memmove(b + fixed, b + KVF_FIXED, len - KVF_FIXED);
  len -= KVF_FIXED - fixed;
  uint64_t sum = sum_of(b, len - 8);
  memcpy(b + len - 8, &sum, 8);
  write_bytes(name, b, len);
  free(b);
}

/* Files a server wrote before sessions had a value head dim of their own
 * load as sessions whose v is as wide as k, byte for byte. */
Test(kvfile, version_1_loads, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  for (int i = 0; i < NMIXED; i++)
    make(a, &mixed[i]);
  save_ok(a, 1200, NMIXED);
  for (int i = 0; i < NMIXED; i++)
    as_version(mixed_files[i], 1, KVF_FIXED_V1);
  logbuf lb = {0};
  cr_assert_eq(load(b, 50, &lb), NMIXED, "logged: %s", lb.n ? lb.lines[0] : "");
  for (int i = 0; i < NMIXED; i++) {
    expect_same(b, &mixed[i], 50, TTL - (1200 - mixed[i].made));
    attn_kv_info info;
    attn_status st;
    cr_assert_eq(attn_kv_get(b, mixed[i].tenant, mixed[i].id, 50, &info, NULL, 0, &st), 0);
    cr_expect(attn_kv_shape_dv(&info.shape) == mixed[i].sh.head_dim && !info.shape.v_from_k);
  }
  attn_kv_close(a);
  attn_kv_close(b);
}

/* Files a server wrote before sessions could be quantized load as
 * sessions that are not, byte for byte. */
Test(kvfile, version_3_loads_unquantized, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  for (int i = 0; i < NMIXED; i++)
    make(a, &mixed[i]);
  save_ok(a, 1200, NMIXED);
  for (int i = 0; i < NMIXED; i++)
    as_version(mixed_files[i], 3, KVF_FIXED_V3);
  logbuf lb = {0};
  cr_assert_eq(load(b, 50, &lb), NMIXED, "logged: %s", lb.n ? lb.lines[0] : "");
  for (int i = 0; i < NMIXED; i++) {
    expect_same(b, &mixed[i], 50, TTL - (1200 - mixed[i].made));
    attn_kv_info info;
    attn_status st;
    cr_assert_eq(attn_kv_get(b, mixed[i].tenant, mixed[i].id, 50, &info, NULL, 0, &st), 0);
    cr_expect(info.shape.kv_quant == ATTN_KVQ_NONE);
  }
  attn_kv_close(a);
  attn_kv_close(b);
}

/* Files a server wrote before sessions could grow load as sessions of
 * reserve whole, byte for byte. */
Test(kvfile, version_2_loads_whole, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  for (int i = 0; i < NMIXED; i++)
    make(a, &mixed[i]);
  save_ok(a, 1200, NMIXED);
  for (int i = 0; i < NMIXED; i++)
    as_version(mixed_files[i], 2, KVF_FIXED_V2);
  logbuf lb = {0};
  cr_assert_eq(load(b, 50, &lb), NMIXED, "logged: %s", lb.n ? lb.lines[0] : "");
  for (int i = 0; i < NMIXED; i++) {
    expect_same(b, &mixed[i], 50, TTL - (1200 - mixed[i].made));
    attn_kv_info info;
    attn_status st;
    cr_assert_eq(attn_kv_get(b, mixed[i].tenant, mixed[i].id, 50, &info, NULL, 0, &st), 0);
    cr_expect(!info.shape.grow && info.reserved_bytes == attn_kv_reserve_bytes(b, &info.shape));
  }
  attn_kv_close(a);
  attn_kv_close(b);
}

/* Each file holds one thing a create or a call would refuse, under a
 * matching checksum: each is moved aside with a line saying what, none is
 * served. The unfixed store loaded every one. */
Test(kvfile, forged_files_refused, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(64 << 20), *b = store(64 << 20);
  static const char *ids[] = {"nan", "inf", "big", "low", "pt", "pt0", "dtype", "good"};
  enum { N = 8 };
  spec p[N];
  for (int i = 0; i < N; i++) {
    p[i] = mixed[0]; /* F32, 2 KV heads, 3 layers of 300, 0 and 129 tokens */
    p[i].id = ids[i];
    p[i].seed = (uint32_t)i;
    make(a, &p[i]);
  }
  save_ok(a, 1100, N);
  const float nan = NAN, inf = -INFINITY, big = 3e38f, low = 0.125f;
  const int64_t pt = 100, pt0 = 0;
  forge("@nan.kv", elem_at(&p[0], 0, 0, 1, 299, 5), &nan, 4);
  forge("@inf.kv", elem_at(&p[1], 2, 1, 0, 128, 127), &inf, 4);
  forge("@big.kv", elem_at(&p[2], 2, 0, 1, 64, 0), &big, 4);
  forge("@low.kv", layer_at(&p[3], 0) + 8, &low, 4); /* its rows reach 0.25 */
  forge("@pt.kv", 64, &pt, 8);
  forge("@pt0.kv", 64, &pt0, 8);
  forge("@dtype.kv", 24 + 4, "x", 1); /* "F32\0x\0\0\0" */
  logbuf lb = {0};
  cr_assert_eq(load(b, 0, &lb), 1, "a forged file loaded");
  expect_same(b, &p[N - 1], 0, TTL - 100);
  static const char *why[] = {
      "non-finite",      "non-finite", "past the largest", "past the largest", "page_tokens (100)",
      "page_tokens (0)", "dtype"};
  for (int i = 0; i < N - 1; i++) {
    char file[64], aside[80];
    snprintf(file, sizeof file, "@%s.kv", ids[i]);
    snprintf(aside, sizeof aside, "%s.bad", file);
    const char *line = line_of(&lb, file);
    cr_expect(line && strstr(line, "moved to") && strstr(line, why[i]), "%s: logged '%s'", file,
              line ? line : "nothing");
    cr_expect(exists(aside) && !exists(file), "%s was not moved aside", file);
    expect_gone(b, "", ids[i], 0);
  }
  attn_kv_stats y;
  attn_kv_stats_get(b, &y);
  cr_expect_eq(y.sessions, 1);
  cr_expect_eq(y.reserved_bytes, attn_kv_reserve_bytes(b, &p[0].sh));
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A ttl_s past the server's --session-ttl-max (a file from a server with
 * a higher one, or forged) loads cut to it, the time left with it, and
 * the log says so. */
Test(kvfile, ttl_cut_to_the_servers_max, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(16 << 20), *b = store(16 << 20);
  spec p = mixed[1];
  p.tenant = "";
  make(a, &p);
  save_ok(a, 1200, 1);
  const double ttl[2] = {1e6, 9e5}; /* ttl_s and the seconds left */
  forge("@alpha.kv", 72, ttl, sizeof ttl);
  logbuf lb = {0};
  attn_status st;
  cr_assert_eq(attn_kv_load(b, dir, 50, 3600, on_log, &lb, &st), 1, "%s", st.message);
  attn_kv_info info;
  cr_assert_eq(attn_kv_get(b, "", "alpha", 50, &info, NULL, 0, &st), 0, "%s", st.message);
  cr_expect_eq(info.ttl_s, 3600, "ttl_s %g", info.ttl_s);
  cr_expect_leq(info.expires - 50, 3600, "%g s left", info.expires - 50);
  const char *line = line_of(&lb, "@alpha.kv");
  cr_expect(line && strstr(line, "ttl_s 3600") && strstr(line, "--session-ttl-max"), "logged '%s'",
            line ? line : "nothing");
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A file name with a newline and a terminal escape is logged escaped:
 * one line, no control byte. */
Test(kvfile, names_escaped_in_the_log, .init = setup, .fini = teardown) {
  attn_kv_store *b = store(1 << 20);
  write_bytes("x@a\nattnd: forged\x1b[2J.kv", "junk", 4);
  logbuf lb = {0};
  cr_expect_eq(load(b, 0, &lb), 0);
  cr_assert_eq(lb.n, 1);
  for (const char *c = lb.lines[0]; *c; c++)
    cr_expect((unsigned char)*c >= 0x20 && *c != 0x7f, "a control byte 0x%02x in '%s'",
              (unsigned char)*c, lb.lines[0]);
  cr_expect(strstr(lb.lines[0], "x@a\\x0aattnd: forged\\x1b[2J.kv"), "logged '%s'", lb.lines[0]);
  attn_kv_close(b);
}

/* A hard link or a symbolic link planted at a session's temporary name
 * is replaced, never written through: the file it points at keeps its
 * bytes, and the session is saved. */
Test(kvfile, links_at_the_temporary_name, .init = setup, .fini = teardown) {
  attn_kv_store *a = store(16 << 20), *b = store(16 << 20);
  spec p = mixed[1], q = mixed[1];
  p.tenant = q.tenant = "";
  q.id = "beta";
  make(a, &p);
  make(a, &q);
  write_bytes("victim", "precious", 8);
  write_bytes("victim2", "precious", 8);
  cr_assert_eq(link(path_of("victim"), path_of("@alpha.kv.tmp")), 0);
  cr_assert_eq(symlink(path_of("victim2"), path_of("@beta.kv.tmp")), 0);
  attn_status st;
  int64_t saved = attn_kv_save(a, dir, 1200, &st);
  cr_expect_eq(saved, 2, "saved %lld: %s", (long long)saved, saved < 0 ? st.message : "");
  size_t n;
  unsigned char *v = read_bytes("victim", &n);
  cr_expect(n == 8 && !memcmp(v, "precious", 8), "the save wrote through a hard link");
  free(v);
  v = read_bytes("victim2", &n);
  cr_expect(n == 8 && !memcmp(v, "precious", 8), "the save wrote through a symbolic link");
  free(v);
  cr_expect_eq(count_suffix(".tmp"), 0);
  logbuf lb = {0};
  cr_expect_eq(load(b, 0, &lb), 2);
  expect_same(b, &p, 0, TTL - (1200 - p.made));
  expect_same(b, &q, 0, TTL - (1200 - q.made));
  attn_kv_close(a);
  attn_kv_close(b);
}

/* A session of two layers saved from 64 KiB pages (256 tokens of BF16 D
 * 128 a page) loads into 16 KiB pages (64), where its next decode steps
 * attend over the whole history right; saved from there, it loads into 64
 * KiB pages again; the reservations follow the loading store's pages. */
Test(kvfile, across_page_sizes, .init = setup, .fini = teardown, .timeout = 120) {
  attn_engine *e = topen(2, NULL);
  attn_kv_store *st3[3] = {tkv_open_store(e, 64 << 20, true, "cpu"),
                           tkv_open_paged(e, 64 << 20, 16 << 10),
                           tkv_open_store(e, 64 << 20, true, "cpu")};
  tkv_stream s = tkv_stream_make(8, 2, 128, 330, ATTN_BF16, 12);
  tkv_make(st3[0], "", "x", &s, 2, 400, 600, 0);
  tkv_opts op[2] = {tkv_plain, tkv_plain};
  op[1].layer = 1;
  const int64_t len[2] = {300, 71}; /* past a big page's end, short of a small one's */
  for (int i = 0; i < 3; i++) {
    attn_status st;
    if (i > 0) {
      save_ok(st3[i - 1], 1, 1);
      cr_assert_eq(attn_kv_load(st3[i], dir, 1, TTL_MAX, NULL, NULL, &st), 1, "%s", st.message);
    }
    for (int l = 0; l < 2; l++) { /* the prefill, then a step in each store */
      const int64_t pos = i == 0 ? 0 : len[l] + i - 1, n = i == 0 ? len[l] : 1;
      double err = tkv_step_error(st3[i], "x", &s, &op[l], pos, n, &st);
      cr_expect_lt(err, ttol(s.dt), "store %d, layer %d at %lld: %g (%s)", i, l, (long long)pos,
                   err, err == INFINITY ? st.message : "");
    }
    attn_kv_shape sh = {
        .heads_kv = 2, .head_dim = 128, .dtype = ATTN_BF16, .layers = 2, .max_tokens = 400};
    attn_kv_info info;
    cr_assert_eq(attn_kv_get(st3[i], "", "x", 1, &info, NULL, 0, &st), 0, "%s", st.message);
    cr_expect_eq(info.reserved_bytes, attn_kv_reserve_bytes(st3[i], &sh));
    cr_expect_eq(info.reserved_bytes,
                 i == 1 ? 2 * 2 * 2 * 7 * (16 << 10) : 2 * 2 * 2 * 2 * (64 << 10));
  }
  tkv_stream_free(&s);
  /* D 576 BF16 rows (1152 bytes) fit 14 to a 16 KiB page: the file is set
   * aside, the log line naming the page size that takes it */
  tkv_stream w = tkv_stream_make_dv(4, 1, 576, 512, true, 20, ATTN_BF16, 13);
  tkv_make(st3[0], "", "mla", &w, 1, 64, 600, 0);
  attn_status st;
  cr_expect_lt(tkv_step_error(st3[0], "mla", &w, &tkv_plain, 0, 20, &st), ttol(w.dt));
  save_ok(st3[0], 1, 2);
  cr_assert_eq(attn_kv_delete(st3[1], "", "x", 1, &st), 0);
  logbuf lb = {0};
  cr_expect_eq(load(st3[1], 1, &lb), 1, "x loads, mla does not");
  cr_expect(exists("@mla.kv.bad"));
  cr_expect(lb.n == 1 && strstr(lb.lines[0], "--session-page-bytes 32K"), "%s", lb.lines[0]);
  tkv_stream_free(&w);
  for (int i = 0; i < 3; i++)
    attn_kv_close(st3[i]);
  attn_engine_close(e);
}
