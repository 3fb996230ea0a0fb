/*
 * kv_int.h — a session store's insides, shared by the files that make it
 * up (internal to engine/kv/).
 *
 * The files, from the bottom up: each calls only the files before it (and
 * the engine), never one after it.
 *   pages.c   the page pool (pages.h)
 *   shape.c   a session's shape in pages: widths, tokens a page, checks
 *   quota.c   what each tenant reserves
 *   id.c      a session id against the contract
 *   quant.c   a quantized session's rows as they move
 *   share.c   pages forks share: who pays for them, copies on write
 *   rows.c    a layer's pages taken as it grows, its rows in and out
 *   store.c   the table of sessions and their life
 *   fork.c    a session forked: a new one sharing its pages
 *   batch.c   the engine request of an entry alone and of a job of calls
 *   admit.c   a call checked and admitted, parked, or refused
 *   sched.c   a call's rows stored, its job started and ended, cancel
 *   file.c, save.c, load.c   sessions saved to and loaded from files
 *   move.c    a session's rows exported, a session imported from rows
 *
 * One lock (attn_kv_store.mu) guards everything here, and is never held
 * while bulk data moves: an append's rows are copied into pages the call
 * took under the lock, with the layer marked as being written, and published
 * under the lock again. A call that reads a layer counts as its reader from
 * the moment it is admitted until its job completes; while a layer has
 * readers, nothing it reads is freed or overwritten: a delete or an expiry
 * leaves the pages to the last reader, and an append into tokens a reader
 * may see (after a truncate) waits, parked, for the readers to finish. No
 * thread ever blocks on another call: a call that must wait is kept in the
 * store and started by whichever thread ends what it waits for.
 *
 * On a device the rows are not copied at admission: the length is
 * published at once and the call's job carries the rows in its own upload
 * (attn_request.page_rows), written into their pages on the job's stream
 * before its kernel reads them. So until that job ends, its layer's rows
 * may not be on the device yet: a later call on the layer waits for the
 * job (busy, batching or not), a replay's check of stored rows waits for
 * the layer's readers, an appending call is never dropped before its job
 * (a canceled one runs it canceled), and a job that fails, or is a
 * variable-length batch the engine splits, writes its rows with the
 * synchronous copies before it ends.
 *
 * Forks (fork.c, share.c). A fork holds the same pages as its source for
 * the tokens it keeps, at the same (layer, page, head) places of its
 * tables, so every holder of a page is found among the sessions forked
 * from one another (a ring: kv_session.kin) at that place. All heads, K
 * and V of one (layer, page) are taken, shared and let go of together: a
 * "slot" below is the u = heads_kv x tensors pages there. A page is full
 * for a holder when the holder's length covers all its tokens, partial
 * when it does not (a page past the length, held for a reader, is
 * partial).
 *   P1. A page held more than once is never written: a write (an append)
 *       into a slot whose pages are shared first takes fresh pages,
 *       copies the rows below the write into them and lets the old ones
 *       go (share.c, attn__kv_cow; on a device when the call is planned,
 *       where a failed copy refuses it). A layer whose readers may read such a
 *       page makes that append wait for them (admit.c), so a page a job
 *       reads is never let go of under it; every other holder's readers
 *       keep it by their own holds.
 *   P2. Who pays. Each holder of a slot pays for it (counts its u pages
 *       in reserved_pages) when the slot is partial for it, whatever else
 *       holds it: it may have to copy it. Of the holders for which it is
 *       full, exactly one pays (kv_layer.ride false), the others ride
 *       (ride true: ride is only ever set on a full slot). A whole
 *       session pays for every slot it does not ride on, held or not:
 *       reserved_pages = u x (layers x pages_per_head - slots it rides);
 *       a grow session for the slots it holds and does not ride on.
 *   P3. So every taken page is paid for at least once, a page shared is
 *       paid for once plus once per holder that may still copy it, and
 *       the pool's reserved count (the sum of reserved_pages, as the
 *       tenants' are per tenant) covers every page taken and every page a
 *       whole session may yet take: a whole session's append never fails
 *       for memory, forked or not. Forks share their source's tenant, so
 *       passing a payment between them never changes a tenant's count.
 *   P4. A holder that stops holding a slot full (a truncate below it, or
 *       its end) while paying for it passes the payment to a rider, if
 *       any: moved, when it stops paying (deleted, or a grow session that
 *       lets the slot go), else added to the rider's and the pool's count.
 *       A rider that stops holding it full starts paying (a whole
 *       session, or a grow one still holding it). A truncate whose new
 *       payments do not fit the pool or the tenant's cap is refused,
 *       nothing cut; a delete only ever moves or frees payments.
 */
