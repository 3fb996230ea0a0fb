/*
 * mock.h — a stand-in for the CUDA runtime and the kernels, so the CUDA
 * backend's host code (engine/cuda/cuda.c: the stream pool, staging,
 * packing, the dispatcher, error handling) runs on a machine without a GPU.
 *
 * "Device" memory is host memory; each stream is a thread running its
 * queued operations in order, and host functions run on it as CUDA runs
 * them on its own threads. The forward kernel is a plain float64 attention
 * on the packed layout written from DESIGN.md's rule, independent of the
 * kernels' code; the backward likewise (reading the device's O and lse, as
 * the kernels do); the scan is a plain loop. Knobs inject the failures the
 * backend must survive.
 */
#ifndef ATTN_CUDAMOCK_H
#define ATTN_CUDAMOCK_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mock_knobs {
  int devices;      /* what cudaGetDeviceCount reports (0: no device) */
  int major;        /* compute capability of every device */
  size_t mem_total; /* bytes per device */
  int fail_alloc;   /* the next N device allocations fail as out of memory */
  int fail_launch;  /* the next N kernel launches fail at launch */
  int fault_stream; /* the next N kernels fault on their stream */
} mock_knobs;

/* Sets the knobs; call before opening an engine. */
void mock_set(const mock_knobs *k);
void mock_defaults(void);

/* Device bytes allocated and not freed; pinned host buffers alive; streams
 * alive; kernel launches so far. */
size_t mock_device_bytes(void);
int mock_pinned_buffers(void);
int mock_streams(void);
long mock_launches(void);

#endif
