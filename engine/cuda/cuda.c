/*
 * cuda.c — the "cuda" backend: FlashAttention kernels on a pool of streams.
 *
 * Each device gets --streams slots; a slot is a stream, a pinned host
 * staging buffer that grows to the largest job it has run, and at most one
 * job at a time. One dispatcher thread per engine does all the host work:
 * it takes a queued job when a slot is free, packs Q, K and V into the
 * slot's pinned buffer (gathering strides, padding the head dim to a
 * multiple of 8), and queues on the slot's stream: a device allocation from
 * the device's memory pool, the upload, the input scan, the forward kernel
 * (and the split-KV merge), the download, the free, and a host function.
 * The host function runs on a CUDA thread and may make no CUDA call: it only
 * puts the slot on the done list and wakes the dispatcher, which checks the
 * scan, unpacks O and the statistics into the caller's buffers and
 * completes the job.
 *
 * A backward job stages Q, K, V, O and dO (and the caller's lse when it
 * has one), scans all five, runs the forward with statistics first when it
 * must recompute lse (its O goes to dQ's buffer, which the backward
 * overwrites), then the backward kernels, and downloads dQ, dK and dV.
 *
 * Staging through a reusable pinned buffer keeps the backend independent of
 * how callers allocate (the server's request bodies are ordinary memory) and
 * costs one host copy each way; pinning request bodies instead would save
 * that copy at the price of pinning every body. Only the staging variant is
 * built; the two were not measured against each other.
 *
 * When a device is opened, a self-check (selfcheck.h) runs every kernel
 * instance the selection can choose on small awkward shapes against the
 * float64 reference, through the same staging and launch path as a job;
 * an instance that fails is disabled (attn_cu_select_masked skips it, so a
 * request falls back to another instance or, refused, to the CPU) and
 * attn_engine_backends() lists it with why. attn_config's
 * cuda_self_check_off skips it.
 *
 * A canceled job (attn_request.cancel) is checked before it is staged,
 * after packing (before anything is queued on the stream) and before its
 * outputs are unpacked; work already queued on a stream runs to its end.
 *
 * Errors never abort. An allocation that does not fit is ENOMEM (the server
 * answers 503: retry later). A launch the runtime refuses (or the kernels'
 * contract check, attn_cu_launch_ok) fails its job with EDEVICE alone. Any
 * other CUDA error fails the job with EDEVICE and marks the device
 * unhealthy: its context may be corrupt, so it takes no more jobs, and when no device is left the
 * backend reports itself unhealthy (the server's /readyz turns 503). A host function does not run
 * after a fault in its context, so the dispatcher also polls busy streams
 * once a second (by the monotonic clock, however often it is woken) and
 * fails the jobs of a stream that reports an error.
 */
#define _GNU_SOURCE
#include "backend.h"
#include "check.h"
#include "kernels.h"
#include "selfcheck.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_STREAMS 4
/* How often busy streams are polled for faults. */
#define POLL_SECONDS 1
/* Regions of a job's buffers start on this boundary. */
#define ALIGN 256

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

