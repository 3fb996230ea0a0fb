/*
 * cuda_int.h — the cuda backend's internals, shared by its files.
 *
 * Internal to engine/cuda/. The backend (cuda.c, its ops) holds one
 * cu_state: up to ATTN_MAX_CUDA_DEVICES devices (device.c), each with
 * --streams slots; a slot is a stream, a pinned staging buffer and at most
 * one job, laid out by stage.c, moved by copy.c, run on its streams by
 * stream.c; the one dispatcher thread (dispatch.c) hands jobs to slots,
 * whose own threads stage and finish them. pinned.c lends page-locked
 * host memory to callers.
 */
#ifndef ATTN_CUDA_INT_H
#define ATTN_CUDA_INT_H

#include "backend.h"
#include "kernels.h"
#include "sinks.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

struct cu_dev;

/* Most (batch, head) groups a job is split into, so the upload of one, the
 * kernel of the one before and the download of the one before that run at
 * once; and the pinned chunks a strided or padded input is packed through
 * on its way up (two, so packing one overlaps the other's upload). */
#define CU_MAX_GROUPS 8
#define CU_CHUNK_BYTES ((size_t)4 << 20)

/* Where a slot's job is: FREE (no job), START (a slot thread stages and
 * queues it), RUN (its streams run it; the fault poll watches it), FINISH
 * (a slot thread checks and completes it). */
typedef enum cu_phase { CU_FREE, CU_START, CU_RUN, CU_FINISH } cu_phase;

/* One group of a job: the flat units u = b * Hkv + hk in [u0, u0 + nu)
 * (whole batch entries, or KV heads of a batch of one), its launch params
 * (device pointers into the job's tensors) and kernel choice. */
typedef struct cu_group {
  int64_t u0, nu;
  attn_cu_params prm;
  attn_cu_choice ch;
  const float *sinks; /* device: the sink of its first query head on; NULL: none */
} cu_group;

typedef struct cu_slot {
  struct cu_dev *dev;
  /* Kernels run on stream, uploads on up, downloads on down; events order
   * them per group (ev_up, ev_k) and guard the packing chunks' reuse. */
  cudaStream_t stream, up, down;
  cudaEvent_t ev_up[CU_MAX_GROUPS], ev_k[CU_MAX_GROUPS], ev_chunk[2];
  unsigned char *chunk[2]; /* pinned, CU_CHUNK_BYTES each */
  bool chunk_busy[2];      /* ev_chunk[i] recorded since chunk i was last reused */
  int chunk_next;          /* the chunk packed next */
  /* Pinned staging for the small inputs (a caller's lse, ALiBi slopes,
   * sinks, the scan results) and outputs that are not downloaded in place: it mirrors
   * the device layout from offset off_misc. */
  unsigned char *pinned;
  size_t pinned_cap;
  attn_job *job; /* NULL when free */
  cu_phase phase;
  bool fn_ran; /* the host function ran before the slot thread left START */
  pthread_t th;
  pthread_cond_t cv;
  bool th_made;
  /* The job's layout in device memory: the inputs (q k v, and o do for a
   * backward pass; then a caller's lse), the ALiBi slopes, the sinks, the scan
   * results (per group and input), the outputs (o m l lse, or dq dk dv
   * dsinks); device memory also holds scratch after them (split-KV
   * partials, a recomputed lse and the backward's D, or the lse a sink
   * fold needs that the caller did not ask for). */
  int nin, nout, ngroups;
  size_t off[5], off_misc, off_scan, off_out[3], off_stats[3], off_lse, off_ws;
  size_t off_alibi; /* the slopes in log2 units, F32 [B, Hq]; SIZE_MAX: none */
  /* The sinks, F32 [Hq] (an input), and a backward's dsinks, F32 [Hq] (an
   * output, downloaded after dq dk dv); SIZE_MAX: none. A forward with
   * sinks whose caller wants no lse gets it as scratch at off_lse, and m
   * at off_m when l is wanted without it (the fold needs them; sinks.h). */
  size_t off_sinks, off_dsinks, off_m;
  size_t off_tables; /* a paged job's K then V page tables, int32; SIZE_MAX: none */
  size_t off_used;   /* its per-entry key counts (seqused_kv), int32; SIZE_MAX: none */
  /* A paged job's new rows (attn_request.page_rows), nrows of them packed
   * [nrows, dp] at off_rows, and each one's byte offset in the page pool
   * (int64) at off_rowdst; SIZE_MAX: none. */
  size_t off_rows, off_rowdst, nrows;
  /* A small paged job's one round trip: q is packed into the staging with
   * the tables and rows (one upload), and the scan results, O and the
   * statistics come back in one download into the staging. */
  bool fold;
  size_t up_end, down_end, dev_bytes;
  /* Tensors copied straight between the device and the caller's memory
   * (contiguous and in the pinned pool): no pack, no unpack. */
  bool direct_in[5], direct_out[3], direct_stats[3];
  void *dmem;
  const float *sinks; /* device pointers at off_sinks and off_dsinks, or NULL */
  float *dsinks;
  attn_cu_params prm;
  attn_cu_choice ch;
  attn_cu_choice fch; /* backward without lse: the forward that computes it */
  cu_group grp[CU_MAX_GROUPS];
} cu_slot;

