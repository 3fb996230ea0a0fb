/* harness_util.c — see harness_util.h. */
#define _GNU_SOURCE
#include "harness_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void sleep_s(double s) {
  struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&t, &t) < 0 && errno == EINTR)
    ;
}

char *read_file_all(const char *path, size_t *plen) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *b = malloc(cap + 1);
  size_t r;
  while ((r = fread(b + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      cap *= 2;
      b = realloc(b, cap + 1);
    }
  }
  fclose(f);
  b[n] = 0;
  if (plen)
    *plen = n;
  return b;
}

/* Each test runs in a process of its own: one directory per test. */
static char tmpdir[64];

char *make_tmpdir(void) {
  if (!tmpdir[0]) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/attnd-files-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp");
  }
  return tmpdir;
}

void remove_tmpdir(void) {
  if (!tmpdir[0])
    return;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0)
    fprintf(stderr, "harness: could not remove %s\n", tmpdir);
  tmpdir[0] = 0;
}

void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}
