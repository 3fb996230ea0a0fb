/*
 * mock_cudart.c — the CUDA runtime calls engine/cuda/cuda.c makes, and the
 * kernels.h entry points, done on the host (see mock.h). Linked ahead of
 * libattn.a, so the real launch.o, the kernels and libcudart are never
 * pulled in. Process-wide state is fine here: this is a test double.
 */
#define _GNU_SOURCE
#include "mock.h"

#include "cuda/kernels.h"
#include "cuda/sinks.h"
#include "engine.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mock_knobs g_k = {.devices = 1, .major = 9, .mem_total = (size_t)8 << 30};
static size_t g_dev_bytes;
static int g_pinned, g_streams;
static long g_launches;
static cudaError_t g_last;
static int g_current;
static bool g_dev_fault[16]; /* a fault broke the device's context */
/* hold_kernels' gate, race_query's poisoned context, the latest launch. */
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static bool g_gate_open, g_poisoned;
static int g_last_kernel = -1, g_last_nsplit, g_last_pack;
static bool g_last_atomic;
static size_t g_last_bytes;
/* mock_plain_launches() per kernel */
static long g_plain[ATTN_CU_KERNEL_COUNT], g_plain_multi[ATTN_CU_KERNEL_COUNT];

void mock_set(const mock_knobs *k) {
  pthread_mutex_lock(&g_mu);
  g_k = *k;
  pthread_mutex_unlock(&g_mu);
}
void mock_defaults(void) {
  mock_knobs k = MOCK_KNOBS(1, 9, (size_t)8 << 30, 0, 0, 0);
  mock_set(&k);
  pthread_mutex_lock(&g_mu);
  g_gate_open = g_poisoned = false;
  g_last_kernel = -1;
  memset(g_dev_fault, 0, sizeof g_dev_fault);
  pthread_mutex_unlock(&g_mu);
}
void mock_open_gate(void) {
  pthread_mutex_lock(&g_mu);
  g_gate_open = true;
  pthread_cond_broadcast(&g_gate_cv);
  pthread_mutex_unlock(&g_mu);
}
int mock_last_kernel(int *nsplit) {
  pthread_mutex_lock(&g_mu);
  int k = g_last_kernel;
  if (nsplit)
    *nsplit = g_last_nsplit;
  pthread_mutex_unlock(&g_mu);
  return k;
}
bool mock_last_bwd_atomic(size_t *dev_bytes) {
  pthread_mutex_lock(&g_mu);
  bool a = g_last_atomic;
  if (dev_bytes)
    *dev_bytes = g_last_bytes;
  pthread_mutex_unlock(&g_mu);
  return a;
}
int mock_last_pack(void) {
  pthread_mutex_lock(&g_mu);
  int k = g_last_pack;
  pthread_mutex_unlock(&g_mu);
  return k;
}
long mock_plain_launches(int k, long *multi_tile) {
  pthread_mutex_lock(&g_mu);
  long n = g_plain[k];
  if (multi_tile)
    *multi_tile = g_plain_multi[k];
  pthread_mutex_unlock(&g_mu);
  return n;
}
size_t mock_device_bytes(void) {
  pthread_mutex_lock(&g_mu);
  size_t b = g_dev_bytes;
  pthread_mutex_unlock(&g_mu);
  return b;
}
int mock_pinned_buffers(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_pinned;
  pthread_mutex_unlock(&g_mu);
  return n;
}
int mock_streams(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_streams;
  pthread_mutex_unlock(&g_mu);
  return n;
}
long mock_launches(void) {
  pthread_mutex_lock(&g_mu);
  long n = g_launches;
  pthread_mutex_unlock(&g_mu);
  return n;
}

static cudaError_t fail(cudaError_t e) {
  pthread_mutex_lock(&g_mu);
  g_last = e;
  pthread_mutex_unlock(&g_mu);
  return e;
}

/* ---- streams: a thread each, running queued operations in order ---------- */

typedef struct op {
  void (*fn)(void *arg);
  void *arg;
  bool owns_arg;
  bool fault;  /* the "kernel" faults: the stream is broken from here on */
  bool always; /* runs after a fault too (memory the dead context releases) */
  int log;     /* its entry in the copy and launch log, or -1 */
  struct op *next;
} op;

struct CUstream_st {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  op *head, *tail;
  int pending;
  bool stop;
  cudaError_t fault;
  int device; /* a fault breaks every stream of its device's context */
};

/* ---- the log of copies and launches, stamped as they run ------------------- */

static mock_op g_log[MOCK_LOG_MAX];
static int g_nlog;
static long g_clock;

/* Host allocations of cudaHostAlloc, to tell pinned host memory. */
#define MAX_PINNED 4096
static struct {
  const unsigned char *p;
  size_t n;
} g_pins[MAX_PINNED];

static bool is_pinned(const void *p) {
  const unsigned char *c = p;
  for (int i = 0; i < MAX_PINNED; i++)
    if (g_pins[i].p && c >= g_pins[i].p && c < g_pins[i].p + g_pins[i].n)
      return true;
  return false;
}

