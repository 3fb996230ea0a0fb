/*
 * reqid.c — request ids (reqid.h).
 */
#include "reqid.h"

#include <string.h>
#include <sys/random.h>
#include <time.h>

void attnd_reqid_init(attnd_reqid_gen *g) {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec;
  }
  g->seed = seed;
  atomic_init(&g->next, 0);
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void attnd_reqid_make(attnd_reqid_gen *g, char out[33]) {
  uint64_t n = atomic_fetch_add(&g->next, 1);
  uint64_t hi = splitmix64(g->seed ^ splitmix64(n));
  uint64_t lo = splitmix64(hi ^ n);
  /* "%016llx%016llx", without printf: one is made for every request */
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 16; i++) {
    out[15 - i] = hex[(hi >> (4 * i)) & 15];
    out[31 - i] = hex[(lo >> (4 * i)) & 15];
  }
  out[32] = 0;
}

bool attnd_reqid_valid(const char *v) {
  if (!v)
    return false;
  size_t n = strlen(v);
  if (n == 0 || n > ATTND_REQID_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    if (v[i] <= 0x20 || v[i] >= 0x7f || v[i] == '"' || v[i] == '\\')
      return false;
  return true;
}
