/*
 * mock.h — a stand-in for the CUDA runtime and the kernels, so the CUDA
 * backend's host code (engine/cuda/cuda.c: the stream pool, staging,
 * packing, the dispatcher, error handling) runs on a machine without a GPU.
 *
 * "Device" memory is host memory; each stream is a thread running its
 * queued operations in order, and host functions run on it as CUDA runs
 * them on its own threads. The forward kernel is a plain float64 attention
 * on the packed layout written from docs/design.md's rule, independent of the
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
  /* What a failed launch returns (0: cudaErrorLaunchFailure, a sticky
   * error; cudaErrorInvalidValue is a refused launch, not sticky). */
  int launch_error;
  /* Kernels wait at a gate until a racing stream query opens it. */
  bool hold_kernels;
  /* The next N queries of a busy stream open the gate, wait until the
   * stream has run its host function, then find the context poisoned
   * (cudaErrorIllegalAddress, on every query from then on): the host
   * function and the fault poll race. */
  int race_query;
  /* A kernel that computes wrong output: ATTN_CU_* + 1 (0: none), or, for
   * wrong_merge, every split launch (its merge is wrong). */
  int wrong_kernel;
  bool wrong_merge;
  bool wrong_pack;      /* every launch with GQA packing (attn_cu_choice.pack) */
  int fail_pin;         /* the next N cudaHostAlloc calls fail */
  bool wrong_paged;     /* every launch that reads pages (attn_cu_params.k_table) */
  bool wrong_atomic_dq; /* every backward launch on the atomic dQ path (no dQ grid) */
  bool wrong_sinks;     /* every sink fold and gradient (sinks.h) */
  /* The fail_within-th device-to-device copy from now fails, refused as
   * cudaErrorInvalidValue (not sticky); 0: none. */
  int fail_within;
} mock_knobs;

/* Knobs with the failure counters given and nothing else injected. */
#define MOCK_KNOBS(ndev, cc_major, mem, allocs, launches, faults) \
  ((mock_knobs){.devices = (ndev),                                \
                .major = (cc_major),                              \
                .mem_total = (mem),                               \
                .fail_alloc = (allocs),                           \
                .fail_launch = (launches),                        \
                .fault_stream = (faults)})

/* Sets the knobs; call before opening an engine. */
void mock_set(const mock_knobs *k);
void mock_defaults(void);

/* Device bytes allocated and not freed; pinned host buffers alive; streams
 * alive; kernel launches so far. */
size_t mock_device_bytes(void);
int mock_pinned_buffers(void);
int mock_streams(void);
long mock_launches(void);
/* The kernel of the latest launch, and its number of key splits. */
int mock_last_kernel(int *nsplit);
/* The GQA packing (attn_cu_choice.pack) of the latest launch. */
int mock_last_pack(void);
/* Launches so far of kernel k that neither split nor packed, and of those
 * the ones with more than one query tile (grid[0] > 1). */
long mock_plain_launches(int k, long *multi_tile);
/* Whether the latest backward launch took the atomic dQ path (its choice
 * without a dQ grid), and the device bytes allocated when it launched. */
bool mock_last_bwd_atomic(size_t *dev_bytes);
/* Lets kernels held by hold_kernels run. */
void mock_open_gate(void);

/* The log of copies and kernel launches since mock_log_reset(), in the
 * order they were queued: each with its stream, its pointers (a kernel's
 * dst is its O, src its Q), whether the host side of a copy lies in
 * cudaHostAlloc memory, and the mock clock when it started and ended on
 * its stream (one clock for all streams, so order across streams shows).
 * attn_cu_put_rows (a paged job's new rows into their pages) is logged as
 * MOCK_OTHER, dst the page pool's base and bytes the rows', and is held by
 * hold_kernels as a kernel is; the scan is not logged. The sinks' kernels
 * (sinks.h) are MOCK_SINKS, src the sinks, dst the lse a fold rewrites or
 * the dsinks a gradient writes; mock_sinks() has their arguments. A
 * device-to-device copy (a fork's page copied on write) is MOCK_WITHIN. */
enum { MOCK_UPLOAD, MOCK_DOWNLOAD, MOCK_MEMSET, MOCK_KERNEL, MOCK_OTHER, MOCK_SINKS, MOCK_WITHIN };
#define MOCK_LOG_MAX 8192
typedef struct mock_op {
  int kind;
  const void *stream;
  void *dst;
  const void *src;
  size_t bytes;
  bool host_pinned;
  long start, end;
} mock_op;
int mock_log(mock_op *out, int cap);
void mock_log_reset(void);

/* The sinks' launches since mock_log_reset(), in the order they were
 * queued, each with its place in mock_log() and its arguments. The fold and
 * the gradient compute in float64 from the contract, on the device's O,
 * dO and lse, as the kernels' replacements. */
typedef struct mock_sink {
  bool grad; /* attn_cu_sink_grad; else attn_cu_sink_fold */
  int log;   /* its entry in mock_log() (-1: the log was full) */
  const void *stream;
  const float *sinks, *lse;
  float *dsinks;
  bool o, m, l; /* the fold's params had O (forward) and m, l set */
  int batch, heads_q, seq_q, dtype;
} mock_sink;
int mock_sinks(mock_sink *out, int cap);

#endif