/* An entry for an operation queued on s; -1 when the log is full. */
static int log_add(int kind, const void *s, void *dst, const void *src, size_t bytes) {
  pthread_mutex_lock(&g_mu);
  int i = g_nlog < MOCK_LOG_MAX ? g_nlog++ : -1;
  if (i >= 0) {
    const void *host = kind == MOCK_UPLOAD ? src : kind == MOCK_DOWNLOAD ? dst : NULL;
    g_log[i] = (mock_op){kind, s, dst, src, bytes, host && is_pinned(host), -1, -1};
  }
  pthread_mutex_unlock(&g_mu);
  return i;
}

static void log_stamp(int i, bool end) {
  if (i < 0)
    return;
  pthread_mutex_lock(&g_mu);
  if (end)
    g_log[i].end = ++g_clock;
  else
    g_log[i].start = ++g_clock;
  pthread_mutex_unlock(&g_mu);
}

int mock_log(mock_op *out, int cap) {
  pthread_mutex_lock(&g_mu);
  int n = g_nlog < cap ? g_nlog : cap;
  memcpy(out, g_log, (size_t)n * sizeof *out);
  pthread_mutex_unlock(&g_mu);
  return n;
}

#define MOCK_SINKS_MAX 256
static mock_sink g_sinks[MOCK_SINKS_MAX];
static int g_nsinks;

void mock_log_reset(void) {
  pthread_mutex_lock(&g_mu);
  g_nlog = 0;
  g_nsinks = 0;
  pthread_mutex_unlock(&g_mu);
}

int mock_sinks(mock_sink *out, int cap) {
  pthread_mutex_lock(&g_mu);
  int n = g_nsinks < cap ? g_nsinks : cap;
  memcpy(out, g_sinks, (size_t)n * sizeof *out);
  pthread_mutex_unlock(&g_mu);
  return n;
}

static bool dev_broken(int d) {
  pthread_mutex_lock(&g_mu);
  bool b = d >= 0 && d < 16 && g_dev_fault[d];
  pthread_mutex_unlock(&g_mu);
  return b;
}

static void break_dev(int d) {
  pthread_mutex_lock(&g_mu);
  if (d >= 0 && d < 16)
    g_dev_fault[d] = true;
  pthread_mutex_unlock(&g_mu);
}

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop)
      pthread_cond_wait(&s->cv, &s->mu);
    if (!s->head)
      break;
    op *o = s->head;
    s->head = o->next;
    if (!s->head)
      s->tail = NULL;
    cudaError_t broken = s->fault;
    if (o->fault)
      s->fault = cudaErrorIllegalAddress;
    pthread_mutex_unlock(&s->mu);
    if (o->fault)
      break_dev(s->device);
    /* After a fault nothing more runs, host functions included (as CUDA
     * does after an error in the context), on any stream of the device. */
    if (!broken && !o->fault && dev_broken(s->device))
      broken = cudaErrorIllegalAddress;
    log_stamp(o->log, false);
    if ((!broken && !o->fault) || o->always)
      o->fn(o->arg);
    log_stamp(o->log, true);
    if (o->owns_arg)
      free(o->arg);
    free(o);
    pthread_mutex_lock(&s->mu);
    s->pending--;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

enum { OP_FAULT = 1, OP_ALWAYS = 2 };

static void enqueue_logged(cudaStream_t s, void (*fn)(void *), void *arg, bool owns, int flags,
                           int log) {
  op *o = calloc(1, sizeof *o);
  o->log = log;
  o->fn = fn;
  o->arg = arg;
  o->owns_arg = owns;
  o->fault = flags & OP_FAULT;
  o->always = flags & OP_ALWAYS;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  s->pending++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void enqueue(cudaStream_t s, void (*fn)(void *), void *arg, bool owns, int flags) {
  enqueue_logged(s, fn, arg, owns, flags, -1);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags) {
  (void)flags;
  struct CUstream_st *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_mutex_lock(&g_mu);
  s->device = g_current;
  pthread_mutex_unlock(&g_mu);
  pthread_create(&s->th, NULL, stream_main, s);
  pthread_mutex_lock(&g_mu);
  g_streams++;
  pthread_mutex_unlock(&g_mu);
  *ps = s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) /* the legacy stream's work ran when it was queued */
    return dev_broken(g_current & 15) ? fail(cudaErrorIllegalAddress) : cudaSuccess;
  pthread_mutex_lock(&s->mu);
  while (s->pending > 0)
    pthread_cond_wait(&s->cv, &s->mu);
  cudaError_t e = s->fault;
  pthread_mutex_unlock(&s->mu);
  if (!e && dev_broken(s->device))
    e = cudaErrorIllegalAddress;
  return e ? fail(e) : cudaSuccess;
}

/* race_query: the stream's work and host function run to their end while
 * the caller is inside this query, and the context is then poisoned. */