static size_t align_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int cuda_fail(attn_status *st, int code, const char *what, cudaError_t e) {
  return attn_status_set(st, code, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

/* ---- shapes ---------------------------------------------------------------- */

/* The tensors a job stages in and copies out, in layout order. */
typedef struct cu_tensor {
  const char *name;
  const void *in; /* an input's data */
  void *out;      /* an output's buffer */
  const int64_t *stride;
  bool kv; /* shaped like K (heads_kv, seq_kv), else like Q */
} cu_tensor;

static int job_inputs(const attn_request *r, cu_tensor t[5]) {
  t[0] = (cu_tensor){"q", r->q, NULL, r->q_stride, false};
  t[1] = (cu_tensor){"k", r->k, NULL, r->k_stride, true};
  t[2] = (cu_tensor){"v", r->v, NULL, r->v_stride, true};
  if (r->pass != ATTN_BACKWARD)
    return 3;
  t[3] = (cu_tensor){"o", r->o, NULL, r->o_stride, false};
  t[4] = (cu_tensor){"do", r->dout, NULL, r->do_stride, false};
  return 5;
}

static int job_outputs(const attn_request *r, cu_tensor t[3]) {
  if (r->pass != ATTN_BACKWARD) {
    t[0] = (cu_tensor){"o", NULL, r->o, r->o_stride, false};
    return 1;
  }
  t[0] = (cu_tensor){"dq", NULL, r->dq, r->dq_stride, false};
  t[1] = (cu_tensor){"dk", NULL, r->dk, r->dk_stride, true};
  t[2] = (cu_tensor){"dv", NULL, r->dv, r->dv_stride, true};
  return 3;
}

/* The kernels' view of a request (device pointers filled in later). The
 * request may carry counts up to 2^40: they are checked against the grid
 * before they are narrowed to int, or a count of 2^32 + 1 would become 1
 * and the staging buffer would be sized for it. */
static int shape_of(const attn_request *r, attn_cu_params *p, attn_status *st) {
  memset(p, 0, sizeof *p);
  if (r->batch > ATTN_CU_MAX_GRID_YZ || r->heads_q > ATTN_CU_MAX_GRID_YZ)
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "the cuda backend takes at most %d query heads and %d batch entries "
                           "(got %lld and %lld)",
                           ATTN_CU_MAX_GRID_YZ, ATTN_CU_MAX_GRID_YZ, (long long)r->heads_q,
                           (long long)r->batch);
  p->pass = r->pass;
  p->dtype = r->dtype;
  p->batch = (int)r->batch;
  p->heads_q = (int)r->heads_q;
  p->heads_kv = (int)r->heads_kv; /* divides heads_q: no larger */
  /* Past the maximum, one more than it: attn_cu_select refuses it. */
  p->seq_q = (int)(r->seq_q <= ATTN_CU_MAX_SEQ ? r->seq_q : ATTN_CU_MAX_SEQ + 1);
  p->seq_kv = (int)(r->seq_kv <= ATTN_CU_MAX_SEQ ? r->seq_kv : ATTN_CU_MAX_SEQ + 1);
  p->head_dim = (int)r->head_dim;
  p->dp = attn_cu_dp(r->head_dim);
  p->scale_log2 = (float)(attn_request_scale(r) * M_LOG2E);
  p->scale = (float)attn_request_scale(r);
  attn_request_window(r, &p->window_left, &p->window_right);
  p->off = attn_request_offset(r);
  /* softcap and ALiBi in log2 units, as the kernels keep scores */
  p->cap2 = (float)(r->softcap * M_LOG2E);
  p->inv_cap2 = r->softcap > 0 ? (float)(1.0 / (r->softcap * M_LOG2E)) : 0.0f;
  return 0;
}

/* Bytes of one packed tensor of the job. */
static size_t packed_bytes(const cu_slot *sl, bool kv, size_t es) {
  const attn_cu_params *p = &sl->prm;
  size_t rows = (size_t)p->batch * (kv ? p->heads_kv : p->heads_q) * (kv ? p->seq_kv : p->seq_q);
  return rows * (size_t)p->dp * es;
}

/* Byte layout of a job in a slot; returns false on size overflow. */
static bool layout(cu_slot *sl, const attn_request *r) {
  const attn_cu_params *p = &sl->prm;
  const bool bwd = r->pass == ATTN_BACKWARD;
  size_t es = attn_dtype_size(r->dtype);
  size_t nq = (size_t)p->batch * p->heads_q * p->seq_q;
  size_t nkv = (size_t)p->batch * p->heads_kv * p->seq_kv;
  if (nq > SIZE_MAX / 16 / ((size_t)p->dp * es) || nkv > SIZE_MAX / 16 / ((size_t)p->dp * es))
    return false;
  cu_tensor in[5], out[3];
  sl->nin = job_inputs(r, in);
  sl->nout = job_outputs(r, out);
  size_t x = 0, lse_bytes = align_up(nq * sizeof(float));
  for (int i = 0; i < sl->nin; i++) {
    sl->off[i] = x;
    x = align_up(x + packed_bytes(sl, in[i].kv, es));
  }
  sl->off_lse = bwd && r->lse_in ? x : SIZE_MAX;
  x += bwd && r->lse_in ? lse_bytes : 0;
  sl->off_alibi = r->alibi_slopes ? x : SIZE_MAX;
  x += r->alibi_slopes ? align_up((size_t)p->batch * p->heads_q * sizeof(float)) : 0;
  sl->off_scan = x;
  x = align_up(x + (size_t)sl->nin * sizeof(attn_cu_scan_result));
  sl->up_end = x;
  sl->down_start = sl->off_scan;
  for (int i = 0; i < sl->nout; i++) {
    sl->off_out[i] = x;
    x = align_up(x + packed_bytes(sl, out[i].kv, es));
  }
  float *const want[3] = {r->m, r->l, r->lse};
  for (int i = 0; i < 3; i++) {
    sl->off_stats[i] = want[i] ? x : SIZE_MAX;
    if (want[i])
      x = align_up(x + nq * sizeof(float));
  }
  sl->down_end = x;
  if (bwd && !r->lse_in) {
    sl->off_lse = x;
    x += lse_bytes;
  }
  sl->off_ws = x;
  x += align_up(attn_cu_bwd_bytes(p));
  sl->dev_bytes = x + align_up(attn_cu_split_bytes(p, &sl->ch));
  return true;
}

/* The kernels, their tiles and the job's layout, for a device with sms
 * multiprocessors; no device call. */
static int plan_job(cu_slot *sl, const attn_request *r, int sms, unsigned off, attn_status *st) {
  if (r->softcap > 0 || r->alibi_slopes) /* the Hopper instance has no variant path */
    off |= ATTN_CU_HOPPER_OFF;
  int rc = shape_of(r, &sl->prm, st);
  if (rc < 0 || (rc = attn_cu_select_masked(&sl->prm, sms, off, &sl->ch, st)) < 0)
    return rc;
  if (r->pass == ATTN_BACKWARD && !r->lse_in) {
    /* The forward that recomputes lse runs unsplit: it needs no scratch. */
    attn_cu_params fp = sl->prm;
    fp.pass = ATTN_FORWARD;
    if ((rc = attn_cu_select_masked(&fp, 0, off, &sl->fch, st)) < 0)
      return rc;
  }
  if (!layout(sl, r))
    return attn_status_set(st, ATTN_EOVERFLOW, "cuda: the request's buffers overflow size_t");
  return 0;
}

/* ---- packing ---------------------------------------------------------------- */

/* Tensor (dtype elements, strides s) -> packed [B, H, N, dp], zero padded. */
static void pack(unsigned char *dst, const void *src, const int64_t s[3], int64_t B, int64_t H,
                 int64_t N, int64_t D, int dp, size_t es) {
  const unsigned char *sp = src;
  if (dp == D && s[2] == D && s[1] == N * D && s[0] == H * N * D) {
    memcpy(dst, sp, (size_t)(B * H * N * D) * es);
    return;
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < N; n++) {
        memcpy(dst, sp + (size_t)(b * s[0] + h * s[1] + n * s[2]) * es, (size_t)D * es);
        memset(dst + (size_t)D * es, 0, (size_t)(dp - D) * es);
        dst += (size_t)dp * es;
      }
}

/* Packed [B, H, N, dp] -> tensor with strides s, padding dropped. */
static void unpack(void *dst, const unsigned char *src, const int64_t s[3], int64_t B, int64_t H,
                   int64_t N, int64_t D, int dp, size_t es) {
  unsigned char *dp8 = dst;
  if (dp == D && s[2] == D && s[1] == N * D && s[0] == H * N * D) {
    memcpy(dp8, src, (size_t)(B * H * N * D) * es);
    return;
  }
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t n = 0; n < N; n++) {
        memcpy(dp8 + (size_t)(b * s[0] + h * s[1] + n * s[2]) * es, src, (size_t)D * es);
        src += (size_t)dp * es;
      }
}

