/*
 * check.h — the checks every backend makes of a job's values, one wording.
 *
 * Internal to engine/. attn_request_validate() checks what it can without
 * reading the tensors; these are the checks of the values themselves, made
 * when a job runs (each backend scans its inputs its own way, then asks
 * here for the verdict), so that every backend refuses the same inputs
 * with the same message.
 */
#ifndef ATTN_CHECK_H
#define ATTN_CHECK_H

#include "engine.h"

/* ENONFINITE for element (b, h, n, d) of tensor "q", "k", "v", "o" or "do". */
int attn__nonfinite(attn_status *st, const char *tensor, int64_t b, int64_t h, int64_t n,
                    int64_t d);

/* ERANGE when inputs whose largest magnitudes are maxabs[q, k, v] could
 * overflow F32 in the scores or the output sums. */
int attn__check_magnitudes(const attn_request *r, const double maxabs[3], attn_status *st);
/* The same for a backward pass, maxabs[q, k, v, o, do]: the forward's
 * checks, then dP = dO·Vᵀ and Dᵢ = rowsum(dO∘O) (sums of D products), and
 * dK, dV (sums over the group's query rows) and dQ (over keys, P <= 1). */
int attn__check_magnitudes_bwd(const attn_request *r, const double maxabs[5], attn_status *st);

/* A backward request's lse_in, when given: ENONFINITE for NaN or +inf,
 * EINVAL for -inf on a row that sees keys (only a row with no visible key
 * has lse -inf). Every backend calls it before computing. */
int attn__check_lse(const attn_request *r, attn_status *st);

/* The largest |x| over n elements of dtype dt as a float, or -1 when one
 * is not finite (cleared of the sign, a float's bits order as its
 * magnitude, and the non-finite ones are the largest): what a session
 * store records of the tokens it takes. */
float attn__absmax(const void *p, attn_dtype dt, size_t n);

#endif
