/*
 * cuda_int.h — the cuda backend's internals, shared by its files.
 *
 * Internal to engine/cuda/. The backend (cuda.c, its ops) holds one
 * cu_state: up to ATTN_MAX_CUDA_DEVICES devices (device.c), each with
 * --streams slots; a slot is a stream, a pinned staging buffer and at most
 * one job, laid out and packed by stage.c, run on its stream by stream.c,
 * and handed out by the one dispatcher thread (dispatch.c).
 */
#ifndef ATTN_CUDA_INT_H
#define ATTN_CUDA_INT_H

#include "backend.h"
#include "kernels.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

struct cu_dev;

typedef struct cu_slot {
  struct cu_dev *dev;
  cudaStream_t stream;
  unsigned char *pinned;
  size_t pinned_cap;
  attn_job *job; /* NULL when free */
  /* The job's layout in pinned and device memory: the inputs (q k v, and o
   * do for a backward pass; then a caller's lse), the scan results, the
   * outputs (o m l lse, or dq dk dv); the upload covers [0, up_end), the
   * download [down_start, down_end); device memory also holds scratch after
   * that (split-KV partials, or a recomputed lse and the backward's D). */
  int nin, nout;
  size_t off[5], off_scan, off_out[3], off_stats[3], off_lse, off_ws;
  size_t off_alibi; /* the slopes in log2 units, F32 [B, Hq]; SIZE_MAX: none */
  size_t up_end, down_start, down_end, dev_bytes;
  void *dmem;
  attn_cu_params prm;
  attn_cu_choice ch;
  attn_cu_choice fch; /* backward without lse: the forward that computes it */
  struct cu_slot *next_done;
} cu_slot;

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
  pthread_mutex_t mu;
  pthread_cond_t cv;
  attn_job *pend_head, *pend_tail;
  cu_slot *done;
  int busy;
  bool stop;
  pthread_t thread;
  /* Kernels the self-check disabled (attn_cu_select_masked's bits) on any
   * device, and why; set before the dispatcher starts, read-only after. */
  unsigned off;
  char off_why[ATTN_CU_KERNEL_COUNT + 2][160];
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

/* ---- stage.c: layout and packing, no CUDA call ---------------------------- */

/* The tensors a job stages in (q k v, and o do backward); returns how many. */
int attn__cu_inputs(const attn_request *r, cu_tensor t[5]);
/* Bytes of one packed tensor of the slot's job. */
size_t attn__cu_packed_bytes(const cu_slot *sl, bool kv, size_t es);
/* The kernels, their tiles and the job's layout, for a device with sms
 * multiprocessors and the kernels off turned off; no device call. */
int attn__cu_plan(cu_slot *sl, const attn_request *r, int sms, unsigned off, attn_status *st);
/* Packs the job's inputs (and a caller's lse) into the pinned buffer and
 * resets the scan results. */
void attn__cu_stage(cu_slot *sl, const attn_request *r);
/* The kernels' device pointers into the job's allocation dm. */
void attn__cu_set_pointers(cu_slot *sl, const attn_request *r, unsigned char *dm);
/* The scan's verdict on the job's inputs (check.h's wording). */
int attn__cu_check_scan(cu_slot *sl, const attn_request *r, attn_status *st);
/* The job's outputs, copied out of the staging buffer. */
void attn__cu_unpack_outputs(cu_slot *sl, const attn_request *r);

/* ---- stream.c: a job on a slot's stream ------------------------------------- */

/* st from a CUDA error: "cuda: what: message (name)"; returns code. */
int attn__cu_fail(attn_status *st, int code, const char *what, cudaError_t e);
/* Whether an error leaves the context unusable. */
bool attn__cu_sticky(cudaError_t e);
/* A sticky device error: the device takes no more jobs. */
void attn__cu_mark_unhealthy(cu_dev *d, const char *what, cudaError_t e);
/* Grows the slot's pinned buffer to need bytes. */
int attn__cu_grow_pinned(cu_slot *sl, size_t need, attn_status *st);
/* Queues upload, scans, kernels, download, free and (when host_fn) the
 * host function; on an error *what names the step. */
cudaError_t attn__cu_queue_work(cu_slot *sl, const attn_request *r, bool host_fn,
                                const char **what);
/* Device memory for the job: 0, ATTN_ENOMEM (retryable), or -1 for another
 * CUDA error, which *pe holds. */
int attn__cu_alloc(cu_slot *sl, cudaError_t *pe, attn_status *st);
/* Stages and queues the slot's job; on failure nothing queued still uses
 * the slot's memory, and st says why. */
int attn__cu_start(cu_slot *sl, attn_status *st);
/* The job's outcome once its stream has run: the scan's verdict, then the
 * outputs. */
int attn__cu_finish(cu_slot *sl, attn_status *st);

/* ---- dispatch.c: the dispatcher thread -------------------------------------- */

bool attn__cu_any_healthy(cu_state *s);
/* Queues a job for the dispatcher (any thread). */
void attn__cu_enqueue(cu_state *s, attn_job *job);
/* Starts the dispatcher once the devices are open; stops it when every
 * queued and running job has completed. */
int attn__cu_dispatch_start(cu_state *s, attn_status *st);
void attn__cu_dispatch_stop(cu_state *s);

/* ---- device.c: a device opened, checked and closed ---------------------------- */

int attn__cu_open_dev(cu_state *s, cu_dev *d, int ordinal, attn_status *st);
void attn__cu_close_dev(cu_dev *d);
/* The Hopper instances start off, each with why; true when they may be
 * tried (their code is built, the self-check runs, every device is 9.0). */
bool attn__cu_hopper_gate(cu_state *s, bool checking);
/* Runs every self-check case on the device, turning off what fails. */
void attn__cu_self_check(cu_state *s, cu_dev *d, bool hopper);

#endif