/* ---- the host function: no CUDA calls here ----------------------------------- */

static void CUDART_CB on_stream_done(void *arg) {
  cu_slot *sl = arg;
  cu_state *s = sl->dev->state;
  pthread_mutex_lock(&s->mu);
  sl->next_done = s->done;
  s->done = sl;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- the dispatcher's work ---------------------------------------------------- */

/* Whether an error leaves the context unusable (a fault in a kernel, or
 * one CUDA cannot attribute). A launch the runtime refuses (a broken
 * contract, a bad configuration, no machine code for this device, too few
 * registers) leaves it usable: only its job fails. */
static bool cuda_sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorInvalidValue:
  case cudaErrorInvalidConfiguration:
  case cudaErrorLaunchOutOfResources:
  case cudaErrorInvalidDeviceFunction:
  case cudaErrorNoKernelImageForDevice:
  case cudaErrorNotSupported: return false;
  default: return true;
  }
}

/* A sticky device error: the device is done. */
static void mark_unhealthy(cu_dev *d, const char *what, cudaError_t e) {
  if (d->healthy)
    fprintf(stderr, "attn: cuda device %d (%s) failed in %s: %s; it takes no more jobs\n",
            d->ordinal, d->name, what, cudaGetErrorString(e));
  d->healthy = false;
  snprintf(d->why, sizeof d->why, "failed in %s: %s", what, cudaGetErrorString(e));
}

static int grow_pinned(cu_slot *sl, size_t need, attn_status *st) {
  if (sl->pinned_cap >= need)
    return 0;
  if (sl->pinned)
    cudaFreeHost(sl->pinned);
  sl->pinned = NULL;
  sl->pinned_cap = 0;
  size_t cap = need + need / 4;
  cudaError_t e = cudaHostAlloc((void **)&sl->pinned, cap, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return attn_status_set(st, ATTN_ENOMEM,
                           "cuda: cannot pin %zu MiB of host memory for staging: %s", cap >> 20,
                           cudaGetErrorString(e));
  }
  sl->pinned_cap = cap;
  return 0;
}

/* Packs the job's inputs (and a caller's lse) into the pinned buffer and
 * resets the scan results. */
static void stage(cu_slot *sl, const attn_request *r) {
  size_t es = attn_dtype_size(r->dtype);
  cu_tensor in[5];
  job_inputs(r, in);
  for (int t = 0; t < sl->nin; t++)
    pack(sl->pinned + sl->off[t], in[t].in, in[t].stride, r->batch,
         in[t].kv ? r->heads_kv : r->heads_q, in[t].kv ? r->seq_kv : r->seq_q, r->head_dim,
         sl->prm.dp, es);
  if (r->pass == ATTN_BACKWARD && r->lse_in)
    memcpy(sl->pinned + sl->off_lse, r->lse_in,
           (size_t)(r->batch * r->heads_q * r->seq_q) * sizeof(float));
  if (r->alibi_slopes) { /* expanded to [B, Hq]: the kernels index b·Hq + h */
    float *a2 = (float *)(sl->pinned + sl->off_alibi);
    for (int64_t b = 0; b < r->batch; b++)
      for (int64_t h = 0; h < r->heads_q; h++)
        a2[b * r->heads_q + h] = (float)(-attn_request_alibi_slope(r, b, h) * M_LOG2E);
  }
  attn_cu_scan_result *scan = (attn_cu_scan_result *)(sl->pinned + sl->off_scan);
  for (int t = 0; t < sl->nin; t++)
    scan[t] = (attn_cu_scan_result){.first_bad = ~0ull, .maxabs_bits = 0, .pad_ = 0};
}

/* The kernels' device pointers into the job's allocation dm. */
static void set_pointers(cu_slot *sl, const attn_request *r, unsigned char *dm) {
  attn_cu_params *p = &sl->prm;
  p->q = dm + sl->off[0];
  p->k = dm + sl->off[1];
  p->v = dm + sl->off[2];
  p->alibi2 = r->alibi_slopes ? (const float *)(dm + sl->off_alibi) : NULL;
  if (r->pass == ATTN_BACKWARD) {
    p->o = dm + sl->off[3];
    p->dout = dm + sl->off[4];
    p->dq = dm + sl->off_out[0];
    p->dk = dm + sl->off_out[1];
    p->dv = dm + sl->off_out[2];
    p->lse = (float *)(dm + sl->off_lse);
    p->bwd_ws = (float *)(dm + sl->off_ws);
    return;
  }
  p->o = dm + sl->off_out[0];
  p->m = r->m ? (float *)(dm + sl->off_stats[0]) : NULL;
  p->l = r->l ? (float *)(dm + sl->off_stats[1]) : NULL;
  p->lse = r->lse ? (float *)(dm + sl->off_stats[2]) : NULL;
  p->split_ws = sl->ch.nsplit > 1 ? dm + sl->down_end : NULL;
}

