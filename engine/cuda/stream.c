/*
 * stream.c — a job on a slot's stream: its memory, its queued work, and
 * the errors that end it.
 *
 * A slot thread starts a job here (device memory from the device's pool,
 * then, group by group, the upload, scans, kernels and download on the
 * slot's three streams, then the free and a host function that reports it
 * done) and takes its outcome here once the streams have run; which CUDA
 * errors leave the device usable is the device's (device.c).
 */
#include "cuda_int.h"

#include "check.h"

#include <math.h>
#include <stdio.h>

int attn__cu_grow_pinned(cu_slot *sl, size_t need, attn_status *st) {
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

/* The host function, on a CUDA thread: the job's streams have run, so a
 * slot thread may finish it (at once if it has left START, else when it
 * does). It makes no CUDA call. */
static void CUDART_CB on_stream_done(void *arg) {
  cu_slot *sl = arg;
  cu_state *s = sl->dev->state;
  pthread_mutex_lock(&s->mu);
  if (sl->phase == CU_RUN) {
    sl->phase = CU_FINISH;
    pthread_cond_signal(&sl->cv);
  } else if (sl->phase == CU_START) {
    sl->fn_ran = true;
  }
  pthread_mutex_unlock(&s->mu);
}

/* A backward job without the caller's lse: the forward with statistics
 * writes it, and its O goes to dQ's buffer (overwritten later); with
 * sinks, the lse with them, as the caller's would be. */
static cudaError_t launch_lse(cu_slot *sl) {
  attn_cu_params fp = sl->prm;
  fp.pass = ATTN_FORWARD;
  fp.o = fp.dq;
  fp.m = fp.l = NULL;
  fp.split_ws = NULL;
  cudaError_t e = (cudaError_t)attn_cu_launch(&fp, &sl->fch, sl->stream);
  if (e || !sl->sinks)
    return e;
  fp.o = NULL; /* only lse matters here */
  return (cudaError_t)attn_cu_sink_fold(&fp, sl->sinks, sl->stream);
}

/* Group g's kernels, then what its sinks add (sinks.h): folded into a
 * forward's outputs, or a backward's dsinks. */
static cudaError_t launch_group(cu_slot *sl, int g, const char **what) {
  const cu_group *gr = &sl->grp[g];
  cudaError_t e = (cudaError_t)attn_cu_launch(&gr->prm, &gr->ch, sl->stream);
  if (e || !gr->sinks)
    return e;
  *what = "the sinks";
  if (gr->prm.pass == ATTN_FORWARD)
    return (cudaError_t)attn_cu_sink_fold(&gr->prm, gr->sinks, sl->stream);
  return sl->dsinks ? (cudaError_t)attn_cu_sink_grad(&gr->prm, gr->sinks, sl->dsinks, sl->stream)
                    : cudaSuccess;
}

/* Group g's scans and kernels on the kernel stream, once its upload has
 * run. */
static cudaError_t compute_group(cu_slot *sl, const attn_request *r, int g, const char **what) {
  unsigned char *dm = sl->dmem;
  attn_cu_scan_result *dscan = (attn_cu_scan_result *)(dm + sl->off_scan);
  size_t rowb = (size_t)sl->prm.dp * attn_dtype_size(r->dtype);
  cu_tensor in[5];
  cudaError_t e;
  attn__cu_inputs(r, in);
  *what = "writing the new rows into their pages";
  if (g == 0 && sl->nrows && /* before any kernel reads the pages */
      (e = (cudaError_t)attn_cu_put_rows(
           dm + sl->off_rows, (const long long *)(dm + sl->off_rowdst), sl->dev->state->pages_base,
           sl->nrows, (size_t)sl->prm.dp * attn_dtype_size(r->dtype), sl->stream)))
    return e;
  *what = "the input scan";
  for (int t = 0; t < sl->nin; t++) {
    int64_t row0, n = attn__cu_group_rows(sl, g, in[t].kv, &row0);
    if ((e = (cudaError_t)attn_cu_scan(dm + sl->off[t] + (size_t)row0 * rowb, r->dtype,
                                       (size_t)n * (size_t)sl->prm.dp, &dscan[g * sl->nin + t],
                                       sl->stream)))
      return e;
  }
  *what = "the forward pass that recomputes lse";
  if (r->pass == ATTN_BACKWARD && !r->lse_in && (e = launch_lse(sl)))
    return e;
  *what = "the attention kernel";
  return launch_group(sl, g, what);
}

/* Group g: upload, then (once it has run) scans and kernels, then (once
 * they have) the download, each on its own stream. */
static cudaError_t queue_group(cu_slot *sl, const attn_request *r, int g, const char **what) {
  cudaError_t e;
  if ((e = attn__cu_upload_group(sl, r, g, what)))
    return e;
  *what = "ordering the group's streams";
  if ((e = cudaEventRecord(sl->ev_up[g], sl->up)) ||
      (e = cudaStreamWaitEvent(sl->stream, sl->ev_up[g], 0)))
    return e;
  if ((e = compute_group(sl, r, g, what)))
    return e;
  *what = "ordering the group's streams";
  if ((e = cudaEventRecord(sl->ev_k[g], sl->stream)) ||
      (e = cudaStreamWaitEvent(sl->down, sl->ev_k[g], 0)))
    return e;
  *what = "the download";
  return sl->fold ? cudaSuccess : attn__cu_download_group(sl, r, g);
}

cudaError_t attn__cu_queue_work(cu_slot *sl, const attn_request *r, bool host_fn,
                                const char **what) {
  unsigned char *dm = sl->dmem;
  cudaError_t e;
  *what = "the upload";
  if ((e = cudaMemcpyAsync(dm + sl->off_misc, sl->pinned, sl->up_end - sl->off_misc,
                           cudaMemcpyHostToDevice, sl->up)))
    return e;
  for (int g = 0; g < sl->ngroups; g++)
    if ((e = queue_group(sl, r, g, what)))
      return e;
  *what = "the download";
  /* folded: the scan results, O and the statistics lie together from off_scan */
  size_t scan_bytes = sl->fold ? sl->down_end - sl->off_scan
                               : (size_t)sl->ngroups * sl->nin * sizeof(attn_cu_scan_result);
  if ((e = cudaMemcpyAsync(attn__cu_staged(sl, sl->off_scan), dm + sl->off_scan, scan_bytes,
                           cudaMemcpyDeviceToHost, sl->down)))
    return e;
  *what = "cudaFreeAsync";
  if ((e = cudaFreeAsync(sl->dmem, sl->down)))
    return e;
  sl->dmem = NULL;
  *what = "cudaLaunchHostFunc";
  return host_fn ? cudaLaunchHostFunc(sl->down, on_stream_done, sl) : cudaSuccess;
}

cudaError_t attn__cu_sync_slot(cu_slot *sl) {
  cudaError_t a = cudaStreamSynchronize(sl->up), b = cudaStreamSynchronize(sl->stream);
  cudaError_t c = cudaStreamSynchronize(sl->down);
  return a ? a : b ? b : c;
}

/* Device memory for the job from the device's pool: 0, ATTN_ENOMEM
 * (retryable) when it does not fit, or -1 for another CUDA error, which
 * *pe holds. */
int attn__cu_alloc(cu_slot *sl, cudaError_t *pe, attn_status *st) {
  cu_dev *d = sl->dev;
  sl->dmem = NULL;
  /* on the upload stream, the memory's first user */
  cudaError_t e = cudaMallocFromPoolAsync(&sl->dmem, sl->dev_bytes, d->pool, sl->up);
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
int attn__cu_start(cu_slot *sl, attn_status *st) {
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
  if ((rc = attn__cu_plan(sl, r, d->sms, attn__cu_job_off(d->state), st)) < 0 ||
      (rc = attn__check_lse(r, st)) < 0)
    return rc;
  attn__cu_route(sl, r, &d->state->pin);
  if ((rc = attn__cu_grow_pinned(sl, attn__cu_staging_bytes(sl), st)) < 0)
    return rc;
  attn__cu_stage_misc(sl, r);
  what = "cudaMallocFromPoolAsync";
  if ((rc = attn__cu_alloc(sl, &e, st)) != 0) {
    if (rc < -1)
      return rc;
    goto device_error;
  }
  attn__cu_set_pointers(sl, r, sl->dmem);
  if ((e = attn__cu_queue_work(sl, r, true, &what)) == cudaSuccess)
    return 0;
  /* Work already queued may still read the staging buffer or the
   * caller's memory: wait it out. A refused launch fails its job alone,
   * unless the wait shows the context broken after all. */
  cudaGetLastError();
  cudaError_t se = attn__cu_sync_slot(sl);
  if (sl->dmem)
    cudaFree(sl->dmem);
  sl->dmem = NULL;
  if (se != cudaSuccess && !attn__cu_sticky(e))
    e = se, what = "the stream after a refused launch";
device_error:
  cudaGetLastError();
  if (attn__cu_sticky(e))
    attn__cu_mark_unhealthy(d, what, e);
  return attn__cu_fail(st, ATTN_EDEVICE, what, e);
}

/* The job's outcome once its stream has run: the scan's verdict, then the
 * outputs. */
int attn__cu_finish(cu_slot *sl, attn_status *st) {
  const attn_request *r = &sl->job->req;
  if (attn__job_canceled(sl->job)) /* nobody wants the outputs: skip the copy */
    return attn__canceled(st);
  int rc = attn__cu_check_scan(sl, r, st);
  if (rc < 0)
    return rc;
  attn__cu_unpack_outputs(sl, r);
  for (int64_t h = 0; r->dsinks && h < r->heads_q; h++)
    if (!isfinite(r->dsinks[h]))
      return attn_status_set(st, ATTN_ERANGE,
                             "the gradients overflow float32; if lse was given, pass the lse "
                             "of the forward call on the same inputs");
  return 0;
}
