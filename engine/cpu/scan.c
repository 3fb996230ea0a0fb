/*
 * scan.c — the records the CPU kernels keep of the inputs they load, and
 * the verdict a job takes from them when its items are done.
 */
#include "scan.h"

#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int attn__seen_init(const attn_request *r, attn__flash_seen *seen, int nt, const int64_t *heads,
                    int64_t **bad, uint32_t **maxbits) {
  size_t n = 0;
  for (int t = 0; t < nt; t++)
    n += (size_t)(r->batch * heads[t]);
  *bad = malloc(n * sizeof **bad);
  *maxbits = calloc(n, sizeof **maxbits);
  if (!*bad || !*maxbits)
    return -1;
  for (size_t i = 0; i < n; i++)
    (*bad)[i] = INT64_MAX;
  int64_t at = 0;
  for (int t = 0; t < nt; t++) {
    seen[t].bad = *bad + at;
    seen[t].maxbits = *maxbits + at;
    at += r->batch * heads[t];
  }
  return 0;
}

int attn__seen_verdict(const attn_request *r, const attn__flash_seen *seen, int nt,
                       const char *const *names, const int64_t *heads, double *mx,
                       attn_status *st) {
  for (int t = 0; t < nt; t++)
    for (int64_t i = 0; i < r->batch * heads[t]; i++) {
      const int64_t bad = seen[t].bad[i];
      if (bad != INT64_MAX)
        return attn__nonfinite(st, names[t], i / heads[t], i % heads[t], bad / r->head_dim,
                               bad % r->head_dim);
      float f;
      memcpy(&f, &seen[t].maxbits[i], sizeof f);
      mx[t] = fmax(mx[t], f);
    }
  return 0;
}

void attn__seen_record(const attn__flash_seen *s, int64_t head, int64_t bad, float maxabs) {
  if (bad >= 0) {
    int64_t cur = __atomic_load_n(&s->bad[head], __ATOMIC_RELAXED);
    while (bad < cur && !__atomic_compare_exchange_n(&s->bad[head], &cur, bad, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      ;
    return;
  }
  uint32_t bits, cur = __atomic_load_n(&s->maxbits[head], __ATOMIC_RELAXED);
  memcpy(&bits, &maxabs, sizeof bits);
  while (bits > cur && !__atomic_compare_exchange_n(&s->maxbits[head], &cur, bits, true,
                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}
