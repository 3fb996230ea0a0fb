/*
 * kvcalls.h — session calls for the tests: a session's token stream, one
 * call on it (append and attend) run to its end, and its error against the
 * float64 reference over exactly the keys the session should hold. Shared
 * by the store's unit tests (host pages, the cpu backend) and the CUDA
 * mock's (pages on the device).
 */
#ifndef ATTN_TEST_KVCALLS_H
#define ATTN_TEST_KVCALLS_H

#include "kv/kv.h"

#include <stdbool.h>
#include <stdint.h>

/* A session's whole token stream: q [Hq, n, D], k [Hkv, n, D] and v [Hkv,
 * n, Dv] (dv: Dv). A latent one's v is the first Dv columns of k's rows,
 * and its session stores k only (attn_kv_shape.v_from_k). */
typedef struct tkv_stream {
  int64_t hq, hkv, d, n;
  attn_dtype dt;
  void *q, *k, *v;
  int64_t dv;
  bool latent;
} tkv_stream;

tkv_stream tkv_stream_make(int64_t hq, int64_t hkv, int64_t d, int64_t n, attn_dtype dt,
                           uint64_t seed);
/* The same with values dv wide, or (latent) k's first dv columns. */
tkv_stream tkv_stream_make_dv(int64_t hq, int64_t hkv, int64_t d, int64_t dv, bool latent,
                              int64_t n, attn_dtype dt, uint64_t seed);
/* A stream that is a's first n tokens (queries, keys, values), then b's:
 * a fork's history (a and b of one shape and length). */
tkv_stream tkv_stream_splice(const tkv_stream *a, const tkv_stream *b, int64_t n);
void tkv_stream_free(tkv_stream *s);
/* Rows [r0, r0 + n) of every head of a [H, total, D] tensor, packed (malloc). */
void *tkv_rows_of(const void *t, int64_t heads, int64_t total, int64_t d, attn_dtype dt, int64_t r0,
                  int64_t n);

/* A call's result. */
typedef struct tkv_reply {
  void *o;
  float *m, *l, *lse;
  int64_t length;
  bool replay;
  const char *backend; /* the job's, when it ran one */
} tkv_reply;
void tkv_reply_free(tkv_reply *y);

/* Submits call and waits; the store's code or the job's. */
int tkv_run(attn_kv_store *kv, attn_kv_call *c, double now, attn_status *st);

typedef struct tkv_opts {
  bool causal, stats;
  int64_t wl, wr;
  double softcap;
  const float *sinks; /* [Hq] sink logits, or NULL */
  int64_t layer;
  /* > 0: the call runs on the calling thread (attn_kv_run_here with this
   * max_flops), its ATTN_KV_LATER returned as is; 0: submitted. */
  double here;
} tkv_opts;
extern const tkv_opts tkv_plain; /* causal, no window */

/* One call on session id: queries [q0, q0 + nq) of s, and (nnew > 0) its
 * tokens [pos, pos + nnew) appended at pos. */
int tkv_call1(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
              const tkv_opts *op, int64_t q0, int64_t nq, int64_t pos, int64_t nnew, tkv_reply *y,
              double now, attn_status *st);
/* One step of n sessions as one batch call (at most TKV_BATCH_MAX):
 * session ids[i] of stream s[i] takes nq[i] queries and nn[i] new tokens
 * at pos[i]; its O [Hq, total queries, Dv] into *po (malloc). The
 * store's code or the job's. */
#define TKV_BATCH_MAX 4
typedef struct tkv_batch {
  const char *ids[TKV_BATCH_MAX];
  const tkv_stream *s[TKV_BATCH_MAX];
  int64_t pos[TKV_BATCH_MAX], nq[TKV_BATCH_MAX], nn[TKV_BATCH_MAX];
} tkv_batch;
int tkv_call_batch(attn_kv_store *kv, const tkv_batch *bt, int n, void **po, double now,
                   attn_status *st);
/* The relative L2 error of y's O against the float64 reference of queries
 * [q0, q0 + nq) over keys [0, nk) of s (bottom-right aligned), and the
 * largest of its lse's when it has statistics; a NaN counts as infinite. */
double tkv_ref_error(const tkv_stream *s, const tkv_opts *op, int64_t q0, int64_t nq, int64_t nk,
                     const tkv_reply *y);
/* One step on session id: queries and new tokens [pos, pos + n) of s;
 * tkv_ref_error over keys [0, pos + n), or INFINITY with why in st when
 * the call is refused. */
double tkv_step_error(attn_kv_store *kv, const char *id, const tkv_stream *s, const tkv_opts *op,
                      int64_t pos, int64_t n, attn_status *st);
/* How tkv_decode runs a session's stream: the prefill of pre tokens in
 * calls of at most chunk (0: one call), then one token a call to the
 * stream's end; each step checked against float64 when its reference
 * costs at most max_ops (0: always) and, past the prefill, every every-th
 * step (0 or 1: each) and the last; and each job's backend when backend is
 * set. tol 0: the dtype's ttol. */
typedef struct tkv_plan {
  int64_t pre, chunk, every;
  double max_ops;
  const char *backend;
  double tol;
} tkv_plan;
/* Runs the plan on session id; the steps that failed (a call refused, a
 * wrong length or backend, an error past tol), the first one's why in why. */
int tkv_decode(attn_kv_store *kv, const char *id, const tkv_stream *s, const tkv_opts *op,
               const tkv_plan *pl, char *why, size_t cap);

/* Everything x reads out, n bytes expected, read in pieces of 1, 7, 333,
 * 4096 and 65539 bytes in turn (malloc'd); NULL with why in why for an
 * error, a short or a long read, or a read past the end that is not 0. */
void *tkv_export_all(attn_kv_exporter *x, size_t n, char *why, size_t cap);

/* A store on e (backend: attn_kv_open's); the setup steps abort with a
 * message when they fail. */
attn_kv_store *tkv_open_store(attn_engine *e, uint64_t bytes, bool batch, const char *backend);
/* A store of pages of page_bytes in host memory (attn_kv_open_paged). */
attn_kv_store *tkv_open_paged(attn_engine *e, uint64_t bytes, size_t page_bytes);
/* Session (tenant, id) shaped for s (head_dim_v, v_from_k too). */
void tkv_make(attn_kv_store *kv, const char *tenant, const char *id, const tkv_stream *s,
              int64_t layers, int64_t max_tokens, double ttl, double now);

#endif