/* A backward job without the caller's lse: the forward with statistics
 * writes it, and its O goes to dQ's buffer (overwritten later). */
static cudaError_t launch_lse(cu_slot *sl) {
  attn_cu_params fp = sl->prm;
  fp.pass = ATTN_FORWARD;
  fp.o = fp.dq;
  fp.m = fp.l = NULL;
  fp.split_ws = NULL;
  return (cudaError_t)attn_cu_launch(&fp, &sl->fch, sl->stream);
}

/* Queues upload, scans, kernels, download, free and (when host_fn) the
 * host function; on an error *what names the step. */
static cudaError_t queue_work(cu_slot *sl, const attn_request *r, bool host_fn, const char **what) {
  unsigned char *dm = sl->dmem;
  attn_cu_scan_result *dscan = (attn_cu_scan_result *)(dm + sl->off_scan);
  cu_tensor in[5];
  cudaError_t e;
  job_inputs(r, in);
  *what = "the upload";
  if ((e = cudaMemcpyAsync(dm, sl->pinned, sl->up_end, cudaMemcpyHostToDevice, sl->stream)))
    return e;
  *what = "the input scan";
  for (int t = 0; t < sl->nin; t++) {
    size_t n = packed_bytes(sl, in[t].kv, 1);
    if ((e = (cudaError_t)attn_cu_scan(dm + sl->off[t], r->dtype, n, &dscan[t], sl->stream)))
      return e;
  }
  *what = "the forward pass that recomputes lse";
  if (r->pass == ATTN_BACKWARD && !r->lse_in && (e = launch_lse(sl)))
    return e;
  *what = "the attention kernel";
  if ((e = (cudaError_t)attn_cu_launch(&sl->prm, &sl->ch, sl->stream)))
    return e;
  *what = "the download";
  if ((e = cudaMemcpyAsync(sl->pinned + sl->down_start, dm + sl->down_start,
                           sl->down_end - sl->down_start, cudaMemcpyDeviceToHost, sl->stream)))
    return e;
  *what = "cudaFreeAsync";
  if ((e = cudaFreeAsync(sl->dmem, sl->stream)))
    return e;
  sl->dmem = NULL;
  *what = "cudaLaunchHostFunc";
  return host_fn ? cudaLaunchHostFunc(sl->stream, on_stream_done, sl) : cudaSuccess;
}

/* Device memory for the job from the device's pool: 0, ATTN_ENOMEM
 * (retryable) when it does not fit, or -1 for another CUDA error, which
 * *pe holds. */
static int alloc_job(cu_slot *sl, cudaError_t *pe, attn_status *st) {
  cu_dev *d = sl->dev;
  sl->dmem = NULL;
  cudaError_t e = cudaMallocFromPoolAsync(&sl->dmem, sl->dev_bytes, d->pool, sl->stream);
  *pe = e;
  if (e != cudaErrorMemoryAllocation)
    return e == cudaSuccess ? 0 : -1;
  cudaGetLastError();
  size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  sl->dmem = NULL;
  return attn_status_set(st, ATTN_ENOMEM,
                         "cuda: device %d is out of memory for this request (needs %zu MiB, "
                         "%zu MiB free of %zu); retry later or send a smaller request",
                         d->ordinal, sl->dev_bytes >> 20, fr >> 20, tot >> 20);
}

/* Queues the job on the slot's stream; on failure nothing is left queued
 * that still uses the slot's memory, and st says why. */
static int start(cu_slot *sl, attn_status *st) {
  cu_dev *d = sl->dev;
  const attn_request *r = &sl->job->req;
  cudaError_t e;
  const char *what = "cudaSetDevice";
  int rc;
  /* A job canceled while it waited for a slot is never staged. */
  if (attn__job_canceled(sl->job))
    return attn__canceled(st);
  if ((e = cudaSetDevice(d->ordinal)) != cudaSuccess)
    goto device_error;
  if ((rc = plan_job(sl, r, d->sms, d->state->off, st)) < 0 || (rc = attn__check_lse(r, st)) < 0 ||
      (rc = grow_pinned(sl, sl->down_end, st)) < 0)
    return rc;
  stage(sl, r);
  /* Packing is the host's long step: one canceled meanwhile launches nothing. */
  if (attn__job_canceled(sl->job))
    return attn__canceled(st);
  what = "cudaMallocFromPoolAsync";
  if ((rc = alloc_job(sl, &e, st)) != 0) {
    if (rc < -1)
      return rc;
    goto device_error;
  }
  set_pointers(sl, r, sl->dmem);
  if ((e = queue_work(sl, r, true, &what)) == cudaSuccess)
    return 0;
  /* Work already queued may still read the staging buffer: wait it out.
   * A refused launch fails its job alone, unless the wait shows the
   * context broken after all. */
  cudaGetLastError();
  cudaError_t se = cudaStreamSynchronize(sl->stream);
  if (sl->dmem)
    cudaFree(sl->dmem);
  sl->dmem = NULL;
  if (se != cudaSuccess && !cuda_sticky(e))
    e = se, what = "the stream after a refused launch";
device_error:
  cudaGetLastError();
  if (cuda_sticky(e))
    mark_unhealthy(d, what, e);
  return cuda_fail(st, ATTN_EDEVICE, what, e);
}

