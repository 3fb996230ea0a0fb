/*
 * varlen.h — a variable-length batch (cu_seqlens) as one job per sequence.
 *
 * Internal to engine/, for the submission path (submit.c).
 */
#ifndef ATTN_VARLEN_H
#define ATTN_VARLEN_H

#include "engine.h"

/* Queues a valid variable-length request as one job per sequence on one
 * backend; attn_engine_submit()'s contract, or (here) each sequence run on
 * the calling thread where the backend can, as attn_engine_run_here's. */
int attn__varlen_submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done,
                        void *arg, attn_status *st);

#endif
