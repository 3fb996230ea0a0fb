// sinks.cu — the entry points of sinks.h: the sinks folded into a forward
// launch's outputs, and their gradient after a backward launch.
#include "common.cuh"
#include "sinks.h"

namespace {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// One warp per row: every lane reads the row's statistics (so no shuffle
// is needed), the lanes rescale its columns, lane 0 writes the statistics
// back once all have read them.
template <typename T>
__global__ void __launch_bounds__(256) sink_fold_rows(const attn_cu_params p, const float *sinks) {
  const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q;
  const int lane = threadIdx.x % 32;
  T *o = (T *)p.o;
  for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < nrows;
       row += (size_t)gridDim.x * blockDim.x / 32) {
    const float t = sinks[row / (size_t)p.seq_q % (size_t)p.heads_q];
    const attn_cu_sink_stats s =
        attn_cu_sink_row(t, p.m ? p.m[row] : -INFINITY, p.l ? p.l[row] : 0.0f, p.lse[row]);
    __syncwarp();
    if (o)
      for (int d = lane; d < p.dp; d += 32)
        o[row * p.dp + d] = T(to_f(o[row * p.dp + d]) * s.o_scale);
    if (lane == 0) {
      if (p.m)
        p.m[row] = s.m;
      if (p.l)
        p.l[row] = s.l;
      p.lse[row] = s.lse;
    }
  }
}

constexpr int GRAD_THREADS = 256;

// One block per query head: each thread sums its rows (the same ones on
// every run), then a fixed tree adds the threads' sums.
__global__ void __launch_bounds__(GRAD_THREADS)
    sink_grad_heads(const attn_cu_params p, const float *sinks, float *dsinks) {
  __shared__ double part[GRAD_THREADS];
  const int h = blockIdx.x;
  const float t = sinks[h], *dsum = p.bwd_ws; // D = dO·O, [B, Hq, Nq]
  double acc = 0.0;
  for (int b = 0; b < p.batch; b++) {
    const size_t row0 = ((size_t)b * p.heads_q + h) * p.seq_q;
    for (int i = threadIdx.x; i < p.seq_q; i += GRAD_THREADS) {
      const float d = dsum[row0 + i];
      if (d != 0.0f)
        acc += (double)expf(t - p.lse[row0 + i]) * d;
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = GRAD_THREADS / 2; w > 0; w /= 2) {
    if (threadIdx.x < w)
      part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    dsinks[h] = (float)(0.0 - part[0]);
}

template <typename T>
cudaError_t launch_fold(const attn_cu_params &p, const float *sinks, cudaStream_t s) {
  const size_t rows = (size_t)p.batch * p.heads_q * p.seq_q, blocks = (rows + 7) / 8;
  sink_fold_rows<T><<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(p, sinks);
  return cudaGetLastError();
}

} // namespace

extern "C" int attn_cu_sink_fold(const attn_cu_params *p, const float *sinks, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if (!p->lse || !sinks || (p->l && !p->m))
    return (int)cudaErrorInvalidValue;
  if ((size_t)p->batch * p->heads_q * p->seq_q == 0)
    return 0;
  switch (p->dtype) {
  case ATTN_F16: return (int)launch_fold<__half>(*p, sinks, s);
  case ATTN_BF16: return (int)launch_fold<__nv_bfloat16>(*p, sinks, s);
  default: return (int)launch_fold<float>(*p, sinks, s);
  }
}

extern "C" int attn_cu_sink_grad(const attn_cu_params *p, const float *sinks, float *dsinks,
                                 void *stream) {
  if (!p->lse || !p->bwd_ws || !sinks || !dsinks)
    return (int)cudaErrorInvalidValue;
  if (p->heads_q <= 0)
    return 0;
  sink_grad_heads<<<(unsigned)p->heads_q, GRAD_THREADS, 0, (cudaStream_t)stream>>>(*p, sinks,
                                                                                   dsinks);
  return (int)cudaGetLastError();
}