/* A block of the pinned pool (pinned.c). */
typedef struct cu_block {
  unsigned char *p;
  size_t len;
  bool lent;
  double idle_since;
} cu_block;

typedef struct cu_pinned {
  pthread_mutex_t mu;
  uint64_t cap, pinned, lent, refused;
  cu_block *b;
  int n, max;
} cu_pinned;

typedef struct cu_dev {
  struct cu_state *state;
  int ordinal;
  char name[96];
  int sms, major, minor;
  size_t mem_total;
  cudaMemPool_t pool;
  bool pool_made;
  bool healthy;
  char why[160]; /* why it is unhealthy */
  cu_slot *slots;
  int nslots, busy;
} cu_dev;

typedef struct cu_state cu_state;
struct cu_state {
  cu_dev devs[ATTN_MAX_CUDA_DEVICES];
  int ndev, streams;
  cu_pinned pin;
  /* A session store's pages (pages.c): one allocation on one device. */
  cu_dev *pages_dev;
  unsigned char *pages_base;
  size_t pages_bytes;
  /* Why the paged view may not serve (selfpaged.c); "" once it passed. */
  char paged_why[160];
  /* Why sinks are off (selfrun.c: their cases failed, or the self-check
   * did not run); "": they are served. */
  char sinks_why[160];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  attn_job *pend_head, *pend_tail;
  int busy;
  bool stop, quit; /* stop: drain and end the dispatcher; quit: end the slot threads */
  pthread_t thread;
  /* Kernels the self-check disabled (attn_cu_select_masked's bits) on any
   * device, and why; set before the dispatcher starts, read-only after. */
  unsigned off;
  char off_why[ATTN_CU_KERNEL_COUNT + 3][160];
  /* attn_config.cuda_bwd_atomic_dq: backward jobs may take the atomic path. */
  bool bwd_atomic_dq;
  unsigned hopper_failed;    /* Hopper instances a self-check case failed */
  int next_dev;              /* round-robin start */
  struct timespec next_poll; /* CLOCK_MONOTONIC: when busy streams are next polled */
};

/* The tensors a job stages in and copies out, in layout order. */
typedef struct cu_tensor {
  const char *name;
  const void *in; /* an input's data */
  void *out;      /* an output's buffer */
  const int64_t *stride;
  bool kv; /* shaped like K (heads_kv, seq_kv), else like Q */
} cu_tensor;

/* ---- stage.c: layout, groups and packing, no CUDA call -------------------- */

