/* harness_hold.c — see harness_hold.h. */
#define _GNU_SOURCE
#include "harness_hold.h"

#include "harness_proc.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *srv_hold_bin(void) {
  static char path[512];
  const char *b = getenv("ATTND_HOLD_BIN");
  if (b && *b)
    return b;
  const char *plain = srv_bin(), *slash = strrchr(plain, '/');
  int dir = slash ? (int)(slash - plain + 1) : 0;
  snprintf(path, sizeof path, "%.*stests/attnd-hold", dir, plain);
  return path;
}

void hold_gate_init(hold_gate *g) {
  static int seq;
  snprintf(g->path, sizeof g->path, "/tmp/attnd-hold-%d-%d", (int)getpid(), seq++);
  unlink(g->path);
  snprintf(g->env, sizeof g->env, "ATTN_HOLD_RELEASE=%s", g->path);
}

void hold_release(const hold_gate *g) {
  int fd = open(g->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  cr_assert(fd >= 0, "cannot create the hold release file %s", g->path);
  close(fd);
}

void hold_gate_free(hold_gate *g) {
  char mark[sizeof g->path + 8];
  snprintf(mark, sizeof mark, "%s.held", g->path);
  unlink(mark);
  unlink(g->path);
}

void srv_start_gated(srv *s, hold_gate *g, const char *const *args) {
  hold_gate_init(g);
  const char *env[] = {g->env, NULL};
  s->bin = srv_hold_bin();
  srv_startv(s, args, env, true);
}