#ifndef ATTN_KV_INT_H
#define ATTN_KV_INT_H

#include "kv.h"
#include "pages.h"

#include <pthread.h>

typedef struct kv_layer {
  int64_t length;
  int64_t npages;  /* pages taken per KV head, for K and for V alike */
  int64_t readers; /* calls admitted whose job has not completed */
  int64_t read_hi; /* the most keys any of them reads */
  int64_t jobs;    /* jobs started that read it (a call waits for these to batch) */
  bool writing;    /* an append's rows are being copied in, outside the lock */
  bool cut;        /* truncated below that append meanwhile: it publishes no length */
  float absmax[2]; /* largest |k| and |v| stored (never lowered by a truncate) */
  bool *ride;      /* [pages_per_head]: a full slot another holder pays for (P2) */
  /* Page tables, [heads_kv][pages_per_head]: NULL past npages. A latent
   * session's vp is NULL: its values are its K pages' rows. */
  void **kp, **vp;
} kv_layer;

typedef struct kv_session {
  char tenant[ATTN_KV_TENANT_MAX + 1];
  char id[ATTN_KV_ID_MAX + 1];
  attn_kv_shape shape;
  double ttl_s, expires;
  int64_t page_tokens, pages_per_head;
  int64_t pitch; /* elements from one row of a page to the next (attn__kv_pitch) */
  int64_t unit;  /* the pages of one (layer, page) slot: heads_kv x tensors (P2's u) */
  /* Pages it reserves in the pool and counts against its tenant: its whole
   * max_tokens' from create, or a grow session's pages it holds now. */
  int64_t reserved_pages;
  int64_t readers; /* over all layers */
  bool dead;       /* out of the table: freed by its last reader */
  kv_layer *layers;
  struct kv_session *kin;  /* the next of the sessions forked from one another (a ring) */
  struct kv_session *next; /* hash chain */
} kv_session;

#define KV_BUCKETS 4096

/* What one entry of a call does to its layer. */
typedef struct kv_use {
  kv_session *ks;
  kv_layer *L;
  int64_t extent; /* keys it reads: [0, extent) */
  bool append;
} kv_use;

/* A call the store holds until its job ends. */
typedef struct kv_pending {
  attn_kv_call *call;
  attn_done_fn done;
  void *arg;
  double now;     /* the submit's clock, for a call admitted later */
  kv_use *uses;   /* one per entry, once admitted */
  float (*mx)[2]; /* each entry's new tokens' largest |k|, |v| */
  double flops;
  attn_status st; /* why a parked call was refused */
  /* attn_kv_run_here's: never parked, and at most max_flops of work */
  bool here;
  double max_flops;
  struct kv_pending *next;
} kv_pending;

typedef struct kv_job {
  struct attn_kv_store *s;
  kv_pending *calls; /* in arrival order */
  int64_t ncalls, nentries;
  bool gathered; /* q, o and statistics pass through buf */
  int cancel;    /* set once every call's caller has canceled */
  attn_request req;
  const void **kp, **vp;
  int64_t *cu_q, *cu_kv;
  int64_t *used;        /* a device batch's key counts per entry (seqused_kv) */
  attn_page_rows *rows; /* on a device: its appends' new rows (req.page_rows) */
  bool owes_rows;       /* on a device: rows of its appends not yet written */
  char *buf;
  struct kv_job *next;     /* jobs started together */
  struct kv_job *run_next; /* the store's running jobs */
} kv_job;

/* Work found under the lock, done after it: jobs to start, parked calls
 * admitted (their rows to store) and parked calls refused. */
typedef struct kv_after {
  kv_job *jobs;
  kv_pending *land, *failed;
} kv_after;

typedef struct kv_tenant kv_tenant;

