/*
 * cuda.c — the "cuda" backend: FlashAttention kernels on a pool of streams.
 *
 * Each device gets --streams slots; a slot is three streams (uploads,
 * kernels, downloads), a small pinned staging buffer, two pinned packing
 * chunks, a thread, and at most one job at a time. One dispatcher thread
 * hands queued jobs to free slots; the slot's thread lays the job out,
 * allocates its device memory from the device's pool and queues its work.
 * A large forward job runs in up to CU_MAX_GROUPS (batch, head) groups:
 * group g's upload, group g-1's kernels and group g-2's download run at
 * once, ordered by events rather than device-wide syncs. A host function
 * at the end of the download stream (which may make no CUDA call) moves
 * the slot to FINISH and wakes its thread, which checks the input scan,
 * unpacks what was not downloaded in place and completes the job.
 *
 * Host copies are what a large job used to spend its time on (on an H200,
 * packing a [4, 16, 4096, 128] BF16 job took 33 ms, its kernel 1.9 ms). So
 * the backend lends callers page-locked memory (pinned.c, capped by
 * attn_config.cuda_pinned_bytes): a contiguous tensor that lies there (the
 * server receives request bodies and writes replies there) is uploaded
 * straight from it and its outputs downloaded straight into it, O at its
 * final offset in the reply. Only a strided, JSON-decoded or otherwise
 * ordinary-memory input is packed, on the slot's thread, through the two
 * chunks so each chunk's upload overlaps the packing of the next; such
 * outputs are downloaded into the staging and unpacked there.
 *
 * Sessions (pages.c): a session store on an engine with a device keeps its
 * pages in that device's memory; a call's job uploads q and its page
 * tables and the paged forward instances read K and V in place. Such jobs
 * run on that device's slots.
 *
 * A backward job stages Q, K, V, O and dO (and the caller's lse when it
 * has one), scans all five, runs the forward with statistics first when it
 * must recompute lse (its O goes to dQ's buffer, which the backward
 * overwrites), then the backward kernels, and downloads dQ, dK and dV; it
 * is one group.
 *
 * Sinks (sinks.h) never reach the attention kernels: a small kernel folds
 * them into each group's O and statistics after its forward launch (the
 * lse it reads is scratch when the caller wants none), into a recomputed
 * lse before a backward, and computes dsinks after the backward kernels.
 * They are served once their own cases of the self-check below pass (and
 * not with it off): until then the backend declines requests with sinks,
 * which auto runs on the CPU.
 *
 * When a device is opened, a self-check (selfcheck.h) runs every kernel
 * instance the selection can choose on small awkward shapes against the
 * float64 reference, through the same staging and launch path as a job;
 * an instance that fails is disabled (attn_cu_select_masked skips it, so a
 * request falls back to another instance or, refused, to the CPU) and
 * attn_engine_backends() lists it with why. attn_config's
 * cuda_self_check_off skips it.
 *
 * A canceled job (attn_request.cancel) is checked before it is staged and
 * before its outputs are unpacked; work already queued on a stream runs to
 * its end.
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
#include "cuda_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_STREAMS 4

static int cuda_submit(void *state, attn_job *job, attn_status *st) {
  (void)st;
  attn__cu_enqueue(state, job);
  return 0;
}

static int cuda_supports(void *state, const attn_request *r, attn_status *st) {
  cu_state *s = state;
  const int64_t dv = attn_request_dv(r), w = r->head_dim > dv ? r->head_dim : dv;
  if (w > ATTN_CU_MAX_HEAD_DIM) /* backend auto takes the cpu instead */
    return attn_status_set(st, ATTN_EUNSUPPORTED,
                           "cuda: the kernels take head dims up to %d, not head_dim %lld, "
                           "head_dim_v %lld (backend auto runs such a request on the cpu)",
                           ATTN_CU_MAX_HEAD_DIM, (long long)r->head_dim, (long long)dv);
  /* Host pages are the cpu kernel's; ours (a store on this device) only we read. */
  if (r->k_pages && !r->page_pitch)
    return attn_status_set(st, ATTN_EUNSUPPORTED, "host pages (sessions) run on the cpu backend");
  if (r->sinks && *s->sinks_why) /* backend auto takes the cpu instead */
    return attn_status_set(st, ATTN_EUNSUPPORTED, "cuda: sinks are off: %s", s->sinks_why);
  int rc = r->k_pages ? attn__cu_pages_check(s, r, st) : 0;
  if (rc)
    return rc;
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
  rc = attn__cu_plan(&probe, r, sms, attn__cu_job_off(s), st);
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

