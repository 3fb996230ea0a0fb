/*
 * work.h — what a computing request's job does off the loop (work.c). The
 * loop admits, dispatches and completes jobs; this is the work between:
 * libuv's threadpool decodes and submits, the engine computes and hands the
 * job back to the loop (s->done_head, s->completed), and the threadpool
 * encodes the reply.
 */
#ifndef ATTND_WORK_H
#define ATTND_WORK_H

#include "request.h"

/* Loop: reserves what decoding r's body will hold beside it, held like the
 * body until attnd_work_drop_inputs(); false with r's reply set. */
bool attnd_work_reserve(attnd_req *r);

/*
 * libuv's threadpool, in turn: r->work decodes r's body (unless a tiny
 * job's try did, tiny.h) and submits it to the engine (r->in_engine says
 * whether the engine took it, else r->job_st why not); r->work2 encodes
 * the engine's result into r->out, or the failure into r->job_st.
 */
void attnd_work_decode_submit(uv_work_t *w);
void attnd_work_encode(uv_work_t *w);

/* The steps of those, for a job computed where it was decoded (tiny.h):
 * r's body into r->pr, with --max-pairs checked (0, or the code with st
 * set); the result, or failure, encoded into r->out or r->job_st; and that
 * outcome made r's reply. */
int attnd_work_decode(attnd_req *r, attn_status *st);
void attnd_work_encode_result(attnd_req *r);
void attnd_work_reply(attnd_req *r);

/* Any thread holding r: the tensors and body freed once nobody needs them
 * (the reply stays). */
void attnd_work_drop_inputs(attnd_req *r);

#endif