struct attn_kv_store {
  attn_engine *engine;
  pthread_mutex_t mu;
  attn_kvpages pages;
  kv_session *buckets[KV_BUCKETS];
  int64_t nsessions;
  bool batch;
  kv_pending *pending; /* admitted calls waiting for a job on their layers (batching) */
  kv_pending *parked;  /* calls not yet admitted: they wait for readers or a write */
  kv_job *running;     /* jobs started and not ended */
  attn_kv_stats stats; /* the counters; sessions and bytes are filled when read */
  kv_tenant *tenants;  /* pages each tenant's sessions reserve (quota.c) */
  int64_t tenant_cap;  /* pages one tenant may reserve; 0: no cap */
};

/* Pages on a device pad each row to a multiple of this many elements, as
 * the kernels read them (16-byte aligned rows, padding zero). */
#define KV_DEVICE_ALIGN 8
/* The widest row a page may hold: max(head_dim, head_dim_v) at most. */
#define KV_WIDEST \
  (ATTN_MAX_HEAD_DIM > ATTN_MAX_HEAD_DIM_V ? ATTN_MAX_HEAD_DIM : ATTN_MAX_HEAD_DIM_V)
/* share.c: the ring of forks (ks joins src's; ks leaves its own); whether slot p of layer L is held
 * more than once; pages layer l of ks must add to the pool's reserved count to be cut to length
 * (P4), and the cut's payments applied (apply: the count added too, its fit checked by the caller);
 * every payment ks makes for a slot another holds passed on (its end); whether an append over
 * tokens [from, to) of L writes into a held slot whose pages are shared,
 * and those slots copied to fresh pages (P1; the error of a device's failed
 * copy, the slot then still shared); pages ks holds that others hold too. */
void attn__kv_kin_join(kv_session *src, kv_session *ks);
void attn__kv_kin_leave(kv_session *ks);
bool attn__kv_slot_shared(const attn_kvpages *pool, const kv_layer *L, int64_t p);
int64_t attn__kv_cut_need(attn_kv_store *s, kv_session *ks, int64_t l, int64_t length, bool apply);
void attn__kv_pass_all(attn_kv_store *s, kv_session *ks);
bool attn__kv_cow_needed(const attn_kvpages *pool, const kv_session *ks, const kv_layer *L,
                         int64_t from, int64_t to);
int attn__kv_cow(attn_kv_store *s, const kv_session *ks, kv_layer *L, int64_t from, int64_t to,
                 attn_status *st);
int64_t attn__kv_shared_pages(const attn_kvpages *pool, const kv_session *ks);

/* The width W = max(head_dim, Dv) of a shape's pages' rows, K's and V's alike (each zero past its
 * own width, so one engine request of head dim W computes it: engine.h, k_pages); the columns of a
 * row of K (t 0) or V (t 1) as a call sends them and a file holds them; how many tensors it stores
 * (a latent session: K only). */
int64_t attn__kv_width(const attn_kv_shape *sh);
static inline int64_t attn__kv_cols(const attn_kv_shape *sh, int t) {
  return t ? attn_kv_shape_dv(sh) : sh->head_dim;
}
int attn__kv_tensors(const attn_kv_shape *sh);
/* quant.c, a quantized session's rows as they move: a row's codes, then
 * its F32 scale. Bytes of a moved row of K (t 0) or V (t 1) (a row of
 * the dtype for a session that is not quantized); n rows of src (cols
 * elements of the dtype each, packed) quantized into moved rows at dst;
 * the largest |code·scale| bound of n moved rows (qmax·scale), or -1 with
 * *bad the first row no quantizer writes (a scale not finite, negative
 * or too large, 0 under nonzero codes; an E4M3 NaN code); rows [i, i + n)
 * of a host page written from moved rows (the row's padding zeroed), and
 * read into them. */
size_t attn__kv_xrow(const attn_kv_shape *sh, int t);
/* Bytes of a layer's K (t 0) or V (t 1) of length rows moved out: [heads_kv,
 * length] moved rows (a quantized session's codes, then their scales). */
static inline size_t attn__kv_tensor_bytes(const attn_kv_shape *sh, int64_t length, int t) {
  return (size_t)sh->heads_kv * (size_t)length * attn__kv_xrow(sh, t);
}
void attn__kv_quantize(const attn_kv_shape *sh, int t, const void *src, int64_t n, char *dst);
float attn__kv_xrows_absmax(const attn_kv_shape *sh, int t, const void *rows, int64_t n,
                            int64_t *bad);
