// launch.cu — the C entry points of kernels.h: dispatch to the chosen
// forward kernel, the split-KV merge, the backward's preprocess and
// kernels, and the input scan.
#include "common.cuh"

using namespace attn_cu;

namespace {

// One block per output row: every split's (m, l) is merged by lse, then
// each thread combines its columns of the splits' normalized outputs.
template <typename T>
__global__ void __launch_bounds__(128) merge_splits(const attn_cu_params p, int nsplit) {
  const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q, row = blockIdx.x;
  const float *po = (const float *)p.split_ws;
  const float *pml = po + (size_t)nsplit * nrows * p.dp;
  float m2, l;
  attn_cu_merge(pml + 2 * row, (long)nrows, nsplit, &m2, &l);
  // The statistics first: after the loop, sm_90's ptxas spills 12 bytes
  // for the F16 and BF16 instances.
  if (threadIdx.x == 0) {
    float m, lse;
    attn_cu_stats(m2, l, &m, &lse);
    if (p.m)
      p.m[row] = m;
    if (p.l)
      p.l[row] = l;
    if (p.lse)
      p.lse[row] = lse;
  }
  for (int d = threadIdx.x; d < p.dp; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < nsplit; s++) {
      const float *ml = pml + 2 * ((size_t)s * nrows + row);
      float w = attn_cu_merge_weight(ml[0], ml[1], m2, l);
      if (w > 0.0f)
        acc += w * po[((size_t)s * nrows + row) * p.dp + d];
    }
    ((T *)p.o)[row * p.dp + d] = T(acc);
  }
}

template <typename T> __device__ __forceinline__ float widen(T x) { return (float)x; }
template <> __device__ __forceinline__ float widen<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// Largest finite magnitude and first non-finite index; one atomic of each
// kind per warp.
template <typename T>
__global__ void __launch_bounds__(256) scan(const T *x, size_t n, attn_cu_scan_result *res) {
  float mx = 0.0f;
  unsigned long long bad = ~0ull;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = widen<T>(x[i]);
    if (isfinite(v))
      mx = fmaxf(mx, fabsf(v));
    else if (i < bad)
      bad = i;
  }
  for (int o = 16; o > 0; o /= 2) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    unsigned long long ob = __shfl_xor_sync(0xffffffffu, bad, o);
    bad = ob < bad ? ob : bad;
  }
  if (threadIdx.x % 32 == 0) {
    atomicMax(&res->maxabs_bits, __float_as_uint(mx)); // non-negative floats order as ints
    if (bad != ~0ull)
      atomicMin(&res->first_bad, bad);
  }
}