/* The scan's verdict on the job's inputs: ENONFINITE with the element's
 * coordinates, or ERANGE from the largest magnitudes of q, k and v. */
static int check_scan(cu_slot *sl, const attn_request *r, attn_status *st) {
  const attn_cu_scan_result *scan = (const attn_cu_scan_result *)(sl->pinned + sl->off_scan);
  const unsigned dp = (unsigned)sl->prm.dp;
  cu_tensor in[5];
  job_inputs(r, in);
  double mx[3];
  for (int t = 0; t < sl->nin; t++) {
    if (scan[t].first_bad != ~0ull) {
      int64_t H = in[t].kv ? r->heads_kv : r->heads_q, N = in[t].kv ? r->seq_kv : r->seq_q;
      int64_t row = (int64_t)(scan[t].first_bad / dp), dcol = (int64_t)(scan[t].first_bad % dp);
      return attn__nonfinite(st, in[t].name, row / (H * N), row / N % H, row % N, dcol);
    }
    float f;
    memcpy(&f, &scan[t].maxabs_bits, sizeof f);
    if (t < 3)
      mx[t] = f;
  }
  return attn__check_magnitudes(r, mx, st);
}

/* The job's outputs, copied out of the staging buffer. */
static void unpack_outputs(cu_slot *sl, const attn_request *r) {
  cu_tensor out[3];
  int nout = job_outputs(r, out);
  for (int t = 0; t < nout; t++)
    unpack(out[t].out, sl->pinned + sl->off_out[t], out[t].stride, r->batch,
           out[t].kv ? r->heads_kv : r->heads_q, out[t].kv ? r->seq_kv : r->seq_q, r->head_dim,
           sl->prm.dp, attn_dtype_size(r->dtype));
  float *const stats[3] = {r->m, r->l, r->lse};
  size_t rows = (size_t)r->batch * r->heads_q * r->seq_q;
  for (int i = 0; i < 3; i++)
    if (stats[i])
      memcpy(stats[i], sl->pinned + sl->off_stats[i], rows * sizeof(float));
}

/* The job's outcome once its stream has run: the scan's verdict, then the
 * outputs. */
static int finish(cu_slot *sl, attn_status *st) {
  const attn_request *r = &sl->job->req;
  if (attn__job_canceled(sl->job)) /* nobody wants the outputs: skip the copy */
    return attn__canceled(st);
  int rc = check_scan(sl, r, st);
  if (rc < 0)
    return rc;
  unpack_outputs(sl, r);
  return 0;
}

static void release(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  sl->job = NULL;
  sl->dev->busy--;
  s->busy--;
  pthread_mutex_unlock(&s->mu);
}

/* A free slot on a healthy device, spreading jobs over devices; mu held. */
static cu_slot *free_slot(cu_state *s) {
  for (int k = 0; k < s->ndev; k++) {
    cu_dev *d = &s->devs[(s->next_dev + k) % s->ndev];
    if (!d->healthy || d->busy == d->nslots)
      continue;
    for (int i = 0; i < d->nslots; i++)
      if (!d->slots[i].job) {
        s->next_dev = (int)((d - s->devs) + 1) % s->ndev;
        return &d->slots[i];
      }
  }
  return NULL;
}

static bool any_healthy(cu_state *s) {
  for (int i = 0; i < s->ndev; i++)
    if (s->devs[i].healthy)
      return true;
  return false;
}

/* Whether the slot's host function has put it on the done list; mu held. */
static bool on_done_list(const cu_state *s, const cu_slot *sl) {
  for (const cu_slot *x = s->done; x; x = x->next_done)
    if (x == sl)
      return true;
  return false;
}

/* Fails the job of a busy stream that reports an error: its host function
 * will never run. The query runs without the mutex, and the host function
 * may run meanwhile (the context poisoned by another stream after this
 * one's work ended): the job is then on the done list, ends there, and is
 * not completed here a second time. */
static void poll_slot(cu_state *s, cu_slot *sl) {
  pthread_mutex_lock(&s->mu);
  attn_job *job = sl->job;
  bool skip = !job || on_done_list(s, sl);
  pthread_mutex_unlock(&s->mu);
  if (skip)
    return;
  cudaSetDevice(sl->dev->ordinal);
  cudaError_t e = cudaStreamQuery(sl->stream);
  if (e == cudaSuccess || e == cudaErrorNotReady)
    return;
  cudaGetLastError();
  mark_unhealthy(sl->dev, "a running job", e);
  pthread_mutex_lock(&s->mu);
  bool mine = sl->job == job && !on_done_list(s, sl);
  pthread_mutex_unlock(&s->mu);
  if (!mine)
    return;
  attn_status st;
  cuda_fail(&st, ATTN_EDEVICE, "the job's stream failed", e);
  release(s, sl);
  attn__job_complete(job, &st);
}

static void poll_faults(cu_state *s) {
  for (int i = 0; i < s->ndev; i++)
    for (int j = 0; j < s->devs[i].nslots; j++)
      poll_slot(s, &s->devs[i].slots[j]);
}

/* Now plus sec seconds on the monotonic clock (the condition variable's). */
static struct timespec deadline_in(int sec) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += sec;
  return ts;
}

static bool deadline_passed(const struct timespec *t) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

/* The done list's jobs: outcomes copied out, slots freed; mu not held. */
static void finish_done(cu_state *s, cu_slot *list) {
  while (list) {
    cu_slot *sl = list;
    list = sl->next_done;
    attn_job *job = sl->job;
    if (!job) /* already failed by the fault poll */
      continue;
    attn_status st = {0};
    int rc = finish(sl, &st);
    release(s, sl);
    attn__job_complete(job, rc < 0 ? &st : NULL);
  }
}