void attn__kv_qput(const kv_session *ks, char *page, int64_t i, int64_t n, int t, const void *src);
void attn__kv_qget(const kv_session *ks, const char *page, int64_t i, int64_t n, int t, void *dst);
/* Elements from one row of a page to the next: W in host memory, padded
 * on a device. */
int64_t attn__kv_pitch(const attn_kv_store *s, const attn_kv_shape *sh);
/* Tokens a page of page_bytes holds for rows of row_bytes: a multiple of
 * ATTN_PAGE_ALIGN_TOKENS where one fits, else of ATTN_PAGE_MIN_TOKENS (0:
 * too wide for a page). */
int64_t attn__kv_tokens_fit(size_t page_bytes, int64_t row_bytes);
/* Tokens a page holds for this shape (attn__kv_tokens_fit of its rows). */
int64_t attn__kv_page_tokens(const attn_kv_store *s, const attn_kv_shape *sh);
/* A session's pages per KV head and tensor (0: too wide for a page), and
 * the pages its create reserves (none for a grow session: it reserves
 * them as it grows). */
int64_t attn__kv_pages_per_head(const attn_kv_store *s, const attn_kv_shape *sh);
int64_t attn__kv_reserve_pages(const attn_kv_store *s, const attn_kv_shape *sh);
/* A shape within the limits a create takes: 0, or EINVAL (EDTYPE) with
 * what is wrong. */
int attn__kv_shape_check(const attn_kv_shape *sh, attn_status *st);
/* Whether the store can hold and compute sessions of a valid shape: its
 * rows fit a page, and the backend that computes its calls takes their
 * head dim; 0 or EUNSUPPORTED with the reason. */
int attn__kv_computable(attn_kv_store *s, const attn_kv_shape *sh, attn_status *st);
/* The live session (tenant, id) at now, or NULL. */
kv_session *attn__kv_find(attn_kv_store *s, const char *tenant, const char *id, double now);
/* A new session in the table, its reservation taken and its tables made, or
 * NULL with st set (ESESSION_MEMORY, ENOMEM). */
kv_session *attn__kv_insert(attn_kv_store *s, const char *tenant, const char *id,
                            const attn_kv_shape *sh, double ttl_s, double now, attn_status *st);
/* The same, reserving need pages (a fork's: fork.c) instead of its shape's. */
kv_session *attn__kv_insert_need(attn_kv_store *s, const char *tenant, const char *id,
                                 const attn_kv_shape *sh, double ttl_s, double now, int64_t need,
                                 attn_status *st);
/* Takes session (tenant, id) out of the table (a no-op when there is none):
 * freed now, or by its last reader. */
void attn__kv_remove(attn_kv_store *s, const char *tenant, const char *id);
/* Pages layer L of ks must add to its reservation to hold `tokens` tokens:
 * 0 but for a grow session short of them. */
int64_t attn__kv_grow_need(const kv_session *ks, const kv_layer *L, int64_t tokens);
/* Takes pages until layer L of ks has room for `tokens` tokens; a grow
 * session reserves them first (its tenant counts them), and false (nothing
 * taken) when the pool does not have attn__kv_grow_need of them free. */
bool attn__kv_grow(attn_kv_store *s, kv_session *ks, kv_layer *L, int64_t tokens);
/* What ks is now, as attn_kv_get reports it. */
void attn__kv_info_of(const attn_kv_store *s, const kv_session *ks, attn_kv_info *info);
/* On a device a call's rows reach their pages in its own job: until the
 * readers of a layer end, its length may run ahead of its pages. So an
 * export or a fork (which read every row) of a session with calls running
 * is ESESSION_CONFLICT, the message saying to `verb` it once they have
 * ended; 0 on host pages, or when none runs. */
int attn__kv_dev_settled(const attn_kv_store *s, const kv_session *ks, const char *verb,
                         attn_status *st);
/* Where row j of KV head hk of L's K (t 0) or V (t 1; a latent session's
 * K) lies (a device address for pages on a device). */