static bool race_this_query(cudaStream_t s) {
  pthread_mutex_lock(&g_mu);
  bool race = g_k.race_query > 0 && s->pending > 0;
  if (race) {
    g_k.race_query--;
    g_gate_open = true;
    pthread_cond_broadcast(&g_gate_cv);
  }
  pthread_mutex_unlock(&g_mu);
  if (!race)
    return false;
  pthread_mutex_lock(&s->mu);
  while (s->pending > 0)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  pthread_mutex_lock(&g_mu);
  g_poisoned = true;
  pthread_mutex_unlock(&g_mu);
  return true;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  race_this_query(s);
  pthread_mutex_lock(&g_mu);
  bool poisoned = g_poisoned;
  pthread_mutex_unlock(&g_mu);
  if (poisoned)
    return cudaErrorIllegalAddress;
  pthread_mutex_lock(&s->mu);
  cudaError_t e = s->fault ? s->fault : s->pending ? cudaErrorNotReady : cudaSuccess;
  pthread_mutex_unlock(&s->mu);
  return e == cudaSuccess || e == cudaErrorNotReady
             ? (dev_broken(s->device) ? cudaErrorIllegalAddress : e)
             : e;
}

/* ---- events: a count of records, and of those the streams have reached ---- */

struct CUevent_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  long recorded, reached;
};

typedef struct event_arg {
  cudaEvent_t e;
  long gen;
} event_arg;

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags) {
  (void)flags;
  struct CUevent_st *e = calloc(1, sizeof *e);
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  *pe = e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
  return cudaSuccess;
}

static void reach_op(void *arg) {
  event_arg *a = arg;
  pthread_mutex_lock(&a->e->mu);
  if (a->gen > a->e->reached)
    a->e->reached = a->gen;
  pthread_cond_broadcast(&a->e->cv);
  pthread_mutex_unlock(&a->e->mu);
}

/* Until the stream that records gen has reached it. */
static void wait_gen(cudaEvent_t e, long gen) {
  pthread_mutex_lock(&e->mu);
  while (e->reached < gen)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
}

static void wait_op(void *arg) {
  event_arg *a = arg;
  wait_gen(a->e, a->gen);
}

static event_arg *event_at(cudaEvent_t e, bool next) {
  event_arg *a = malloc(sizeof *a);
  pthread_mutex_lock(&e->mu);
  a->e = e;
  a->gen = next ? ++e->recorded : e->recorded;
  pthread_mutex_unlock(&e->mu);
  return a;
}

/* Both run after a fault too, so no stream waits forever on a dead one. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  enqueue(s, reach_op, event_at(e, true), true, OP_ALWAYS);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  enqueue(s, wait_op, event_at(e, false), true, OP_ALWAYS);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  event_arg *a = event_at(e, false);
  wait_gen(e, a->gen);
  free(a);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->th, NULL);
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
  pthread_mutex_lock(&g_mu);
  g_streams--;
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

typedef struct host_fn_arg {
  cudaHostFn_t fn;
  void *data;
} host_fn_arg;
static void run_host_fn(void *arg) {
  host_fn_arg *h = arg;
  h->fn(h->data);
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
  host_fn_arg *h = malloc(sizeof *h);
  h->fn = fn;
  h->data = data;
  enqueue(s, run_host_fn, h, true, 0);
  return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------------ */

/* Device blocks carry their size in a 64-byte header. */
static void *dev_alloc(size_t n) {
  unsigned char *p = aligned_alloc(64, 64 + ((n + 63) / 64) * 64);
  if (!p)
    return NULL;
  memcpy(p, &n, sizeof n);
  pthread_mutex_lock(&g_mu);
  g_dev_bytes += n;
  pthread_mutex_unlock(&g_mu);
  return p + 64;
}
static void dev_free(void *ptr) {
  if (!ptr)
    return;
  unsigned char *p = (unsigned char *)ptr - 64;
  size_t n;
  memcpy(&n, p, sizeof n);
  pthread_mutex_lock(&g_mu);
  g_dev_bytes -= n;
  pthread_mutex_unlock(&g_mu);
  free(p);
}

/* Synchronous here as cudaMalloc (the session pages' pool) is; the knobs'
 * failures count both. */
cudaError_t cudaMalloc(void **ptr, size_t size) {
  pthread_mutex_lock(&g_mu);
  bool oom = g_k.fail_alloc > 0 || g_dev_bytes + size > g_k.mem_total;
  if (g_k.fail_alloc > 0)
    g_k.fail_alloc--;
  pthread_mutex_unlock(&g_mu);
  if (oom)
    return fail(cudaErrorMemoryAllocation);
  *ptr = dev_alloc(size);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t s) {
  (void)pool;
  (void)s;
  return cudaMalloc(ptr, size);
}
cudaError_t cudaMemset(void *ptr, int value, size_t n) {
  memset(ptr, value, n);
  return cudaSuccess;
}

static void free_op(void *arg) { dev_free(arg); }
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t s) {
  enqueue(s, free_op, ptr, false, OP_ALWAYS);
  return cudaSuccess;
}
cudaError_t cudaFree(void *ptr) {
  dev_free(ptr);
  return cudaSuccess;
}