// The backward's preprocess, one warp per query row: D = rowsum(dO∘O) in
// F32, and lse in log2 units, +inf for a row with no visible key (lse
// -inf), so that every weight exp2(s - lse2) of such a row is 0. On the
// atomic path it also zeroes the row of the F32 dQ accumulator, which saves
// a memset launch: the row is in hand here.
template <typename T>
__global__ void __launch_bounds__(256) bwd_prep(const attn_cu_params p, bool atomic) {
  const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q;
  const int lane = threadIdx.x % 32;
  const T *o = (const T *)p.o, *dout = (const T *)p.dout;
  for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < nrows;
       row += (size_t)gridDim.x * blockDim.x / 32) {
    float acc = 0.0f;
    for (int d = lane; d < p.dp; d += 32)
      acc += widen<T>(o[row * p.dp + d]) * widen<T>(dout[row * p.dp + d]);
    for (int x = 16; x > 0; x /= 2)
      acc += __shfl_xor_sync(0xffffffffu, acc, x);
    if (atomic) {
      float4 *acc = reinterpret_cast<float4 *>(p.bwd_ws + attn_cu_bwd_dq_at(nrows) + row * p.dp);
      for (int d = lane; d < p.dp / 4; d += 32)
        acc[d] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (lane == 0) {
      const float lse = p.lse[row];
      p.bwd_ws[row] = acc;
      p.bwd_ws[nrows + row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
  }
}

// The atomic path's last step: dQ = scale · the F32 accumulator, in the
// input dtype, four elements per thread (dp is a multiple of 8); columns
// past head_dim come out 0 whatever the accumulator holds.
template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert(const attn_cu_params p) {
  const size_t nrows = (size_t)p.batch * p.heads_q * p.seq_q, n4 = nrows * p.dp / 4;
  const float4 *acc = reinterpret_cast<const float4 *>(p.bwd_ws + attn_cu_bwd_dq_at(nrows));
  T *dq = (T *)p.dq;
  for (size_t x = (size_t)blockIdx.x * blockDim.x + threadIdx.x; x < n4;
       x += (size_t)gridDim.x * blockDim.x) {
    const float4 a = acc[x];
    const int d = (int)(x * 4 % (size_t)p.dp);
    const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; k++)
      dq[x * 4 + k] = T(d + k < p.head_dim ? v[k] * p.scale : 0.0f);
  }
}

template <typename T>
cudaError_t launch_prep(const attn_cu_params &p, bool atomic, cudaStream_t s) {
  size_t rows = (size_t)p.batch * p.heads_q * p.seq_q, blocks = (rows + 7) / 8;
  bwd_prep<T><<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(p, atomic);
  return cudaGetLastError();
}

template <typename T> cudaError_t launch_convert(const attn_cu_params &p, cudaStream_t s) {
  size_t n4 = (size_t)p.batch * p.heads_q * p.seq_q * p.dp / 4, blocks = (n4 + 255) / 256;
  bwd_dq_convert<T><<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_bwd_kernels(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  switch (c.kernel) {
  case ATTN_CU_BWD_MMA_D64: return launch_bwd_d64(p, c, s);
  case ATTN_CU_BWD_MMA_D128: return launch_bwd_d128(p, c, s);
  case ATTN_CU_BWD_MMA_D256: return launch_bwd_d256(p, c, s);
  case ATTN_CU_BWD_SIMT_F32: return launch_bwd_f32(p, c, s);
  default: return cudaErrorInvalidValue;
  }
}

// The preprocess, the kernels of the choice, and on the atomic path (a
// choice without a dQ grid, kernels.h) the conversion of dQ.
cudaError_t launch_backward(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  const bool atomic = attn_cu_is_atomic_dq(&c);
  cudaError_t e;
  switch (p.dtype) {
  case ATTN_F16: e = launch_prep<__half>(p, atomic, s); break;
  case ATTN_BF16: e = launch_prep<__nv_bfloat16>(p, atomic, s); break;
  default: e = launch_prep<float>(p, atomic, s); break;
  }
  if (e == cudaSuccess)
    e = launch_bwd_kernels(p, c, s);
  if (e != cudaSuccess || !atomic)
    return e;
  switch (p.dtype) {
  case ATTN_F16: return launch_convert<__half>(p, s);
  case ATTN_BF16: return launch_convert<__nv_bfloat16>(p, s);
  default: return launch_convert<float>(p, s);
  }
}

template <typename T>
cudaError_t launch_merge(const attn_cu_params &p, int nsplit, cudaStream_t s) {
  size_t rows = (size_t)p.batch * p.heads_q * p.seq_q;
  merge_splits<T><<<(unsigned)rows, 128, 0, s>>>(p, nsplit);
  return cudaGetLastError();
}

} // namespace

extern "C" int attn_cu_prepare(void) {
  cudaError_t e = prepare_mma_d64();
  if (e == cudaSuccess)
    e = prepare_mma_d96();
  if (e == cudaSuccess)
    e = prepare_mma_d128();
  if (e == cudaSuccess)
    e = prepare_mma_d160();
  if (e == cudaSuccess)
    e = prepare_mma_d192();
  if (e == cudaSuccess)
    e = prepare_mma_d256();
  if (e == cudaSuccess)
    e = prepare_simt_f32();
  if (e == cudaSuccess)
    e = prepare_bwd_d64();
  if (e == cudaSuccess)
    e = prepare_bwd_d128();
  if (e == cudaSuccess)
    e = prepare_bwd_d256();
  if (e == cudaSuccess)
    e = prepare_bwd_f32();
  if (e == cudaSuccess)
    e = prepare_decode_d64();
  if (e == cudaSuccess)
    e = prepare_decode_d128();
  if (e == cudaSuccess)
    e = prepare_decode_d256();
  return (int)e;
}

extern "C" int attn_cu_launch(const attn_cu_params *p, const attn_cu_choice *c, void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if (!attn_cu_launch_ok(p, c)) // refused here, the context stays usable
    return (int)cudaErrorInvalidValue;
  if (p->pass == ATTN_BACKWARD)
    return (int)launch_backward(*p, *c, s);
  cudaError_t e;
  switch (c->kernel) {
  case ATTN_CU_MMA_D64: e = launch_mma_d64(*p, *c, s); break;
  case ATTN_CU_MMA_D96: e = launch_mma_d96(*p, *c, s); break;
  case ATTN_CU_MMA_D128: e = launch_mma_d128(*p, *c, s); break;
  case ATTN_CU_MMA_D160: e = launch_mma_d160(*p, *c, s); break;
  case ATTN_CU_MMA_D192: e = launch_mma_d192(*p, *c, s); break;
  case ATTN_CU_MMA_D256: e = launch_mma_d256(*p, *c, s); break;
  case ATTN_CU_SIMT_F32: e = launch_simt_f32(*p, *c, s); break;
  case ATTN_CU_HOPPER_D64: return (int)launch_hopper_d64(*p, *c, s);
  case ATTN_CU_HOPPER_D96: return (int)launch_hopper_d96(*p, *c, s);
  case ATTN_CU_HOPPER_D128: return (int)launch_hopper_d128(*p, *c, s);
  case ATTN_CU_HOPPER_D192: return (int)launch_hopper_d192(*p, *c, s);
  case ATTN_CU_HOPPER_D256: return (int)launch_hopper_d256(*p, *c, s);
  // The decode kernel merges its own splits (its last block per KV head).
  case ATTN_CU_DECODE_D64: return (int)launch_decode_d64(*p, *c, s);
  case ATTN_CU_DECODE_D128: return (int)launch_decode_d128(*p, *c, s);
  case ATTN_CU_DECODE_D256: return (int)launch_decode_d256(*p, *c, s);
  default: return (int)cudaErrorInvalidValue;
  }
  if (e != cudaSuccess || c->nsplit <= 1)
    return (int)e;
  switch (p->dtype) {
  case ATTN_F16: return (int)launch_merge<__half>(*p, c->nsplit, s);
  case ATTN_BF16: return (int)launch_merge<__nv_bfloat16>(*p, c->nsplit, s);
  default: return (int)launch_merge<float>(*p, c->nsplit, s);
  }
}

extern "C" int attn_cu_scan(const void *x, attn_dtype dt, size_t n, attn_cu_scan_result *res,
                            void *stream) {
  cudaStream_t s = (cudaStream_t)stream;
  size_t blocks = (n + 255) / 256;
  unsigned grid = (unsigned)(blocks < 4096 ? (blocks ? blocks : 1) : 4096);
  switch (dt) {
  case ATTN_F16: scan<__half><<<grid, 256, 0, s>>>((const __half *)x, n, res); break;
  case ATTN_BF16: scan<__nv_bfloat16><<<grid, 256, 0, s>>>((const __nv_bfloat16 *)x, n, res); break;
  default: scan<float><<<grid, 256, 0, s>>>((const float *)x, n, res); break;
  }
  return (int)cudaGetLastError();
}

// A paged job's new rows to their page rows: one 16-byte vector a thread,
// rows of row_vecs vectors each (a decode step's few rows: one or two
// blocks).
__global__ void __launch_bounds__(256)
    put_rows(const uint4 *src, const long long *dst, unsigned char *base, unsigned row_vecs,
             unsigned long long n) {
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned long long r = i / row_vecs, c = i % row_vecs;
    reinterpret_cast<uint4 *>(base + dst[r])[c] = src[i];
  }
}

extern "C" int attn_cu_put_rows(const void *src, const long long *dst, unsigned char *base,
                                size_t rows, size_t row_bytes, void *stream) {
  const unsigned row_vecs = (unsigned)(row_bytes / 16);
  const unsigned long long n = (unsigned long long)rows * row_vecs;
  if (n == 0)
    return 0;
  unsigned long long blocks = (n + 255) / 256;
  unsigned grid = (unsigned)(blocks < 1024 ? blocks : 1024);
  put_rows<<<grid, 256, 0, (cudaStream_t)stream>>>((const uint4 *)src, dst, base, row_vecs, n);
  return (int)cudaGetLastError();
}