char *attn__kv_row_at(const kv_session *ks, const kv_layer *L, int t, int64_t hk, int64_t j);
/* Rows from j that lie in j's page, up to end: a span of rows one copy
 * moves. */
int64_t attn__kv_span(const kv_session *ks, int64_t j, int64_t end);
/* Rows [j, j + n) (in one page) of KV head hk of a layer's K (t 0) or V
 * (t 1), written from src or read into dst (moved rows, attn__kv_xrow
 * bytes each, packed; written, the rest of the page's row zeroed): memcpy
 * for host pages, a copy to or from the device for others; 0 or the
 * device's error (or ENOMEM). */
int attn__kv_rows_put(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t j, int64_t n, const void *src, attn_status *st);
int attn__kv_rows_get(const attn_kv_store *s, const kv_session *ks, const kv_layer *L, int t,
                      int64_t hk, int64_t j, int64_t n, void *dst, attn_status *st);
/* A reader of ks ended: frees a dead session once its last reader has. */
void attn__kv_reader_done(attn_kv_store *s, kv_session *ks, kv_layer *L);

/* batch.c: entry e's query rows; the request entry e runs as alone (k and
 * v from its layer's pages); a call's memory freed. A job: one of call p,
 * p added to the job of matching options in a list (or to a new one at its
 * end; false out of memory), its request built (0; -1 out of memory; -2
 * when its calls are not all of one shape), its gathered outputs given
 * back to each call, and freed with its calls. */
int64_t attn__kv_entry_rows(const attn_kv_call *c, int64_t e);
void attn__kv_lone_request(const attn_kv_store *s, const attn_kv_call *c, int64_t e,
                           const kv_use *u, attn_request *r);
void attn__kv_pending_free(kv_pending *p);
kv_job *attn__kv_job_new(attn_kv_store *s, kv_pending *p);
bool attn__kv_group_add(attn_kv_store *s, kv_job **jobs, kv_pending *p);
int attn__kv_job_build(kv_job *j);
void attn__kv_job_scatter(const kv_job *j);
void attn__kv_job_free(kv_job *j);

/* admit.c: a call's shape checked (before the lock), and the call as the
 * store keeps it, its values checked (NULL with st set). Under the lock: p
 * admitted (0), parked (1), left alone for a call run here that cannot go
 * at once (ATTN_KV_LATER) or refused (an error); the parked calls that
 * can go on now, admitted or refused into a; whether an admitted call
 * appends; the end of every use of an admitted call. Entry e's new rows
 * of KV head h of K (t 0) or V (t 1), rows of `row` bytes. */
int attn__kv_call_check(const attn_kv_call *c, attn_status *st);
kv_pending *attn__kv_pending_new(attn_kv_call *call, attn_done_fn done, void *arg, double now,
                                 attn_status *st);
int attn__kv_enter(attn_kv_store *s, kv_pending *p, attn_status *st);
void attn__kv_retry_parked(attn_kv_store *s, kv_after *a);
/* sched.c: a reader of every layer of ks that no call is (an export) ends,
 * and the calls that waited for it start; takes the lock. */
void attn__kv_unread(attn_kv_store *s, kv_session *ks);
bool attn__kv_appends(const kv_pending *p);
void attn__kv_release(attn_kv_store *s, kv_pending *p);
const char *attn__kv_new_rows(const attn_kv_call *c, int64_t e, int t, int64_t h, size_t row);

/* Per-tenant reservations (quota.c): the pages tenant's sessions
 * reserve; adds pages (negative: takes them) to its count, -1 when out of
 * memory; frees the counts. */
int64_t attn__kv_tenant_pages(attn_kv_store *s, const char *tenant);
int attn__kv_tenant_add(attn_kv_store *s, const char *tenant, int64_t pages);
void attn__kv_tenants_free(attn_kv_store *s);
/* Whether need more pages keep tenant within the store's cap; the refusal
 * (ESESSION_MEMORY with the numbers, counted) when not, of a create or
 * (append) of a grow session's new tokens. */
bool attn__kv_tenant_fits(attn_kv_store *s, const char *tenant, int64_t need);
int attn__kv_tenant_refuse(attn_kv_store *s, const char *tenant, int64_t need, bool append,
                           attn_status *st);

#endif
