/*
 * kind.h — what a computing request is: the ops table a computing route's
 * row names (route.h's kind), one file a kind. The pipeline (work.c,
 * loop.c, tiny.c) reserves, decodes, submits, encodes and frees through
 * it, and reads what a kind allows from its flags; it never asks which
 * kind it holds.
 *
 * How to add a computing route:
 *   1. Write server/kind_NAME.c with a `const attnd_kind attnd_kind_NAME`:
 *      its decode (r's body into r->pr, and whatever state of its own in
 *      r->state), its submit (to the engine, or to a store in front of
 *      it), its encode (r->pr's result into r->out), its free (r->state),
 *      what its decode holds beside the body (need), its run on the HTTP
 *      thread when small (here; NULL: never), and its flags.
 *   2. Declare it below, and add its file to the Makefile's SERVER_SRC
 *      (and TEST_SERVER_OBJ, which links routes.c into the unit tests).
 *   3. Add a row to routes.c's table with .kind = &attnd_kind_NAME.
 * Admission, --max-queue, the body budget, deadlines, cancels, the drain,
 * the log line and the metrics then come with the pipeline.
 */
#ifndef ATTND_KIND_H
#define ATTND_KIND_H

#include "request.h"
#include "route.h"

typedef struct attnd_kind {
  /* The pass its engine request computes. */
  attn_pass pass;
  /* Any thread holding r: what decoding len bytes of r's body allocates
   * beside them (0: nothing), reserved on the body budget before it
   * decodes (at admission, and again once a Content-Encoding is undone);
   * and the advice of the 413 when that can never fit. */
  uint64_t (*need)(const attnd_req *r, size_t len);
  const char *too_large;
  /* Threadpool (or the HTTP thread for a tiny job's try): body[0..len)
   * (Content-Encoding undone) into r->pr; 0 or the code with st set. */
  int (*decode)(attnd_req *r, const char *body, size_t len, attn_status *st);
  /* Threadpool: the decoded request computed, done called on an engine
   * thread when it ends; 0, or the code with st set (done not called). */
  int (*submit)(attnd_req *r, attn_done_fn done, attn_status *st);
  /* Threadpool: the computed result into r->out (r->out_len, r->out_ctype,
   * and r->out_parts for a reply sent in pieces); 0 or the code with st
   * set. */
  int (*encode)(attnd_req *r, attn_status *st);
  /* Any thread, as r is freed: its state (r->state); NULL: none. */
  void (*free)(attnd_req *r);
  /* Loop: r was canceled after dispatch (its flag is set), for a kind
   * whose submit may hold it where the flag is not looked at; NULL:
   * the flag is all. */
  void (*cancel)(attnd_req *r);
  /* A header of its successful replies (NULL: none), and its value for r
   * (NULL: not on this one). */
  const char *reply_header;
  const char *(*reply_value)(const attnd_req *r);
  /* HTTP thread, r decoded and holding its place (tiny.h): computes r on
   * this thread when its work is at most --tiny-flops and it can go at
   * once: 0 with r->res its result, or 1 when it goes the queued way
   * (nothing was done). NULL: never here. */
  int (*here)(attnd_req *r);
  bool slot;      /* takes one of the loop's running slots (else starts at admission) */
  bool max_pairs; /* its work is bounded by --max-pairs */
  bool pin;       /* its outputs go to memory the engine lends (page-locked) */
} attnd_kind;

/* POST /attention and /attention/backward (kind_attention.c). */
extern const attnd_kind attnd_kind_forward, attnd_kind_backward;
/* POST /v2/models/{model}/infer (kind_v2.c). */
extern const attnd_kind attnd_kind_v2;
/* POST /v1/sessions/{id}/attention and /v1/sessions/_batch
 * (kind_session.c). */
extern const attnd_kind attnd_kind_session, attnd_kind_session_batch;

/* What a JSON body's decode holds beside it (its tensors; nothing for
 * safetensors, read in place), and the 413's advice then: the kinds whose
 * body is /attention's (kind_attention.c). */
uint64_t attnd_kind_need_tensors(const attnd_req *r, size_t len);
#define ATTND_KIND_TOO_LARGE                                                          \
  "send it as safetensors (application/octet-stream), which needs no copy, or raise " \
  "--max-queue"
/* The engine's submit of r->pr.req, and its run on the calling thread when
 * tiny: the stateless kinds' (kind_attention.c). */
int attnd_kind_submit_engine(attnd_req *r, attn_done_fn done, attn_status *st);
int attnd_kind_here_engine(attnd_req *r);
/* /attention's reply of r's result: safetensors when asked for
 * (r->binary_out), else JSON. 0 or the code with st set. */
int attnd_kind_encode_tensors(attnd_req *r, attn_status *st);

#endif
