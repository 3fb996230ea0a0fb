/*
 * config_value.c — the values attnd's flags take: integers, seconds, sizes,
 * HOST:PORT, device lists and paths. Each refusal is the one line that
 * names the flag (or variable) and what it takes.
 */
#include "config_int.h"
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int attnd__cfg_bad(const char *what, const char *value, const char *expect) {
  fprintf(stderr, "attnd: %s expects %s (got \"%s\")\n", what, expect, value);
  return -1;
}

int attnd__cfg_int(const char *what, const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    char expect[64];
    snprintf(expect, sizeof expect, "an integer from %ld to %ld", lo, hi);
    return attnd__cfg_bad(what, s, expect);
  }
  *out = (int)v;
  return 0;
}

int attnd__cfg_seconds(const char *what, const char *s, double lo, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !(v >= lo) || v > 1e6)
    return attnd__cfg_bad(what, s, "a number of seconds");
  *out = v;
  return 0;
}

/* A size with an optional K, M or G suffix, 1 byte to 1024G; false when s
 * is none. */
bool attnd__cfg_size_value(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k')
    mul = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mul = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mul = 1ull << 30;
  if (mul > 1)
    end++;
  if (!*s || *s == '-' || *end || errno || v == 0 || v > (1ull << 40) / mul)
    return false;
  *out = v * mul;
  return true;
}

int attnd__cfg_size(const char *what, const char *s, uint64_t *out) {
  if (attnd__cfg_size_value(s, out))
    return 0;
  return attnd__cfg_bad(what, s, "a size such as 1048576, 512K, 64M or 1G (at most 1024G)");
}

int attnd__cfg_listen(const char *what, const char *s, attnd_config *c) {
  const char *colon = strrchr(s, ':');
  int port;
  if (!colon || colon == s || (size_t)(colon - s) >= sizeof c->host)
    return attnd__cfg_bad(what, s, "HOST:PORT, e.g. 127.0.0.1:8080");
  if (attnd__cfg_int(what, colon + 1, 0, 65535, &port) < 0)
    return -1;
  memcpy(c->host, s, (size_t)(colon - s));
  c->host[colon - s] = 0;
  c->port = port;
  return 0;
}

/* A comma-separated list of device numbers, each listed once (the engine's
 * parser; whether they exist is known once the engine opens). */
int attnd__cfg_devices(const char *what, const char *s, attnd_config *c) {
  int ord[ATTN_MAX_CUDA_DEVICES];
  attn_status st;
  int n = attn_cuda_devices_parse(s, ord, ATTN_MAX_CUDA_DEVICES, &st);
  if (!*s || n < 0 || strlen(s) >= sizeof c->devices) {
    fprintf(stderr, "attnd: %s: %s\n", what,
            !*s     ? "expected device numbers such as 0 or 0,1"
            : n < 0 ? st.message
                    : "list too long");
    return -1;
  }
  c->ndevices = n;
  snprintf(c->devices, sizeof c->devices, "%s", s);
  return 0;
}

int attnd__cfg_path(char *out, size_t cap, const char *what, const char *v) {
  if (strlen(v) >= cap)
    return attnd__cfg_bad(what, v, "a shorter path");
  snprintf(out, cap, "%s", v);
  return 0;
}
