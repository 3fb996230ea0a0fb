/*
 * request_int.h — what request.c gives the rest of engine/ besides engine.h.
 *
 * Internal to engine/: a request in the form the backends take it (strides
 * filled in), the keys a query row sees, and one sequence of a
 * variable-length batch as a problem of its own.
 */
#ifndef ATTN_REQUEST_INT_H
#define ATTN_REQUEST_INT_H

#include "engine.h"

/* Fills all-zero strides with the contiguous layout; r must be valid. */
void attn__request_fill_strides(attn_request *r);

/* Keys visible to query row i of a valid request: [*lo, *hi], empty when
 * *lo > *hi. */
void attn__request_keys(const attn_request *r, int64_t i, int64_t *lo, int64_t *hi);

/* Sequence b of a valid variable-length request r as a problem of its own:
 * batch 1, the sequence's own seq_q and seq_kv (either may be 0), pointers
 * advanced to its first rows (paged K/V: k_pages and v_pages to its own
 * tables, its keys numbered from 0), strides filled, no cu_seqlens and no
 * statistics (m, l, lse and lse_in NULL: they are packed [Hq, total] in r
 * and the caller gathers them). */
void attn__varlen_sub(const attn_request *r, int64_t b, attn_request *sub);

#endif