typedef struct copy_arg {
  void *dst;
  const void *src;
  size_t n;
} copy_arg;
static void copy_op(void *arg) {
  copy_arg *c = arg;
  memcpy(c->dst, c->src, c->n);
}
static int copy_kind(enum cudaMemcpyKind kind) {
  return kind == cudaMemcpyHostToDevice     ? MOCK_UPLOAD
         : kind == cudaMemcpyDeviceToHost   ? MOCK_DOWNLOAD
         : kind == cudaMemcpyDeviceToDevice ? MOCK_WITHIN
                                            : MOCK_OTHER;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  copy_arg *c = malloc(sizeof *c);
  *c = (copy_arg){dst, src, n};
  enqueue_logged(s, copy_op, c, true, 0, log_add(copy_kind(kind), s, dst, src, n));
  return cudaSuccess;
}

typedef struct copy2d_arg {
  unsigned char *dst;
  const unsigned char *src;
  size_t dpitch, spitch, width, height;
  int value; /* memset: the byte; -1: a copy */
} copy2d_arg;
static void copy2d_op(void *arg) {
  copy2d_arg *c = arg;
  for (size_t r = 0; r < c->height; r++)
    if (c->value < 0)
      memcpy(c->dst + r * c->dpitch, c->src + r * c->spitch, c->width);
    else
      memset(c->dst + r * c->dpitch, c->value, c->width);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidPitchValue);
  if (!s) /* the legacy stream: none of the engine's work is queued there */
    return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
  copy2d_arg *c = malloc(sizeof *c);
  *c = (copy2d_arg){dst, src, dpitch, spitch, width, height, -1};
  enqueue_logged(s, copy2d_op, c, true, 0, log_add(copy_kind(kind), s, dst, src, width * height));
  return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind) {
  if (width > dpitch || width > spitch)
    return fail(cudaErrorInvalidPitchValue);
  pthread_mutex_lock(&g_mu);
  bool broken = g_dev_fault[g_current & 15];
  bool refuse = kind == cudaMemcpyDeviceToDevice && g_k.fail_within > 0 && --g_k.fail_within == 0;
  pthread_mutex_unlock(&g_mu);
  if (broken)
    return fail(cudaErrorIllegalAddress);
  if (refuse)
    return fail(cudaErrorInvalidValue);
  int log = log_add(copy_kind(kind), NULL, dst, src, width * height);
  log_stamp(log, false);
  copy2d_op(&(copy2d_arg){dst, src, dpitch, spitch, width, height, -1});
  log_stamp(log, true);
  return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t s) {
  if (width > pitch)
    return fail(cudaErrorInvalidPitchValue);
  copy2d_arg *c = malloc(sizeof *c);
  *c = (copy2d_arg){dst, NULL, pitch, 0, width, height, value & 0xff};
  enqueue_logged(s, copy2d_op, c, true, 0, log_add(MOCK_MEMSET, s, dst, NULL, width * height));
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&g_mu);
  bool refuse = g_k.fail_pin > 0;
  if (refuse)
    g_k.fail_pin--;
  pthread_mutex_unlock(&g_mu);
  *p = refuse ? NULL : malloc(size);
  if (!*p)
    return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&g_mu);
  g_pinned++;
  for (int i = 0; i < MAX_PINNED; i++)
    if (!g_pins[i].p) {
      g_pins[i].p = *p, g_pins[i].n = size;
      break;
    }
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
  pthread_mutex_lock(&g_mu);
  g_pinned--;
  for (int i = 0; i < MAX_PINNED; i++)
    if (g_pins[i].p == p)
      g_pins[i].p = NULL;
  pthread_mutex_unlock(&g_mu);
  free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  pthread_mutex_lock(&g_mu);
  *total = g_k.mem_total;
  *fr = g_k.mem_total - g_dev_bytes;
  pthread_mutex_unlock(&g_mu);
  return cudaSuccess;
}

struct CUmemPoolHandle_st {
  int dummy;
};
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
  (void)props;
  *pool = calloc(1, sizeof **pool);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  (void)pool;
  (void)attr;
  (void)value;
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  free(pool);
  return cudaSuccess;
}

/* ---- devices and errors ------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n) {
  pthread_mutex_lock(&g_mu);
  *n = g_k.devices;
  pthread_mutex_unlock(&g_mu);
  return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int d) {
  pthread_mutex_lock(&g_mu);
  bool ok = d >= 0 && d < g_k.devices;
  if (ok)
    g_current = d;
  pthread_mutex_unlock(&g_mu);
  return ok ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d) {
  memset(prop, 0, sizeof *prop);
  pthread_mutex_lock(&g_mu);
  snprintf(prop->name, sizeof prop->name, "Mock GPU %d", d);
  prop->major = g_k.major;
  prop->minor = 0;
  prop->totalGlobalMem = g_k.mem_total;
  pthread_mutex_unlock(&g_mu);
  /* Few multiprocessors, so decode-like shapes take the split-KV path. */
  prop->multiProcessorCount = 4;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  pthread_mutex_lock(&g_mu);
  cudaError_t e = g_last;
  g_last = cudaSuccess;
  pthread_mutex_unlock(&g_mu);
  return e;
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  default: return "mock error";
  }
}
const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  default: return "cudaErrorMock";
  }
}

/* ---- the kernels ---------------------------------------------------------------- */

int attn_cu_prepare(void) { return 0; }

