/*
 * scan.h — what the CPU kernels saw of their inputs, and its verdict.
 *
 * Internal to engine/cpu/. Both passes scan every input for non-finite
 * values and magnitudes that could overflow while the kernels load it (the
 * forward's tiles, the backward's phase 1), recording per (batch, head) of
 * each tensor; the job's finish turns the records into one verdict with
 * the wording every backend shares (check.h).
 */
#ifndef ATTN_CPU_SCAN_H
#define ATTN_CPU_SCAN_H

#include "engine.h"

/* What the kernel saw of one tensor while loading it for compute, per
 * (batch, head) of that tensor: the first non-finite element (n·D + d;
 * INT64_MAX when none) and the bits of the largest |x| (non-negative floats
 * order like their bits). Both are order-independent, so the verdict is the
 * same whichever thread loaded which tile. */
typedef struct attn__flash_seen {
  int64_t *bad;
  uint32_t *maxbits;
} attn__flash_seen;

/* Records one scanned piece of head `head`: the index of its first
 * non-finite element (-1: none), else its largest |x| (atomic). */
void attn__seen_record(const attn__flash_seen *s, int64_t head, int64_t bad, float maxabs);

/* Points seen[t] (t < nt) at r->batch·heads[t] entries, cut from one pair
 * of allocations (*bad, *maxbits: the caller frees them) that say no
 * non-finite element (INT64_MAX) and max |x| = 0. Returns -1 out of memory. */
int attn__seen_init(const attn_request *r, attn__flash_seen *seen, int nt, const int64_t *heads,
                    int64_t **bad, uint32_t **maxbits);

/* What seen[] recorded of nt tensors (names[t], heads[t] heads a batch):
 * ENONFINITE for the first non-finite element, the tensors in order and
 * (batch, head) order within each; else 0 with mx[t] tensor t's max |x|. */
int attn__seen_verdict(const attn_request *r, const attn__flash_seen *seen, int nt,
                       const char *const *names, const int64_t *heads, double *mx, attn_status *st);

#endif
