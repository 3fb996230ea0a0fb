/*
 * dv.h — a request whose values have a head dim of their own (Dv ≠ D).
 *
 * Internal to engine/, for the submission path (submit.c).
 */
#ifndef ATTN_DV_H
#define ATTN_DV_H

#include "engine.h"

/* The submission path a padded request takes (submit.c's). */
typedef int (*attn__submit_fn)(attn_engine *e, const attn_request *r, bool here, attn_done_fn done,
                               void *arg, attn_status *st);

/* Queues a valid request with head_dim_v ≠ head_dim through submit as one
 * of head dim max(D, Dv), the narrower tensors zero-padded into copies; its
 * outputs are cut back to their own widths before done runs. The
 * attn_engine_submit() contract; ENOMEM without memory for the copies. */
int attn__dv_submit(attn_engine *e, const attn_request *r, bool here, attn_done_fn done, void *arg,
                    attn__submit_fn submit, attn_status *st);

#endif
