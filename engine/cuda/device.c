/*
 * device.c — opening and closing one CUDA device, and its health: which
 * CUDA errors leave it usable, and the one that ends it.
 *
 * Opening reads the device's properties, refuses one older than compute
 * capability 8.0, makes its memory pool and its streams. Every other file
 * of the backend reports a CUDA error through here (attn__cu_fail), and a
 * sticky one (attn__cu_sticky) marks the device unhealthy: it takes no
 * more jobs. This file calls none of the others.
 */
#include "cuda_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void close_slot(cu_slot *sl) {
  cudaStream_t *const st[3] = {&sl->up, &sl->stream, &sl->down};
  for (int k = 0; k < 3; k++)
    if (*st[k]) {
      cudaStreamSynchronize(*st[k]);
      cudaStreamDestroy(*st[k]);
    }
  for (int g = 0; g < CU_MAX_GROUPS; g++) {
    if (sl->ev_up[g])
      cudaEventDestroy(sl->ev_up[g]);
    if (sl->ev_k[g])
      cudaEventDestroy(sl->ev_k[g]);
  }
  for (int c = 0; c < 2; c++) {
    if (sl->ev_chunk[c])
      cudaEventDestroy(sl->ev_chunk[c]);
    if (sl->chunk[c])
      cudaFreeHost(sl->chunk[c]);
  }
  if (sl->pinned)
    cudaFreeHost(sl->pinned);
}

/* A slot's streams, events and packing chunks (their pinned memory). */
static cudaError_t open_slot(cu_slot *sl) {
  cudaError_t e = cudaSuccess;
  cudaStream_t *const st[3] = {&sl->up, &sl->stream, &sl->down};
  for (int k = 0; k < 3 && !e; k++)
    e = cudaStreamCreateWithFlags(st[k], cudaStreamNonBlocking);
  /* events order work and are waited on, never timed */
  for (int g = 0; g < CU_MAX_GROUPS && !e; g++)
    if (!(e = cudaEventCreateWithFlags(&sl->ev_up[g], cudaEventDisableTiming)))
      e = cudaEventCreateWithFlags(&sl->ev_k[g], cudaEventDisableTiming);
  for (int c = 0; c < 2 && !e; c++)
    if (!(e = cudaEventCreateWithFlags(&sl->ev_chunk[c], cudaEventDisableTiming)))
      e = cudaHostAlloc((void **)&sl->chunk[c], CU_CHUNK_BYTES, cudaHostAllocPortable);
  return e;
}

void attn__cu_close_dev(cu_dev *d) {
  if (!d->slots && !d->pool_made)
    return;
  cudaSetDevice(d->ordinal);
  for (int i = 0; i < d->nslots; i++)
    close_slot(&d->slots[i]);
  free(d->slots);
  d->slots = NULL;
  if (d->pool_made)
    cudaMemPoolDestroy(d->pool);
  d->pool_made = false;
}

int attn__cu_open_dev(cu_state *s, cu_dev *d, int ordinal, attn_status *st) {
  cudaError_t e;
  struct cudaDeviceProp prop;
  d->state = s;
  d->ordinal = ordinal;
  if ((e = cudaSetDevice(ordinal)) || (e = cudaGetDeviceProperties(&prop, ordinal)))
    return attn__cu_fail(st, ATTN_ENODEV, "opening the device", e);
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
    return attn__cu_fail(st, ATTN_ENODEV, "preparing the kernels", e);
  struct cudaMemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = cudaMemAllocationTypePinned;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = ordinal;
  if ((e = cudaMemPoolCreate(&d->pool, &pp)))
    return attn__cu_fail(st, ATTN_ENODEV, "creating the memory pool", e);
  d->pool_made = true;
  /* Keep up to a quarter of the card cached between jobs; more goes back
   * to the driver at the next synchronization. */
  uint64_t keep = prop.totalGlobalMem / 4;
  if ((e = cudaMemPoolSetAttribute(d->pool, cudaMemPoolAttrReleaseThreshold, &keep)))
    return attn__cu_fail(st, ATTN_ENODEV, "configuring the memory pool", e);
  d->nslots = s->streams;
  d->slots = calloc((size_t)d->nslots, sizeof *d->slots);
  if (!d->slots)
    return attn_status_set(st, ATTN_ENOMEM, "out of memory");
  for (int i = 0; i < d->nslots; i++) {
    d->slots[i].dev = d;
    if ((e = open_slot(&d->slots[i])))
      return attn__cu_fail(st, ATTN_ENODEV, "creating a slot's streams and buffers", e);
  }
  d->healthy = true;
  return 0;
}

int attn__cu_fail(attn_status *st, int code, const char *what, cudaError_t e) {
  return attn_status_set(st, code, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                         cudaGetErrorName(e));
}

/* Whether an error leaves the context unusable (a fault in a kernel, or
 * one CUDA cannot attribute). A launch the runtime refuses (a broken
 * contract, a bad configuration, no machine code for this device, too few
 * registers) leaves it usable: only its job fails. */
bool attn__cu_sticky(cudaError_t e) {
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
void attn__cu_mark_unhealthy(cu_dev *d, const char *what, cudaError_t e) {
  if (d->healthy)
    fprintf(stderr, "attn: cuda device %d (%s) failed in %s: %s; it takes no more jobs\n",
            d->ordinal, d->name, what, cudaGetErrorString(e));
  d->healthy = false;
  snprintf(d->why, sizeof d->why, "failed in %s: %s", what, cudaGetErrorString(e));
}