static bool cuda_healthy(void *state) { return attn__cu_any_healthy(state); }

static void *cuda_host_alloc(void *state, size_t n) {
  return attn__cu_pinned_get(&((cu_state *)state)->pin, n);
}

static bool cuda_host_free(void *state, void *p) {
  return attn__cu_pinned_put(&((cu_state *)state)->pin, p);
}

static void cuda_host_stats(void *state, attn_host_stats *out) {
  attn__cu_pinned_stats(&((cu_state *)state)->pin, out);
}

static int cuda_pages_open(void *state, uint64_t bytes, void **base, attn_status *st) {
  return attn__cu_pages_open(state, bytes, base, st);
}

static void cuda_pages_close(void *state, void *base) { attn__cu_pages_close(state, base); }

static int cuda_pages_copy(void *state, void *dst, size_t dpitch, const void *src, size_t spitch,
                           size_t width, size_t rows, attn_status *st) {
  return attn__cu_pages_copy(state, dst, dpitch, src, spitch, width, rows, st);
}

static void cuda_close(void *state) {
  cu_state *s = state;
  attn__cu_dispatch_stop(s);
  for (int i = 0; i < s->ndev; i++)
    attn__cu_close_dev(&s->devs[i]);
  attn__cu_pinned_close(&s->pin);
  free(s);
}

static int cuda_disabled(void *state, attn_disabled *out, int cap) {
  cu_state *s = state;
  int n = 0;
  const char *const named[2][2] = {{"paged_kv", s->paged_why}, {"sinks", s->sinks_why}};
  for (int i = 0; i < 2; i++)
    if (*named[i][1]) { /* sessions' pages stay in host memory; sinks run on the cpu */
      if (n < cap) {
        snprintf(out[n].kernel, sizeof out[n].kernel, "%s", named[i][0]);
        snprintf(out[n].why, sizeof out[n].why, "%s", named[i][1]);
      }
      n++;
    }
  for (int k = 0; k <= ATTN_CU_KERNEL_COUNT + 2; k++)
    if (s->off & (1u << k)) {
      if (n < cap) {
        snprintf(out[n].kernel, sizeof out[n].kernel, "%s",
                 k == ATTN_CU_KERNEL_COUNT + 2   ? "bwd_atomic_dq"
                 : k == ATTN_CU_KERNEL_COUNT + 1 ? "gqa_pack"
                 : k == ATTN_CU_KERNEL_COUNT     ? "split_kv_merge"
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
  s->bwd_atomic_dq = env->cfg->cuda_bwd_atomic_dq;
  s->ndev = n;
  attn__cu_pinned_init(&s->pin, env->cfg->cuda_pinned_bytes);
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++)
    rc = attn__cu_open_dev(s, &s->devs[i], ord[i], st);
  bool hopper = rc == 0 && attn__cu_hopper_gate(s, !env->cfg->cuda_self_check_off);
  for (int i = 0; i < n && rc == 0 && !env->cfg->cuda_self_check_off; i++) {
    attn__cu_self_check(s, &s->devs[i], hopper);
    attn__cu_self_check_paged(s, &s->devs[i]);
    attn__cu_self_check_sinks(s, &s->devs[i]);
  }
  if (env->cfg->cuda_self_check_off) {
    static const char unchecked[] = "compile-verified only: served after it passes the start-up "
                                    "self-check, which is off (--gpu-self-check off)";
    snprintf(s->paged_why, sizeof s->paged_why, "%s", unchecked);
    snprintf(s->sinks_why, sizeof s->sinks_why, "%s", unchecked);
    attn__cu_decode_off(s);
  }
  if (hopper)
    s->off &= ~(ATTN_CU_HOPPER_OFF & ~s->hopper_failed);
  if (rc == 0)
    rc = attn__cu_dispatch_start(s, st);
  if (rc < 0) {
    for (int i = 0; i < n; i++)
      attn__cu_close_dev(&s->devs[i]);
    attn__cu_pinned_close(&s->pin);
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
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_stats = cuda_host_stats,
    .pages_open = cuda_pages_open,
    .pages_close = cuda_pages_close,
    .pages_copy = cuda_pages_copy,
};