static void *dispatcher(void *arg) {
  cu_state *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (s->done) {
      cu_slot *list = s->done;
      s->done = NULL;
      pthread_mutex_unlock(&s->mu);
      finish_done(s, list);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (s->pend_head) {
      cu_slot *sl = free_slot(s);
      if (sl || !any_healthy(s)) {
        attn_job *job = s->pend_head;
        s->pend_head = job->next;
        if (!s->pend_head)
          s->pend_tail = NULL;
        if (sl) {
          sl->job = job;
          sl->dev->busy++;
          if (s->busy++ == 0)
            s->next_poll = deadline_in(POLL_SECONDS);
        }
        pthread_mutex_unlock(&s->mu);
        attn_status st = {0};
        if (!sl)
          attn_status_set(&st, ATTN_ENODEV, "cuda: no healthy device is left");
        else if (start(sl, &st) < 0)
          release(s, sl);
        if (st.code)
          attn__job_complete(job, &st);
        pthread_mutex_lock(&s->mu);
        continue;
      }
    }
    if (s->stop && !s->pend_head && s->busy == 0)
      break;
    if (s->busy > 0 && deadline_passed(&s->next_poll)) {
      /* By the clock, not by a timed-out wait: requests that keep waking
       * the thread must not keep a fault from being noticed. */
      pthread_mutex_unlock(&s->mu);
      poll_faults(s);
      pthread_mutex_lock(&s->mu);
      s->next_poll = deadline_in(POLL_SECONDS);
    } else if (s->busy > 0) {
      pthread_cond_timedwait(&s->cv, &s->mu, &s->next_poll);
    } else {
      pthread_cond_wait(&s->cv, &s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- the backend's ops ----------------------------------------------------------- */

static int cuda_submit(void *state, attn_job *job, attn_status *st) {
  (void)st;
  cu_state *s = state;
  job->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->pend_tail)
    s->pend_tail->next = job;
  else
    s->pend_head = job;
  s->pend_tail = job;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static int cuda_supports(void *state, const attn_request *r, attn_status *st) {
  cu_state *s = state;
  int sms = 0;
  size_t mem = 0;
  bool ok = false;
  for (int i = 0; i < s->ndev; i++)
    if (s->devs[i].healthy) {
      ok = true;
      sms = sms && sms < s->devs[i].sms ? sms : s->devs[i].sms;
      mem = mem && mem < s->devs[i].mem_total ? mem : s->devs[i].mem_total;
    }
  if (!ok)
    return attn_status_set(st, ATTN_ENODEV, "cuda: no healthy device is left");
  cu_slot probe;
  memset(&probe, 0, sizeof probe);
  int rc = plan_job(&probe, r, sms, s->off, st);
  if (rc < 0 && rc != ATTN_EOVERFLOW)
    return rc;
  if (rc < 0 || probe.dev_bytes > mem)
    return attn_status_set(st, ATTN_ETOOBIG,
                           "cuda: the request needs %zu MiB of device memory; the device has "
                           "%zu MiB",
                           probe.dev_bytes >> 20, mem >> 20);
  return 0;
}

static void cuda_describe(void *state, char *buf, size_t cap) {
  cu_state *s = state;
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < s->ndev && n < cap; i++) {
    const cu_dev *d = &s->devs[i];
    int w =
        snprintf(buf + n, cap - n, "%sdevice %d: %s (sm_%d%d, %d SMs, %zu MiB)%s%s", i ? "; " : "",
                 d->ordinal, d->name, d->major, d->minor, d->sms, d->mem_total >> 20,
                 d->healthy ? "" : " unhealthy: ", d->healthy ? "" : d->why);
    n += w > 0 ? (size_t)w : 0;
  }
  if (n < cap)
    snprintf(buf + n, cap - n, ", %d streams each", s->streams);
}

static bool cuda_healthy(void *state) { return any_healthy(state); }

static void close_dev(cu_dev *d) {
  if (!d->slots && !d->pool_made)
    return;
  cudaSetDevice(d->ordinal);
  for (int i = 0; i < d->nslots; i++) {
    cu_slot *sl = &d->slots[i];
    if (sl->stream) {
      cudaStreamSynchronize(sl->stream);
      cudaStreamDestroy(sl->stream);
    }
    if (sl->pinned)
      cudaFreeHost(sl->pinned);
  }
  free(d->slots);
  d->slots = NULL;
  if (d->pool_made)
    cudaMemPoolDestroy(d->pool);
  d->pool_made = false;
}

static void cuda_close(void *state) {
  cu_state *s = state;
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  for (int i = 0; i < s->ndev; i++)
    close_dev(&s->devs[i]);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static int open_dev(cu_state *s, cu_dev *d, int ordinal, attn_status *st) {
  cudaError_t e;
  struct cudaDeviceProp prop;
  d->state = s;
  d->ordinal = ordinal;
  if ((e = cudaSetDevice(ordinal)) || (e = cudaGetDeviceProperties(&prop, ordinal)))
    return cuda_fail(st, ATTN_ENODEV, "opening the device", e);
  snprintf(d->name, sizeof d->name, "%.95s", prop.name);
  d->sms = prop.multiProcessorCount;
  d->major = prop.major;
  d->minor = prop.minor;
  d->mem_total = prop.totalGlobalMem;
  if (prop.major < 8)
    return attn_status_set(st, ATTN_ENODEV,
                           "cuda device %d (%s) has compute capability %d.%d; the kernels "
                           "need 8.0 or newer",
                           ordinal, prop.name, prop.major, prop.minor);
  if ((e = (cudaError_t)attn_cu_prepare()))
    return cuda_fail(st, ATTN_ENODEV, "preparing the kernels", e);
  struct cudaMemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = cudaMemAllocationTypePinned;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = ordinal;
  if ((e = cudaMemPoolCreate(&d->pool, &pp)))
    return cuda_fail(st, ATTN_ENODEV, "creating the memory pool", e);
  d->pool_made = true;
  /* Keep up to a quarter of the card cached between jobs; more goes back
   * to the driver at the next synchronization. */
  uint64_t keep = prop.totalGlobalMem / 4;
  if ((e = cudaMemPoolSetAttribute(d->pool, cudaMemPoolAttrReleaseThreshold, &keep)))
    return cuda_fail(st, ATTN_ENODEV, "configuring the memory pool", e);
  d->nslots = s->streams;
  d->slots = calloc((size_t)d->nslots, sizeof *d->slots);
  if (!d->slots)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  for (int i = 0; i < d->nslots; i++) {
    d->slots[i].dev = d;
    if ((e = cudaStreamCreateWithFlags(&d->slots[i].stream, cudaStreamNonBlocking)))
      return cuda_fail(st, ATTN_ENODEV, "creating a stream", e);
  }
  d->healthy = true;
  return 0;
}

/* ---- the start-up self-check ------------------------------------------------------ */

/* Runs a self-check case on the slot's device and waits for it: 0, the
 * selection's refusal, or ATTN_EDEVICE with *sticky saying whether the
 * device is done. */
static int run_case(cu_slot *sl, const attn_request *r, unsigned off, bool *sticky,
                    attn_status *st) {
  cudaError_t e, se = cudaSuccess;
  const char *what = "cudaMallocFromPoolAsync";
  int rc;
  *sticky = false;
  if ((rc = plan_job(sl, r, sl->dev->sms, off, st)) < 0 ||
      (rc = grow_pinned(sl, sl->down_end, st)) < 0)
    return rc;
  stage(sl, r);
  if ((rc = alloc_job(sl, &e, st)) != 0) {
    if (rc < -1)
      return rc;
    goto fail;
  }
  set_pointers(sl, r, sl->dmem);
  e = queue_work(sl, r, false, &what);
  se = cudaStreamSynchronize(sl->stream);
  if (e == cudaSuccess && se == cudaSuccess) {
    unpack_outputs(sl, r);
    return 0;
  }
  if (e == cudaSuccess)
    e = se, what = "a self-check kernel";
  if (sl->dmem)
    cudaFree(sl->dmem);
  sl->dmem = NULL;
fail:
  cudaGetLastError();
  *sticky = cuda_sticky(e) || (se != cudaSuccess && cuda_sticky(se));
  return cuda_fail(st, ATTN_EDEVICE, what, e);
}

/* Turns off what the failed case ran (the GQA packing, else the split-KV
 * path, else its kernel: the cases test each instance plain, then split,
 * then packed), with why, for every device: the selection then falls
 * back. */
static void disable(cu_state *s, const cu_dev *d, const attn_cu_choice *ch, const char *why) {
  bool pack = ch->pack > 1, split = !pack && ch->nsplit > 1;
  int bit = pack ? ATTN_CU_KERNEL_COUNT + 1 : split ? ATTN_CU_KERNEL_COUNT : (int)ch->kernel;
  if (s->off & (1u << bit))
    return;
  s->off |= 1u << bit;
  const char *name = pack    ? "GQA head packing"
                     : split ? "split-KV merge"
                             : attn_cu_kernel_name(ch->kernel);
  snprintf(s->off_why[bit], sizeof s->off_why[bit], "device %d: %s", d->ordinal, why);
  fprintf(stderr,
          "attn: cuda device %d (%s): the self-check disabled %s: %s; requests it would run "
          "take another kernel or the CPU\n",
          d->ordinal, d->name, name, why);
}

/* A Hopper case's outcome: the instance of its head dim stays off (the
 * bits start set) when the case failed or never reached it. */
static void hopper_outcome(cu_state *s, const cu_dev *d, const attn_request *r,
                           const attn_cu_choice *ch, int rc, const char *why) {
  int dp = attn_cu_dp(r->head_dim);
  int bit = dp <= 64 ? ATTN_CU_HOPPER_D64 : dp <= 128 ? ATTN_CU_HOPPER_D128 : ATTN_CU_HOPPER_D256;
  if (rc == 0 && !why && (int)ch->kernel == bit)
    return;
  s->hopper_failed |= 1u << bit;
  snprintf(s->off_why[bit], sizeof s->off_why[bit], "device %d: %.140s", d->ordinal,
           why  ? why
           : rc ? "its self-check case was refused"
                : "its self-check case ran another kernel");
  fprintf(stderr, "attn: cuda device %d (%s): %s stays off: %s\n", d->ordinal, d->name,
          attn_cu_kernel_name((attn_cu_kernel)bit), s->off_why[bit]);
}

/* Runs every case on the device (see selfcheck.h); a case that fails or is
 * refused at launch disables what it ran, a sticky error the device. The
 * Hopper cases run only when hopper is set (hopper_gate), with that
 * instance allowed. */
static void self_check(cu_state *s, cu_dev *d, bool hopper) {
  for (int i = 0; i < attn_cu_check_count() && d->healthy; i++) {
    bool hp = attn_cu_check_is_hopper(i);
    attn_cu_check c;
    attn_status st = {0};
    if ((hp && !hopper) || attn_cu_check_make(i, &c, &st) < 0) {
      if (!hp || hopper)
        fprintf(stderr, "attn: cuda self-check case %d skipped: %s\n", i, st.message);
      continue;
    }
    cu_slot *sl = &d->slots[0];
    bool sticky;
    char why[160];
    int rc = run_case(sl, &c.req, hp ? s->off & ~ATTN_CU_HOPPER_OFF : s->off, &sticky, &st);
    bool ok = rc == 0 && attn_cu_check_verify(&c, why, sizeof why);
    if (hp)
      hopper_outcome(s, d, &c.req, &sl->ch, rc, ok ? NULL : rc == 0 ? why : st.message);
    if (rc == 0 && !ok && !hp)
      disable(s, d, &sl->ch, why);
    else if (rc == ATTN_EDEVICE && !sticky && !hp)
      disable(s, d, &sl->ch, st.message);
    else if (rc == ATTN_EDEVICE && sticky) {
      d->healthy = false;
      snprintf(d->why, sizeof d->why, "failed its start-up self-check: %.120s", st.message);
      fprintf(stderr, "attn: cuda device %d (%s) %s; it takes no jobs\n", d->ordinal, d->name,
              d->why);
    }
    attn_cu_check_free(&c);
  }
}

/* The Hopper instances start off, each with why; 1 when they may be
 * tried: this build holds their sm_90a code, the self-check runs, and
 * every device is compute capability 9.0. */
static bool hopper_gate(cu_state *s, bool checking) {
  const char *why = !attn_cu_hopper_built()
                        ? "this build has no sm_90a code (CUDA_ARCHS without 90a)"
                    : !checking ? "compile-verified only: served after it passes the start-up "
                                  "self-check, which is off (--gpu-self-check off)"
                                : NULL;
  for (int i = 0; !why && i < s->ndev; i++)
    if (s->devs[i].major != 9 || s->devs[i].minor != 0)
      why = "needs compute capability 9.0 on every device (sm_90a)";
  s->off |= ATTN_CU_HOPPER_OFF;
  for (int k = ATTN_CU_HOPPER_D64; k <= ATTN_CU_HOPPER_D256; k++)
    snprintf(s->off_why[k], sizeof s->off_why[k], "%s",
             why ? why : "compile-verified only: served after it passes the start-up self-check");
  return !why;
}

static int cuda_disabled(void *state, attn_disabled *out, int cap) {
  cu_state *s = state;
  int n = 0;
  for (int k = 0; k <= ATTN_CU_KERNEL_COUNT + 1; k++)
    if (s->off & (1u << k)) {
      if (n < cap) {
        snprintf(out[n].kernel, sizeof out[n].kernel, "%s",
                 k == ATTN_CU_KERNEL_COUNT + 1 ? "gqa_pack"
                 : k == ATTN_CU_KERNEL_COUNT   ? "split_kv_merge"
                                               : attn_cu_kernel_name((attn_cu_kernel)k));
        snprintf(out[n].why, sizeof out[n].why, "%s", s->off_why[k]);
      }
      n++;
    }
  return n;
}

static int cuda_open(const attn_backend_env *env, void **pstate, attn_status *st) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return attn_status_set(st, ATTN_ENODEV, "no CUDA device was found: %s",
                           e ? cudaGetErrorString(e) : "the driver reports none");
  }
  int ord[ATTN_MAX_CUDA_DEVICES];
  int n = attn_cuda_devices_parse(env->cfg->cuda_devices, ord, ATTN_MAX_CUDA_DEVICES, st);
  if (n < 0)
    return n;
  for (int i = 0; i < n; i++)
    if (ord[i] >= count)
      return attn_status_set(st, ATTN_ENODEV, "cuda device %d does not exist (this machine has %d)",
                             ord[i], count);
  if (env->cfg->cuda_streams < 0 || env->cfg->cuda_streams > 64)
    return attn_status_set(st, ATTN_EINVAL, "cuda streams must be from 1 to 64 (got %d)",
                           env->cfg->cuda_streams);
  cu_state *s = calloc(1, sizeof *s);
  if (!s)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  s->streams = env->cfg->cuda_streams ? env->cfg->cuda_streams : DEFAULT_STREAMS;
  s->ndev = n;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    rc = open_dev(s, &s->devs[i], ord[i], st);
  bool hopper = rc == 0 && hopper_gate(s, !env->cfg->cuda_self_check_off);
  for (int i = 0; i < n && rc == 0 && !env->cfg->cuda_self_check_off; i++)
    self_check(s, &s->devs[i], hopper);
  if (hopper)
    s->off &= ~(ATTN_CU_HOPPER_OFF & ~s->hopper_failed);
  if (rc == 0) {
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->thread, NULL, dispatcher, s) != 0) {
      pthread_cond_destroy(&s->cv);
      pthread_mutex_destroy(&s->mu);
      rc = attn_status_set(st, ATTN_ENOMEM, "cannot start the cuda dispatcher thread");
    }
  }
  if (rc < 0) {
    for (int i = 0; i < n; i++)
      close_dev(&s->devs[i]);
    free(s);
    return rc;
  }
  *pstate = s;
  return 0;
}

const struct attn_backend_ops attn__cuda_backend = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .supports = cuda_supports,
    .submit = cuda_submit,
    .describe = cuda_describe,
    .automatic = true,
    .healthy = cuda_healthy,
    .disabled = cuda_disabled,
};
