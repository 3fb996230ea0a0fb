/*
 * kv.h — the session store: sessions, each a KV cache that calls append to
 * and attend over, kept in one pool of pages between requests.
 *
 * The store is a client of the engine (engine.h), not part of it: it
 * checks and admits a call, stores its new tokens in the session's pages,
 * and computes it as an ordinary engine job whose K and V are those pages
 * (attn_request.k_pages). Its one caller in attnd is the server's session
 * kind (the /v1/sessions routes), which opens the store at start, loads
 * and saves it with --session-dir, and expires it on its sweep; the tests
 * and the GPU benchmarks drive it directly.
 *
 * Threads and locks. Every function may be called from any thread. One
 * mutex per store guards its sessions, pages and waiting calls; it is never
 * held while bulk data moves, nor while the engine computes, and no thread
 * ever blocks on another call: a call that must wait is kept in the store
 * and started by whichever thread ends what it waits for (a job's
 * completion, on an engine thread). Completion callbacks run as
 * attn_engine_submit's do, never inside attn_kv_submit().
 */
#ifndef ATTN_KV_H
#define ATTN_KV_H

#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A store holds sessions, each a KV cache of fixed shape that calls append
 * to and attend over (FlashAttention's flash_attn_with_kvcache: append,
 * then attend). Its memory is one pool of fixed-size pages sized when the
 * store opens; a session reserves the pages of its whole max_tokens when it
 * is made, so an append never fails for memory and no session is evicted
 * for another (a grow session, attn_kv_shape.grow, reserves its pages as
 * its tokens arrive instead, from the pages no session reserved: its
 * appends may be refused, a whole session's never). A page holds page_tokens tokens of one
 * (session, layer, KV head), of K or of V; a latent session (v_from_k) has K pages only, and
 * reserves half the pages of one that stores both.
 *
 * Sessions are named by (tenant, id): each tenant is a namespace of its own.
 * Every function may be called from any thread. Times are attn_now()
 * seconds, passed in so that tests control the clock.
 */
typedef struct attn_kv_store attn_kv_store;

#define ATTN_KV_ID_MAX 128
#define ATTN_KV_TENANT_MAX 64
#define ATTN_KV_MAX_LAYERS 1024
#define ATTN_KV_BATCH_BUCKETS 8

typedef struct attn_kv_shape {
  int64_t heads_kv, head_dim;
  /* The values' head dim Dv, or 0: head_dim. */
  int64_t head_dim_v;
  /* A latent session (MLA's absorbed decode): it stores k only, and v is the
   * first head_dim_v columns of each k row (head_dim_v ≤ head_dim, set). */
  bool v_from_k;
  attn_dtype dtype;
  /* ATTN_KVQ_NONE: rows stored in dtype; else each appended row of K and
   * V stored per KV head as one-byte codes and an F32 scale (engine.h,
   * attn_kv_quant; create's "kv_dtype"), the calls still sending dtype.
   * Host pages only: a store on a device refuses it (EUNSUPPORTED). */
  attn_kv_quant kv_quant;
  int64_t layers;     /* >= 1 */
  int64_t max_tokens; /* >= 1, per layer */
  /* Pages are reserved as tokens arrive (create's "reserve": "grow")
   * instead of for the whole max_tokens at create: an append the pool
   * cannot hold is then ESESSION_MEMORY, with nothing appended. A grow
   * session never takes pages a whole session reserved. */
  bool grow;
} attn_kv_shape;

/* What a session is now (attn_kv_get, attn_kv_list); its shape's
 * head_dim_v is set (Dv, never 0). */
typedef struct attn_kv_info {
  char tenant[ATTN_KV_TENANT_MAX + 1]; /* whose namespace: "" without API keys */
  char id[ATTN_KV_ID_MAX + 1];
  attn_kv_shape shape;
  double ttl_s;
  double expires; /* attn_now() seconds at which it expires unless used */
  /* a grow session's: the pages it holds now; a fork's leaves out the full
   * pages it shares that another session pays for (kv_int.h, P2) */
  uint64_t reserved_bytes;
  uint64_t shared_bytes; /* pages it holds that other sessions (its forks) hold too */
  uint64_t used_bytes;   /* pages holding its tokens, shared ones included */
  int64_t tokens;        /* summed over layers */
} attn_kv_info;

/* Totals of a store, for metrics and /v1/info. */
typedef struct attn_kv_stats {
  int64_t sessions;
  uint64_t pool_bytes, reserved_bytes, used_bytes; /* used: pages holding tokens */
  uint64_t quantized_bytes; /* of reserved_bytes, quantized sessions' (kv_quant) */
  int64_t page_bytes;
  const char *where; /* "host", or the backend whose device holds the pages ("cuda") */
  uint64_t appended_tokens, replays, conflicts, expired;
  /* Engine jobs the store ran, by the calls each computed: at most 1, 2,
   * 4, ..., 64, then more (a histogram's buckets, not cumulative). */
  uint64_t batch_sizes[ATTN_KV_BATCH_BUCKETS];
  uint64_t batched_calls;      /* calls over all those jobs */
  int64_t waiting;             /* calls held in the store for a layer's job, readers or write */
  uint64_t tenant_cap_bytes;   /* attn_kv_set_tenant_cap's, in whole pages; 0: none */
  uint64_t tenant_cap_refused; /* creates (and grow sessions' appends) refused for it */
  /* Bytes of free host pages given back to the kernel (a page free for
   * about a second, once a sweep sees it), in all. */
  uint64_t returned_bytes;
  /* Pages forks share: held by more than one session, each counted once;
   * and the pages that sharing saves (holds past each page's first). */
  uint64_t shared_bytes, saved_bytes;
} attn_kv_stats;

/* Checks an id against the contract: 1-128 of [A-Za-z0-9._-], not starting
 * with '_' or '.'. Returns 0 or ATTN_EINVAL with a message. */
int attn_kv_id_check(const char *id, size_t len, attn_status *st);

/* A store of `bytes` of pages on engine e; batch: calls that arrive while
 * a job reading one of their layers runs wait for it and are computed
 * together as one job (calls of other layers never wait). backend
 * NULL or "auto": the pages live on a GPU when the engine has one that
 * lends device memory for them (the cuda backend: bytes on its first
 * device, and its kernels compute the calls), else in host memory (the cpu
 * backend computes); "cpu": host memory whatever the engine has. On a GPU
 * a call's new tokens reach their pages in its own job, so a later call
 * on one of its layers waits for that job with batch false too (each
 * then a job of its own). */
int attn_kv_open(attn_engine *e, uint64_t bytes, bool batch, const char *backend,
                 attn_kv_store **ps, attn_status *st);
/*
 * The same with pages of page_bytes (0: ATTN_KV_PAGE_BYTES), a power of
 * two from ATTN_KV_PAGE_BYTES_MIN to ATTN_KV_PAGE_BYTES_MAX (else EINVAL):
 * attnd's --session-page-bytes. A page holds one (layer, KV head)'s rows
 * of K or of V, so smaller pages let forks share more of a history (a
 * fork copies the partial page it appends into) and waste less of a
 * short session's reservation, for more pages a call's job walks. A
 * shape fewer than ATTN_PAGE_MIN_TOKENS of whose rows fit a page is
 * refused (EUNSUPPORTED, naming the page size that holds it). A device
 * finds a page's number from its address with ATTN_KV_PAGE_BYTES, so
 * pages of another size are host memory whatever backend says.
 */
#define ATTN_KV_PAGE_BYTES_MIN ((size_t)16 << 10)
#define ATTN_KV_PAGE_BYTES_MAX ((size_t)64 << 10) /* ATTN_KV_PAGE_BYTES, the default */
bool attn_kv_page_bytes_ok(uint64_t page_bytes);
int attn_kv_open_paged(attn_engine *e, uint64_t bytes, size_t page_bytes, bool batch,
                       const char *backend, attn_kv_store **ps, attn_status *st);
/* Frees the store; no call may be in flight. */
void attn_kv_close(attn_kv_store *s);

/* A shape's value head dim Dv: head_dim_v, or head_dim when it is 0.
 * Inline: the codecs read it without linking the store. */
static inline int64_t attn_kv_shape_dv(const attn_kv_shape *sh) {
  return sh->head_dim_v ? sh->head_dim_v : sh->head_dim;
}
/* The name of the dtype a shape's rows are stored in: kv_quant's, or
 * dtype's when it stores them unquantized (create's and GET's "kv_dtype"). */
static inline const char *attn_kv_shape_kv_dtype(const attn_kv_shape *sh) {
  return sh->kv_quant ? attn_kv_quant_name(sh->kv_quant) : attn_dtype_name(sh->dtype);
}
/* Bytes a session of this shape reserves at create (whole pages; 0 for
 * a grow session, which reserves as it takes them). */
uint64_t attn_kv_reserve_bytes(const attn_kv_store *s, const attn_kv_shape *sh);

/* Makes session (tenant, id), or finds it made with the same shape and ttl
 * (*created false: a retried create). ESESSION_EXISTS when it exists with
 * other parameters, ESESSION_MEMORY when its reservation does not fit,
 * EINVAL for a bad id or shape, EUNSUPPORTED for a shape the backend that
 * computes the store's calls cannot compute (a device's kernels: their
 * largest head dim, which max(head_dim, head_dim_v) must fit). */
int attn_kv_create(attn_kv_store *s, const char *tenant, const char *id, const attn_kv_shape *sh,
                   double ttl_s, double now, bool *created, attn_status *st);
/*
 * Forks session (tenant, id) into session (tenant, new_id): the same shape,
 * reserve and tenant, holding the first `length` tokens of every layer
 * (-1: each layer's own length), and ttl_s (0 or less: the source's; else
 * within a create's limits). The two then change independently; the pages
 * of the tokens it keeps are shared, not copied (a write into a shared
 * page copies it first), so a whole fork reserves its max_tokens' pages
 * less the full pages it shares, and a grow fork the partial last page of
 * each layer it will copy when it first appends there (kv_int.h, P1-P4).
 * Counts as a use of the source. ESESSION_NOT_FOUND for no such source,
 * ESESSION_EXISTS when new_id exists (whatever its parameters), EINVAL for
 * a bad id, ttl_s or length (a layer shorter than length, named),
 * ESESSION_MEMORY when the reservation does not fit the pool or the
 * tenant's cap, EUNSUPPORTED on a device store (its pages are not shared).
 */
int attn_kv_fork(attn_kv_store *s, const char *tenant, const char *id, const char *new_id,
                 int64_t length, double ttl_s, double now, attn_status *st);
/* Its info and each layer's length (lengths: cap entries, may be NULL).
 * ESESSION_NOT_FOUND for an unknown or expired one. Does not count as a use. */
int attn_kv_get(attn_kv_store *s, const char *tenant, const char *id, double now,
                attn_kv_info *info, int64_t *lengths, int64_t cap, attn_status *st);
/* Deletes it; its reservation is free at once (its pages once no call reads
 * them). */
int attn_kv_delete(attn_kv_store *s, const char *tenant, const char *id, double now,
                   attn_status *st);
/* Cuts every layer longer than length to length. */
int attn_kv_truncate(attn_kv_store *s, const char *tenant, const char *id, int64_t length,
                     double now, attn_status *st);
/* Calls fn on each live session of tenant (NULL: of every tenant, as a
 * replica handing its sessions over lists them) with each layer's length
 * (under the store's lock: fn must not call the store); returns how many. */
int64_t attn_kv_list(attn_kv_store *s, const char *tenant, double now,
                     void (*fn)(const attn_kv_info *info, const int64_t *lengths, void *arg),
                     void *arg);
/* Drops the sessions whose TTL passed, and gives the kernel back the host
 * pages free for about a second (pages.h); returns how many sessions it
 * dropped. The server calls it every tenth of a second. */
int64_t attn_kv_expire(attn_kv_store *s, double now);
void attn_kv_stats_get(attn_kv_store *s, attn_kv_stats *out);
/* The most bytes (whole pages, rounded down, at least one; 0: no cap, the
 * default) one tenant's sessions may reserve together: a create past it
 * is ESESSION_MEMORY, so that one tenant cannot lock the others out of the
 * pool. Sessions that exist (or attn_kv_load loads) are kept whatever it
 * is. */
void attn_kv_set_tenant_cap(attn_kv_store *s, uint64_t bytes);
/* Bytes tenant's sessions reserve now (attn_kv_stats' tenant_cap_bytes is
 * the cap). */
uint64_t attn_kv_tenant_reserved(attn_kv_store *s, const char *tenant);

/*
 * One call: append the new tokens to one layer of each of its sessions at
 * pos, then attend q over the layer's keys [0, pos + n_new). A call of one
 * entry is POST /v1/sessions/{id}/attention; of several, one layer of many
 * sessions (a model runner's batch), all or nothing.
 *
 * req carries what a stateless request would: q [Hq, Nq, D] (one entry) or
 * q packed [Hq, total_q, D] with cu_seqlens_q (several), o [Hq, Nq, Dv]
 * and the optional statistics laid out the same way, dtype, head_dim and
 * head_dim_v (the sessions': 0 for Dv = D), and the options (scale,
 * causal, windows, softcap, alibi_slopes, cancel). Its k, v, seq_kv,
 * batch, heads_kv and cu_seqlens_kv are the store's to fill; diag_offset
 * must be ATTN_DIAG_AUTO (off = pos + n_new - Nq per entry). The sessions
 * of one call share heads_kv, head_dim, head_dim_v and v_from_k.
 *
 * Entry e's new keys are rows [kv_off[e], kv_off[e] + n_new[e]) of k_new,
 * [Hkv, total_new, D], and its values the same rows of v_new, [Hkv,
 * total_new, Dv], both contiguous in the session's dtype (n_new 0: attend
 * over the layer's whole length; pos is then ignored). The entries' rows
 * follow one another from row 0 and use every row, as cu_seqlens_kv would
 * lay them out. A latent session's call sends k only: v_new must be NULL
 * (its values are the first Dv columns of k_new's rows).
 */
typedef struct attn_kv_entry {
  const char *id;
  int64_t pos, n_new, kv_off;
  int64_t length; /* out: the layer's length after the call */
  bool replay;    /* out: the tokens were there already, bit for bit */
} attn_kv_entry;

typedef struct attn_kv_call {
  const char *tenant;
  int64_t layer;
  int64_t nentries;
  attn_kv_entry *entries;
  const void *k_new, *v_new;
  int64_t total_new;
  attn_request req;
} attn_kv_call;

/*
 * Applies the call (validated, appended, or refused with nothing appended:
 * ESESSION_NOT_FOUND, ESESSION_CONFLICT whose message gives the length,
 * ESESSION_FULL, ESESSION_MEMORY when grow sessions' new pages do not fit
 * the pool or the tenant's cap (for every entry: none appends), ESHAPE or EDTYPE for what is not
 * the session's, naming the entry), then queues its computation; done runs once the outputs are
 * written, exactly as for attn_engine_submit. On error nothing is queued
 * and done will not run. Calls on one layer apply in the order they reach
 * this function; the call and its buffers must stay valid until done.
 * Nothing here waits for another call: one that cannot apply yet (it would
 * overwrite keys a running call reads, after a truncate; or an earlier
 * call on one of its layers waits or is being stored) is accepted (0) and
 * kept, and its refusal, if it comes to one, reaches done's status.
 */
int attn_kv_submit(attn_kv_store *s, attn_kv_call *call, double now, attn_done_fn done, void *arg,
                   attn_status *st);
/*
 * The same call computed on the calling thread (attn_engine_run_here), for
 * a caller that answers small calls where it read them: when it can go at
 * once (no other call reads or writes any of its layers, and none waits
 * for one) and its work is at most max_flops (its FLOPs, plus 16384 an
 * entry for what each entry's job costs beside them). Returns 0 with *res its
 * result (its status says how it ended), ATTN_KV_LATER when it cannot go
 * here (nothing was applied: attn_kv_submit it), or a refusal as
 * attn_kv_submit's. It never waits for another call: calls that were
 * kept waiting for its layers while it ran start on the engine's threads.
 */
#define ATTN_KV_LATER 2
int attn_kv_run_here(attn_kv_store *s, attn_kv_call *call, double now, double max_flops,
                     attn_result *res, attn_status *st);
/*
 * The caller of the call whose attn_request.cancel is flag has set it (a
 * deadline, a client gone): a call still waiting in the store ends now
 * with ECANCELED, never computed, and a job of several calls is canceled
 * once every one of its callers has canceled (a call alone in its job is
 * canceled by its own flag, as any engine job is). Any thread.
 */
void attn_kv_cancel(attn_kv_store *s, const int *flag);
/* The same, waiting for the outputs, as attn_engine_run: returns the
 * call's code (0, or the refusal or the job's error, into *st as well) and
 * the job's result into *res when res is set. */
int attn_kv_run(attn_kv_store *s, attn_kv_call *call, double now, attn_result *res,
                attn_status *st);

/*
 * Persistence (--session-dir). attn_kv_save writes every live session of
 * the store to dir, one file each (temporary file, fsync, rename, then an
 * fsync of dir), with its remaining TTL; attn_kv_load reads them back,
 * moving a file that does not load to "<name>.bad" and reporting it through
 * log (may be NULL; its lines escape control bytes), a ttl_s past ttl_max
 * (the server's --session-ttl-max) cut to it. A file is refused as a
 * create or a call would refuse its fields and rows (load.c). Both
 * return how many sessions they wrote or loaded, or a negative code with
 * st set.
 */
int64_t attn_kv_save(attn_kv_store *s, const char *dir, double now, attn_status *st);
int64_t attn_kv_load(attn_kv_store *s, const char *dir, double now, double ttl_max,
                     void (*log)(const char *line, void *arg), void *arg, attn_status *st);

/*
 * Moving a session to another store (GET /v1/sessions/{id}/export, PUT
 * /v1/sessions/{id}/import). attn_kv_export reads session (tenant, id)
 * out: its info, each layer's length into lengths (info->shape.layers
 * entries: ATTN_KV_MAX_LAYERS fits any), and layer l's rows into k[l],
 * [heads_kv, lengths[l], head_dim], and v[l], [heads_kv, lengths[l],
 * head_dim_v], packed in the session's dtype (v[l] NULL for a latent
 * session; v itself may then be NULL). A quantized session's (kv_quant)
 * hold the rows' codes, one byte an element, and after them each row's
 * F32 scale, [heads_kv, lengths[l]]. The buffers are malloc'd: the
 * caller frees each. It does not count as a use (its TTL is not renewed).
 * ESESSION_NOT_FOUND; ESESSION_CONFLICT on a device store while calls on it
 * run (their rows may not be in its pages yet): export it once they have
 * ended.
 *
 * attn_kv_import makes session (tenant, id) of shape sh and ttl_s from
 * such rows, as a create and then calls would have made it: the fields
 * held to a create's limits, each length 0 to max_tokens, every value
 * finite (ENONFINITE saying which layer's k or v is not; a quantized
 * session's scales finite and above 0, or 0 for a row whose codes are all
 * 0, its codes no E4M3 NaN (0x7F, 0xFF), and code·scale finite, EINVAL
 * saying which otherwise); v must be NULL for a latent session, and set (with a buffer for every
 * layer of length above 0) for another. ESESSION_EXISTS when the store has a session of that id,
 * whatever its parameters (an import never replaces one); ESESSION_MEMORY when its reservation does
 * not fit, or the tenant's cap. An export of the imported session gives back the same rows. An
 * import copies the rows without the store's lock: meanwhile the session exists with no
 * tokens, and calls on it wait for the copy.
 */
int attn_kv_export(attn_kv_store *s, const char *tenant, const char *id, double now,
                   attn_kv_info *info, int64_t *lengths, void **k, void **v, attn_status *st);
/* The same rows read out as they are wanted, without a copy of the
 * session: attn_kv_export_open (its errors are attn_kv_export's) sets info
 * and lengths as attn_kv_export does; each attn_kv_export_read then writes
 * the next bytes of k[0], v[0], k[1], v[1], ... (as attn_kv_export's
 * buffers hold them, one after the other; no v for a latent session) into
 * buf, up to cap: the count (below cap only at the end; 0 once all are
 * read), or -1 with st set (a device's error); attn_kv_export_close ends
 * it (read through or not). Until then the export holds the rows it reads
 * as a running call does (a delete or an expiry frees them at the close;
 * an append over them, after a truncate or into a fork's shared page,
 * waits for it), and reads them outside the store's lock: close it
 * promptly, and before attn_kv_close. Any thread, one at a time. */
typedef struct attn_kv_exporter attn_kv_exporter;
int attn_kv_export_open(attn_kv_store *s, const char *tenant, const char *id, double now,
                        attn_kv_info *info, int64_t *lengths, attn_kv_exporter **x,
                        attn_status *st);
int64_t attn_kv_export_read(attn_kv_exporter *x, void *buf, size_t cap, attn_status *st);
void attn_kv_export_close(attn_kv_exporter *x);
int attn_kv_import(attn_kv_store *s, const char *tenant, const char *id, const attn_kv_shape *sh,
                   double ttl_s, double now, const int64_t *lengths, const void *const *k,
                   const void *const *v, attn_status *st);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_KV_H */