typedef struct scan_arg {
  const void *x;
  attn_dtype dt;
  size_t n;
  attn_cu_scan_result *res;
} scan_arg;
static void scan_op(void *arg) {
  scan_arg *a = arg;
  for (size_t i = 0; i < a->n; i++) {
    double v = attn_load_elem(a->x, a->dt, i);
    if (!isfinite(v)) {
      if (i < a->res->first_bad)
        a->res->first_bad = i;
      continue;
    }
    float f = (float)fabs(v);
    unsigned bits;
    memcpy(&bits, &f, sizeof bits);
    if (bits > a->res->maxabs_bits)
      a->res->maxabs_bits = bits;
  }
}
int attn_cu_scan(const void *x, attn_dtype dt, size_t n, attn_cu_scan_result *res, void *stream) {
  scan_arg *a = malloc(sizeof *a);
  *a = (scan_arg){x, dt, n, res};
  enqueue((cudaStream_t)stream, scan_op, a, true, 0);
  return 0;
}

typedef struct put_arg {
  const unsigned char *src;
  const long long *dst;
  unsigned char *base;
  size_t rows, row_bytes;
} put_arg;

static void kernel_gate(void);

/* The new rows to their page rows, as attn_cu_put_rows; a row whose
 * addresses break its 16-byte contract is not written (the reads then
 * find it wrong). Held by hold_kernels as a kernel is. */
static void put_op(void *arg) {
  const put_arg *a = arg;
  kernel_gate();
  for (size_t i = 0; i < a->rows; i++) {
    unsigned char *to = a->base + a->dst[i];
    const unsigned char *from = a->src + i * a->row_bytes;
    if (((uintptr_t)to | (uintptr_t)from | a->row_bytes) % 16 == 0)
      memcpy(to, from, a->row_bytes);
  }
}
int attn_cu_put_rows(const void *src, const long long *dst, unsigned char *base, size_t rows,
                     size_t row_bytes, void *stream) {
  if (rows == 0)
    return 0;
  put_arg *a = malloc(sizeof *a);
  *a = (put_arg){src, dst, base, rows, row_bytes};
  enqueue_logged((cudaStream_t)stream, put_op, a, true, 0,
                 log_add(MOCK_OTHER, stream, base, src, rows * row_bytes));
  return 0;
}

typedef struct fwd_arg {
  attn_cu_params p;
  attn_cu_choice c;
  float bias; /* added to every output: a deliberately wrong kernel */
} fwd_arg;

