/*
 * cases.h — the conformance problem lists, one copy shared by the CPU suite
 * (tests/unit/test_conformance.c) and the GPU suite (tests/gpu/): awkward
 * sizes, every mask on square and cross shapes, GQA/MQA, strided layouts,
 * explicit scales, decoding-like shapes and rows with no visible key.
 *
 * Each builder fills ps (room for TCASES_MAX problems) and returns how many
 * it wrote. Inputs are drawn by tcase_init() from the seed the suite picks.
 */
#ifndef ATTN_TEST_CASES_H
#define ATTN_TEST_CASES_H

#include "helpers.h"

#define TCASES_MAX 128

/* Every (N, D) of the awkward set: F32, GQA 2:1, with statistics. */
int tcases_sizes(tprob *ps);
/* Masks on square and cross shapes, both ways, in all dtypes. */
int tcases_masks(tprob *ps);
/* Batches, GQA and MQA, strided layouts, explicit scales, F16/BF16 sizes,
 * decoding-like shapes. */
int tcases_shapes(tprob *ps);
/* Rows with no visible key (causal with Nq > Nkv, a window that falls off
 * the keys), and a diagonal-only window; the first problem's rows 0..69 see
 * nothing. */
/* Decode shapes whose keys the CPU backend splits across threads. */
int tcases_decode(tprob *ps);
int tcases_masked_rows(tprob *ps);
/* softcap and ALiBi (slopes [Hq] and [B, Hq]), alone and together, with
 * masks, GQA, cross and decode shapes (keys split), in every dtype. */
int tcases_variants(tprob *ps);
/* Explicit diag_offset: 0 (torch's top-left is_causal) on cross shapes,
 * negative and positive offsets with causal and windows, offsets that mask
 * whole rows or every row, GQA, every dtype, decode splits. */
int tcases_diag(tprob *ps);

#endif