/* The tensors a job stages in (q k v, and o do backward); returns how many. */
int attn__cu_inputs(const attn_request *r, cu_tensor t[5]);
/* Bytes of one packed tensor of the slot's job. */
size_t attn__cu_packed_bytes(const cu_slot *sl, bool kv, size_t es);
/* The kernels, their tiles, the groups and the job's layout, for a device
 * with sms multiprocessors and the kernels off turned off; no device call. */
int attn__cu_plan(cu_slot *sl, const attn_request *r, int sms, unsigned off, attn_status *st);
/* What a job's selection skips: what the self-check disabled, and the
 * atomic dQ path unless the configuration asks for it. */
static inline unsigned attn__cu_job_off(const cu_state *s) {
  return s->off | (s->bwd_atomic_dq ? 0u : ATTN_CU_ATOMIC_DQ_BIT);
}
/* Which tensors move without a host copy: contiguous ones that lie in the
 * pinned pool (pp; NULL: none). Sets direct_*. */
void attn__cu_route(cu_slot *sl, const attn_request *r, cu_pinned *pp);
/* The staging's copy of device offset off (off_misc or past it). */
static inline unsigned char *attn__cu_staged(const cu_slot *sl, size_t off) {
  return sl->pinned + (off - sl->off_misc);
}
/* Bytes of pinned staging the routed job needs from off_misc. */
size_t attn__cu_staging_bytes(const cu_slot *sl);
/* The small inputs (a caller's lse, ALiBi slopes, sinks) and the scan results'
 * start values, into the pinned staging. */
void attn__cu_stage_misc(cu_slot *sl, const attn_request *r);
/* Packed rows [row0, row0 + n) of input t ([B, H, N, dp], zero padded). */
void attn__cu_pack_rows(unsigned char *dst, const attn_request *r, int t, int64_t row0, int64_t n,
                        int dp);
/* Rows of input or output tensor (kv: K-shaped) of group g: first, count. */
int64_t attn__cu_group_rows(const cu_slot *sl, int g, bool kv, int64_t *row0);
/* The kernels' device pointers into the job's allocation dm, per group. */
void attn__cu_set_pointers(cu_slot *sl, const attn_request *r, unsigned char *dm);
/* The scan's verdict on the job's inputs (check.h's wording). */
int attn__cu_check_scan(cu_slot *sl, const attn_request *r, attn_status *st);
/* The outputs not downloaded in place, copied out of the staging. */
void attn__cu_unpack_outputs(cu_slot *sl, const attn_request *r);

/* ---- copy.c: the moves between host and device ------------------------------- */

/* Queues group g's inputs on the upload stream: straight from the caller
 * (direct), else packed through the pinned chunks. */
cudaError_t attn__cu_upload_group(cu_slot *sl, const attn_request *r, int g, const char **what);
/* Queues group g's outputs on the download stream: in place (direct), else
 * into the staging. */
cudaError_t attn__cu_download_group(cu_slot *sl, const attn_request *r, int g);

/* ---- pages.c: a session store's pages on a device ------------------------- */

int attn__cu_pages_open(cu_state *s, uint64_t bytes, void **base, attn_status *st);
void attn__cu_pages_close(cu_state *s, void *base);
int attn__cu_pages_copy(cu_state *s, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows, attn_status *st);
/* Whether a paged request's pages are this backend's, in rows it reads. */
int attn__cu_pages_check(const cu_state *s, const attn_request *r, attn_status *st);
/* The request's page tables as page numbers of the pool. */
void attn__cu_page_tables(const cu_state *s, const attn_request *r, int32_t *kt, int32_t *vt);

/* ---- pinned.c: page-locked host memory lent to callers -------------------- */