/* hold_kernels: a kernel waits until a racing query opens the gate. */
static void kernel_gate(void) {
  pthread_mutex_lock(&g_mu);
  while (g_k.hold_kernels && !g_gate_open)
    pthread_cond_wait(&g_gate_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

/* softcap and ALiBi on a visible score s of row (b·Hq + h)·Nq + i, in
 * float64 from the launch's log2-unit parameters; *dcap gets the factor
 * 1 − tanh² the backward scales dS by. */
static double variant(const attn_cu_params *p, size_t qrow, int64_t i, int64_t j, int64_t off,
                      double s, double *dcap) {
  const double cap = (double)p->cap2 * M_LN2;
  *dcap = 1;
  if (cap > 0) {
    double t = tanh(s / cap);
    s = cap * t;
    *dcap = 1 - t * t;
  }
  if (p->alibi2)
    s += (double)p->alibi2[qrow / (size_t)p->seq_q] * M_LN2 * fabs((double)(i + off - j));
  return s;
}

/* Whether a forward choice's blocks hold every (head, query) row once:
 * grid[1] blocks of pack heads each (pack 1, or a tensor-core instance's
 * whole GQA group) and grid[0] tiles of block_m rows over their rows. */
static bool grid_covers(const attn_cu_params *p, const attn_cu_choice *c) {
  if (c->kernel >= ATTN_CU_HOPPER_D64 && c->kernel <= ATTN_CU_HOPPER_D256) /* a persistent grid */
    return c->pack == 1;
  int pack = c->pack, group = p->heads_q / p->heads_kv;
  if (pack != 1 && (pack != group || c->kernel == ATTN_CU_SIMT_F32))
    return false;
  return (int64_t)c->grid[1] * pack == p->heads_q &&
         (int64_t)c->grid[0] * c->block_m >= (int64_t)pack * p->seq_q &&
         (int64_t)(c->grid[0] - 1) * c->block_m < (int64_t)pack * p->seq_q;
}

/* Element d of key j of K or V (packed x, or paged by table) of K/V head
 * kh = b·Hkv + hk, by kernels.h's rule for the paged view: row j %
 * page_tokens of page table[kh·pages_per_head + j / page_tokens]. */
static double kv_elem(const attn_cu_params *p, const void *x, const int32_t *table, size_t kh,
                      int64_t j, int64_t d) {
  if (!table)
    return attn_load_elem(x, p->dtype,
                          (kh * (size_t)p->seq_kv + (size_t)j) * (size_t)p->dp + (size_t)d);
  const int32_t page = table[kh * (size_t)p->pages_per_head + (size_t)(j / p->page_tokens)];
  const unsigned char *base = p->page_base + (size_t)page * p->page_bytes;
  return attn_load_elem(base, p->dtype, (size_t)(j % p->page_tokens) * (size_t)p->dp + (size_t)d);
}

/* Batch entry b's keys and mask offset: with seqused_k (kernels.h), its
 * own count, clamped to [0, seq_kv] as the kernels clamp it, and the
 * bottom-right diagonal count - seq_q; else the launch's. */
static int64_t entry_keys(const attn_cu_params *p, int64_t b, int64_t *off) {
  if (!p->seqused_k) {
    *off = p->off;
    return p->seq_kv;
  }
  int64_t n = p->seqused_k[b];
  n = n < 0 ? 0 : n > p->seq_kv ? p->seq_kv : n;
  *off = n - p->seq_q;
  return n;
}

/* Attention on the packed layout (or K and V paged), in float64, from
 * docs/design.md's rule; with seqused_k, entry b over its own keys. */
static void fwd_op(void *arg) {
  const attn_cu_params *p = &((fwd_arg *)arg)->p;
  const attn_cu_choice *c = &((fwd_arg *)arg)->c;
  const float bias = ((fwd_arg *)arg)->bias;
  const int64_t B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, Nq = p->seq_q, Nmax = p->seq_kv,
                D = p->head_dim, dp = p->dp;
  kernel_gate();
  const int64_t wl = p->window_left, wr = p->window_right;
  const double scale = (double)p->scale_log2 * M_LN2;
  /* What the real kernels rely on; a broken contract poisons the output. */
  bool contract =
      ((uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->o) % 16 == 0 &&
      (c->nsplit == 1 || (p->split_ws && (uintptr_t)p->split_ws % 16 == 0)) && grid_covers(p, c);
  double *s = malloc((size_t)(Nmax > 0 ? Nmax : 1) * sizeof *s);
  for (int64_t b = 0; b < B; b++) {
    int64_t off;
    const int64_t Nk = entry_keys(p, b, &off);
    for (int64_t h = 0; h < Hq; h++) {
      int64_t hk = h / (Hq / Hkv);
      size_t qb = (size_t)((b * Hq + h) * Nq), kh = (size_t)(b * Hkv + hk);
      for (int64_t i = 0; i < Nq; i++) {
        double m = -INFINITY;
        for (int64_t j = 0; j < Nk; j++) {
          bool vis = (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
          double acc = 0;
          for (int64_t d = 0; vis && d < D; d++)
            acc += attn_load_elem(p->q, p->dtype, (qb + (size_t)i) * (size_t)dp + (size_t)d) *
                   kv_elem(p, p->k, p->k_table, kh, j, d);
          double g;
          s[j] = vis ? variant(p, qb + (size_t)i, i, j, off, acc * scale, &g) : -INFINITY;
          m = s[j] > m ? s[j] : m;
        }
        double l = 0;
        for (int64_t j = 0; j < Nk && m > -INFINITY; j++)
          l += exp(s[j] - m);
        size_t row = qb + (size_t)i;
        for (int64_t d = 0; d < dp; d++) {
          double acc = 0;
          for (int64_t j = 0; j < Nk && l > 0; j++)
            if (s[j] > -INFINITY)
              acc += exp(s[j] - m) * kv_elem(p, p->v, p->v_table, kh, j, d);
          attn_store_elem(p->o, p->dtype, row * (size_t)dp + (size_t)d,
                          contract ? (float)(l > 0 ? acc / l : 0) + bias : NAN);
        }
        if (p->m)
          p->m[row] = l > 0 ? (float)m : -INFINITY;
        if (p->l)
          p->l[row] = (float)l;
        if (p->lse)
          p->lse[row] = l > 0 ? (float)(m + log(l)) : -INFINITY;
      }
    }
  }
  free(s);
}

/* Whether the packed pointers the kernels take are 16-byte aligned. */
static bool aligned16(const void *const *ptrs, int n) {
  uintptr_t x = 0;
  for (int i = 0; i < n; i++)
    x |= (uintptr_t)ptrs[i];
  return x % 16 == 0;
}

/* One (batch, query head, row)'s contribution to the backward, in float64
 * by the definition: P from the device's lse, D = rowsum(dO∘O) from the
 * device's O (as the kernels do), dS = P∘(dP − D); dq gets its row, dk and
 * dv (float64 accumulators of the KV head) the row's terms. */
static void bwd_row(const attn_cu_params *p, size_t qrow, size_t kb, int64_t i, double *dq,
                    double *dk, double *dv) {
  const int64_t Nk = p->seq_kv, D = p->head_dim, dp = p->dp, off = p->off;
  const int64_t wl = p->window_left, wr = p->window_right;
  const double scale = p->scale, lse = p->lse[qrow];
  double delta = 0;
  for (int64_t d = 0; d < D; d++)
    delta += attn_load_elem(p->o, p->dtype, qrow * (size_t)dp + (size_t)d) *
             attn_load_elem(p->dout, p->dtype, qrow * (size_t)dp + (size_t)d);
  for (int64_t j = 0; j < Nk; j++) {
    bool vis = (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
    if (!vis || lse == -INFINITY)
      continue;
    size_t kr = (kb + (size_t)j) * (size_t)dp;
    double s = 0, dpv = 0;
    for (int64_t d = 0; d < D; d++) {
      s += attn_load_elem(p->q, p->dtype, qrow * (size_t)dp + (size_t)d) *
           attn_load_elem(p->k, p->dtype, kr + (size_t)d);
      dpv += attn_load_elem(p->dout, p->dtype, qrow * (size_t)dp + (size_t)d) *
             attn_load_elem(p->v, p->dtype, kr + (size_t)d);
    }
    double g, x = variant(p, qrow, i, j, off, scale * s, &g);
    double P = exp(x - lse), ds = P * (dpv - delta) * g;
    for (int64_t d = 0; d < D; d++) {
      dq[d] += scale * ds * attn_load_elem(p->k, p->dtype, kr + (size_t)d);
      dk[j * D + d] += scale * ds * attn_load_elem(p->q, p->dtype, qrow * (size_t)dp + (size_t)d);
      dv[j * D + d] += P * attn_load_elem(p->dout, p->dtype, qrow * (size_t)dp + (size_t)d);
    }
  }
}

/* Rows [0, n) of D doubles into a packed tensor of dp columns (padding
 * zero); NaN everywhere when the launch broke the kernels' contract. */
static void store_rows(void *dst, attn_dtype dt, size_t row0, int64_t n, int64_t D, int64_t dp,
                       const double *x, bool ok, float bias) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < dp; d++)
      attn_store_elem(dst, dt, (row0 + (size_t)r) * (size_t)dp + (size_t)d,
                      !ok     ? NAN
                      : d < D ? (float)x[r * D + d] + bias
                              : 0.0f);
}

static void bwd_op(void *arg) {
  const attn_cu_params *p = &((fwd_arg *)arg)->p;
  const attn_cu_choice *c = &((fwd_arg *)arg)->c;
  const float bias = ((fwd_arg *)arg)->bias;
  const int64_t B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, Nq = p->seq_q, Nk = p->seq_kv,
                D = p->head_dim;
  kernel_gate();
  const void *ptrs[] = {p->q, p->k, p->v, p->o, p->dout, p->dq, p->dk, p->dv, p->lse, p->bwd_ws};
  /* the atomic choice (no dQ grid) only with the scratch the params size for it */
  bool ok = aligned16(ptrs, 10) && p->lse && p->bwd_ws && c->nsplit == 1 &&
            c->kernel >= ATTN_CU_BWD_MMA_D64 && attn_cu_is_atomic_dq(c) == (p->bwd_atomic_dq != 0);
  double *dk = malloc((size_t)(2 * Nk * D + D) * sizeof *dk), *dv = dk + Nk * D, *dq = dv + Nk * D;
  for (int64_t b = 0; b < B; b++)
    for (int64_t hk = 0; hk < Hkv; hk++) {
      size_t kb = (size_t)((b * Hkv + hk) * Nk);
      memset(dk, 0, (size_t)(2 * Nk * D) * sizeof *dk);
      for (int64_t h = hk * (Hq / Hkv); h < (hk + 1) * (Hq / Hkv); h++)
        for (int64_t i = 0; i < Nq; i++) {
          size_t qrow = (size_t)((b * Hq + h) * Nq + i);
          memset(dq, 0, (size_t)D * sizeof *dq);
          bwd_row(p, qrow, kb, i, dq, dk, dv);
          store_rows(p->dq, p->dtype, qrow, 1, D, p->dp, dq, ok, bias);
        }
      store_rows(p->dk, p->dtype, kb, Nk, D, p->dp, dk, ok, bias);
      store_rows(p->dv, p->dtype, kb, Nk, D, p->dp, dv, ok, bias);
    }
  free(dk);
}

int attn_cu_launch(const attn_cu_params *p, const attn_cu_choice *c, void *stream) {
  pthread_mutex_lock(&g_mu);
  g_launches++;
  bool launch_fails = g_k.fail_launch > 0, faults = !launch_fails && g_k.fault_stream > 0;
  if (launch_fails)
    g_k.fail_launch--;
  if (faults)
    g_k.fault_stream--;
  cudaError_t launch_error =
      g_k.launch_error ? (cudaError_t)g_k.launch_error : cudaErrorLaunchFailure;
  /* the decode kernel packs and merges its splits in its own code */
  const bool dec = attn_cu_is_decode(c->kernel);
  bool wrong = g_k.wrong_kernel == (int)c->kernel + 1 ||
               (g_k.wrong_merge && c->nsplit > 1 && !dec) ||
               (g_k.wrong_pack && c->pack > 1 && !dec) || (g_k.wrong_paged && p->k_table) ||
               (g_k.wrong_atomic_dq && p->pass == ATTN_BACKWARD && attn_cu_is_atomic_dq(c));
  if (p->pass == ATTN_BACKWARD) {
    g_last_atomic = attn_cu_is_atomic_dq(c);
    g_last_bytes = g_dev_bytes;
  }
  g_last_kernel = (int)c->kernel;
  g_last_nsplit = c->nsplit;
  g_last_pack = c->pack;
  if ((unsigned)c->kernel < ATTN_CU_KERNEL_COUNT && c->nsplit == 1 && c->pack == 1) {
    g_plain[c->kernel]++;
    g_plain_multi[c->kernel] += c->grid[0] > 1;
  }
  pthread_mutex_unlock(&g_mu);
  if (launch_fails)
    return (int)fail(launch_error);
  if (!attn_cu_launch_ok(p, c)) /* as the real entry point does */
    return (int)fail(cudaErrorInvalidValue);
  fwd_arg *a = malloc(sizeof *a);
  a->p = *p;
  a->c = *c;
  a->bias = wrong ? 0.25f : 0.0f;
  enqueue_logged((cudaStream_t)stream, p->pass == ATTN_BACKWARD ? bwd_op : fwd_op, a, true,
                 faults ? OP_FAULT : 0, log_add(MOCK_KERNEL, stream, p->o, p->q, 0));
  return 0;
}

/* ---- the sinks (sinks.h), by the contract in float64 ------------------------- */

typedef struct sink_arg {
  attn_cu_params p;
  const float *sinks;
  float *dsinks;
  float bias; /* added to O or dsinks: a deliberately wrong kernel */
} sink_arg;

/* Each row's lse' = ln(e^lse + e^t), O scaled by e^(lse − lse'), m' =
 * max(m, t), l' = l e^(m − m') + e^(t − m'): the sink as one more key. */
static void fold_op(void *arg) {
  const sink_arg *a = arg;
  const attn_cu_params *p = &a->p;
  kernel_gate();
  const size_t rows = (size_t)p->batch * p->heads_q * p->seq_q;
  for (size_t r = 0; r < rows; r++) {
    const double t = a->sinks[r / (size_t)p->seq_q % (size_t)p->heads_q], lse = p->lse[r];
    const double lse2 = lse == -INFINITY ? t : fmax(lse, t) + log1p(exp(-fabs(lse - t)));
    for (int d = 0; p->o && d < p->dp; d++) {
      const size_t at = r * (size_t)p->dp + (size_t)d;
      const double o = attn_load_elem(p->o, p->dtype, at);
      attn_store_elem(p->o, p->dtype, at,
                      (float)(lse == -INFINITY ? 0 : o * exp(lse - lse2)) + a->bias);
    }
    if (p->l) { /* l' is relative to m': without m, a broken contract */
      const double m = p->m ? p->m[r] : NAN, l = p->l[r], m2 = fmax(m, t);
      p->l[r] = (float)((l > 0 ? l * exp(m - m2) : 0) + exp(t - m2));
    }
    if (p->m)
      p->m[r] = (float)fmax(p->m[r], t);
    p->lse[r] = (float)lse2;
  }
}

/* dsinks[h] = −Σ e^(t − lseᵢ)·(dOᵢ·Oᵢ) over the head's rows, D from the
 * device's O and dO. */
static void grad_op(void *arg) {
  const sink_arg *a = arg;
  const attn_cu_params *p = &a->p;
  kernel_gate();
  for (int h = 0; h < p->heads_q; h++) {
    double sum = 0;
    for (int b = 0; b < p->batch; b++)
      for (int i = 0; i < p->seq_q; i++) {
        const size_t r = ((size_t)b * p->heads_q + h) * p->seq_q + i;
        double dsum = 0;
        for (int d = 0; d < p->head_dim; d++)
          dsum += attn_load_elem(p->o, p->dtype, r * (size_t)p->dp + (size_t)d) *
                  attn_load_elem(p->dout, p->dtype, r * (size_t)p->dp + (size_t)d);
        if (dsum != 0)
          sum += exp((double)a->sinks[h] - p->lse[r]) * dsum;
      }
    a->dsinks[h] = (float)-sum + a->bias;
  }
}

static int sink_launch(const attn_cu_params *p, const float *sinks, float *dsinks, void *stream) {
  sink_arg *a = malloc(sizeof *a);
  *a = (sink_arg){*p, sinks, dsinks, 0.0f};
  int i = log_add(MOCK_SINKS, stream, dsinks ? (void *)dsinks : (void *)p->lse, sinks, 0);
  pthread_mutex_lock(&g_mu);
  a->bias = g_k.wrong_sinks ? 0.25f : 0.0f;
  if (g_nsinks < MOCK_SINKS_MAX)
    g_sinks[g_nsinks++] = (mock_sink){dsinks != NULL, i,        stream,       sinks,
                                      p->lse,         dsinks,   p->o != NULL, p->m != NULL,
                                      p->l != NULL,   p->batch, p->heads_q,   p->seq_q,
                                      (int)p->dtype};
  pthread_mutex_unlock(&g_mu);
  enqueue_logged((cudaStream_t)stream, dsinks ? grad_op : fold_op, a, true, 0, i);
  return 0;
}

int attn_cu_sink_fold(const attn_cu_params *p, const float *sinks, void *stream) {
  if (!p->lse || !sinks || (p->l && !p->m))
    return (int)fail(cudaErrorInvalidValue);
  return sink_launch(p, sinks, NULL, stream);
}

int attn_cu_sink_grad(const attn_cu_params *p, const float *sinks, float *dsinks, void *stream) {
  if (!p->lse || !p->bwd_ws || !sinks || !dsinks)
    return (int)fail(cudaErrorInvalidValue);
  return sink_launch(p, sinks, dsinks, stream);
}
