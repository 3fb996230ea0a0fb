/*
 * handle.h — the engine handle as the submission path sees it.
 *
 * Internal to engine/ (handle.c): submit.c and varlen.c, which sit above
 * it, pick a backend of the engine for a request, count their jobs in it
 * and use its worker pool.
 */
#ifndef ATTN_HANDLE_H
#define ATTN_HANDLE_H

#include "backend.h"

/* The backend for a validated request: r->backend by name, or for "auto"
 * (or none) the first automatic one in preference order that supports it;
 * otherwise the error, with a message. */
int attn__engine_pick(attn_engine *e, const attn_request *r, const attn_backend **pbe,
                      attn_status *st);

/* Device memory for a session store's pages from the first healthy
 * automatic backend that lends it: that backend in *pbe and the memory's
 * device address in *base; EUNSUPPORTED when none does. */
int attn__engine_pages_open(attn_engine *e, uint64_t bytes, const attn_backend **pbe, void **base,
                            attn_status *st);

/* The engine's count of jobs in flight, and its worker pool. */
attn_jobs *attn__engine_jobs(attn_engine *e);
attn_pool *attn__engine_pool(attn_engine *e);

#endif
