/*
 * config.c — attn_config's defaults, the field it parses and the names
 * one field takes.
 */
#include "engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void attn_config_init(attn_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->reference_max_bytes = (uint64_t)256 << 20;
}

bool attn_cpu_tune_known(const char *name) {
  return !name || !*name || !strcmp(name, "auto") || !strcmp(name, "intel") || !strcmp(name, "amd");
}

int attn_cuda_devices_parse(const char *spec, int *ord, int cap, attn_status *st) {
  int n = 0;
  if (!spec || !*spec) {
    ord[n++] = 0;
    return n;
  }
  for (const char *p = spec;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || *p == '-' || *p == '+' || errno || v > 1023 || (*end && *end != ','))
      return attn_status_set(st, ATTN_EINVAL,
                             "cuda devices \"%.60s\": expected comma-separated device "
                             "numbers such as 0 or 0,1",
                             spec);
    for (int i = 0; i < n; i++)
      if (ord[i] == v)
        return attn_status_set(st, ATTN_EINVAL, "cuda device %ld is listed twice", v);
    if (n == cap)
      return attn_status_set(st, ATTN_EINVAL, "at most %d cuda devices", cap);
    ord[n++] = (int)v;
    if (!*end)
      return n;
    p = end + 1;
  }
}
