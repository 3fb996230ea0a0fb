/*
 * server.c — the server's readiness (server.h), which the probes of both
 * APIs read.
 */
#include "server.h"
#include "errors.h"

#include <stdio.h>
#include <string.h>

/* Whether the backend requests run on can still take jobs (a CUDA device
 * that failed cannot). */
static bool backend_ready(attnd_server *s, char *why, size_t cap) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++)
    if (!strcmp(info[i].name, s->backend) && !info[i].available) {
      snprintf(why, cap, "the %s backend cannot run jobs: %.150s", info[i].name, info[i].detail);
      return false;
    }
  return true;
}

bool attnd_server_disabled_kernels(attnd_server *s, char *out, size_t cap) {
  attn_backend_info info[ATTND_MAX_BACKENDS];
  int n = attn_engine_backends(s->engine, info, ATTND_MAX_BACKENDS);
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < n && i < ATTND_MAX_BACKENDS; i++)
    for (int k = 0; k < info[i].ndisabled && at < cap; k++)
      if (!strcmp(s->backend, "auto") || !strcmp(info[i].name, s->backend))
        at += (size_t)snprintf(out + at, cap - at, "%sthe %s self-check disabled %s (%s)",
                               at ? "; " : "", info[i].name, info[i].disabled[k].kernel,
                               info[i].disabled[k].why);
  return at > 0;
}

int attnd_server_ready(attnd_server *s, char *why, size_t cap) {
  if (atomic_load(&s->draining)) {
    snprintf(why, cap, "the server is draining and takes no new work");
    return ATTND_ESHUTTING_DOWN;
  }
  if (atomic_load(&s->unready)) {
    snprintf(why, cap, "the server is stopping: it drains in at most %g s (--drain-delay)",
             s->cfg->drain_delay);
    return ATTND_ESHUTTING_DOWN;
  }
  return backend_ready(s, why, cap) ? 0 : ATTND_EBACKEND_UNAVAILABLE;
}