void attn__cu_pinned_init(cu_pinned *pp, uint64_t cap);
void attn__cu_pinned_close(cu_pinned *pp);
void *attn__cu_pinned_get(cu_pinned *pp, size_t n);
bool attn__cu_pinned_put(cu_pinned *pp, void *p);
/* Whether [p, p + n) lies in a block lent now. */
bool attn__cu_pinned_holds(cu_pinned *pp, const void *p, size_t n);
void attn__cu_pinned_stats(cu_pinned *pp, attn_host_stats *out);

/* ---- stream.c: a job on a slot's stream ------------------------------------- */

/* Grows the slot's pinned buffer to need bytes. */
int attn__cu_grow_pinned(cu_slot *sl, size_t need, attn_status *st);
/* Queues, group by group, upload, scans, kernels and download, then the
 * free and (when host_fn) the host function; on an error *what names the
 * step. */
cudaError_t attn__cu_queue_work(cu_slot *sl, const attn_request *r, bool host_fn,
                                const char **what);
/* Waits for all three of the slot's streams; the first error. */
cudaError_t attn__cu_sync_slot(cu_slot *sl);
/* Device memory for the job: 0, ATTN_ENOMEM (retryable), or -1 for another
 * CUDA error, which *pe holds. */
int attn__cu_alloc(cu_slot *sl, cudaError_t *pe, attn_status *st);
/* Stages and queues the slot's job (a slot thread); on failure nothing
 * queued still uses the slot's memory, and st says why. */
int attn__cu_start(cu_slot *sl, attn_status *st);
/* The job's outcome once its stream has run: the scan's verdict, then the
 * outputs. */
int attn__cu_finish(cu_slot *sl, attn_status *st);

/* ---- dispatch.c: the dispatcher thread and the slots' threads --------------- */

bool attn__cu_any_healthy(cu_state *s);
/* Queues a job for the dispatcher (any thread). */
void attn__cu_enqueue(cu_state *s, attn_job *job);
/* Starts the dispatcher once the devices are open; stops it when every
 * queued and running job has completed. */
int attn__cu_dispatch_start(cu_state *s, attn_status *st);
void attn__cu_dispatch_stop(cu_state *s);

/* ---- device.c: a device opened and closed, and its health ------------------- */

int attn__cu_open_dev(cu_state *s, cu_dev *d, int ordinal, attn_status *st);
void attn__cu_close_dev(cu_dev *d);
/* st from a CUDA error: "cuda: what: message (name)"; returns code. */
int attn__cu_fail(attn_status *st, int code, const char *what, cudaError_t e);
/* Whether an error leaves the context unusable. */
bool attn__cu_sticky(cudaError_t e);
/* A sticky device error: the device takes no more jobs. */
void attn__cu_mark_unhealthy(cu_dev *d, const char *what, cudaError_t e);

/* ---- selfrun.c: the start-up self-check on a device -------------------------- */

/* The Hopper instances start off, each with why; true when they may be
 * tried (their code is built, the self-check runs, every device is 9.0). */
bool attn__cu_hopper_gate(cu_state *s, bool checking);
/* The decode kernel (compile-verified only) off, with why: for a backend
 * whose self-check does not run. */
void attn__cu_decode_off(cu_state *s);
/* Runs every self-check case on the device, turning off what fails. */
void attn__cu_self_check(cu_state *s, cu_dev *d, bool hopper);
/* Runs the sinks cases on the device; the first failure sets sinks_why. */
void attn__cu_self_check_sinks(cu_state *s, cu_dev *d);
/* Runs a self-check case on the slot's device and waits for it: 0, the
 * selection's refusal, or ATTN_EDEVICE with *sticky saying whether the
 * device is done. */
int attn__cu_run_case(cu_slot *sl, const attn_request *r, unsigned off, bool *sticky,
                      attn_status *st);

/* ---- selfpaged.c: the paged view's self-check ------------------------------- */

/* The forward cases run paged on d; the first failure sets paged_why. */
void attn__cu_self_check_paged(cu_state *s, cu_dev *d);

#endif
