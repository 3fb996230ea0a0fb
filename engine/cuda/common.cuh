// common.cuh — device helpers shared by the kernels: the PTX wrappers
// (cp.async, ldmatrix, mma.sync), F16/BF16 packing, the address of a K/V
// tile (packed or paged), and the epilogue that writes a row's output and
// statistics, or its split-KV partials.
#ifndef ATTN_CUDA_COMMON_CUH
#define ATTN_CUDA_COMMON_CUH

#include "kernels.h"
#include "layout.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <type_traits>

namespace attn_cu {

// ---- PTX wrappers ---------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, bypassing L1; zero-fills when !valid (src is
// then not read, but must still be a valid address).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The two input types and their m16n8k16 tensor-core instruction.
template <typename T> struct mma_t;
template <> struct mma_t<__half> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float load(const __half *p) { return __half2float(*p); }
};
template <> struct mma_t<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float load(const __nv_bfloat16 *p) {
    return __bfloat162float(*p);
  }
};

// 2^x on the special-function unit (relative error about 2^-22; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- K/V rows, packed or paged -----------------------------------------------

// K/V addresses. The forward kernels are instantiated twice, PAGED false
// and true, so the packed instances keep their code and registers exactly
// (a run-time branch per tile cost the 160 instance, at 255 registers
// already, spills on every architecture). What a block keeps across its
// key loop: packed, the K/V head's rows in K and in V (as the kernels
// always did); paged, only that head's row of the tables, one register
// (two table pointers cost the paged 160 instance spills on sm_90), and
// the batch entry's key count (seqused_k). Blocks take their keys and mask
// offset from nkv() and off(), the launch's seq_kv and off when packed.
template <typename T, bool PAGED> struct kv_src;

template <typename T> struct kv_src<T, false> {
  const T *k, *v;
  __device__ kv_src(const attn_cu_params &p, size_t bh, int)
      : k((const T *)p.k + bh * p.seq_kv * p.dp), v((const T *)p.v + bh * p.seq_kv * p.dp) {}
  // The block's keys and mask offset: the launch's (no seqused_k packed).
  __device__ __forceinline__ int nkv(const attn_cu_params &p) const { return p.seq_kv; }
  __device__ __forceinline__ int64_t off(const attn_cu_params &p) const { return p.off; }
  // The same before a kv_src exists (the F32 kernel's order).
  static __device__ __forceinline__ int64_t entry_off(const attn_cu_params &p, int) {
    return p.off;
  }
  // Keys [j0, j0 + tile) of K and of V: rows dp apart.
  __device__ __forceinline__ const T *k_rows(const attn_cu_params &p, size_t j0) const {
    return k + j0 * p.dp;
  }
  __device__ __forceinline__ const T *v_rows(const attn_cu_params &p, size_t j0) const {
    return v + j0 * p.dp;
  }
};

// A tile never straddles a page (kernels.h: page_tokens is a multiple of
// every key tile), so one lookup serves the whole tile.
// With seqused_k, batch entry b is one session: its own key count, read
// once per block, and the mask's offset from it (kernels.h).
template <typename T> struct kv_src<T, true> {
  int row; // bh · pages_per_head: the head's first table entry
  int n;   // the entry's keys: seqused_k[b], or seq_kv
  __device__ kv_src(const attn_cu_params &p, size_t bh, int b)
      : row((int)bh * p.pages_per_head), n(p.seqused_k ? used_keys(p, b) : p.seq_kv) {}
  // Clamped to [0, seq_kv], the keys the tables cover (launch_ok checks
  // them for seq_kv), so no device value can send a block past them.
  static __device__ __forceinline__ int used_keys(const attn_cu_params &p, int b) {
    return min(max(__ldg(p.seqused_k + b), 0), p.seq_kv);
  }
  __device__ __forceinline__ int nkv(const attn_cu_params &) const { return n; }
  // Bottom-right aligned, as a session call's is.
  __device__ __forceinline__ int64_t off(const attn_cu_params &p) const {
    return p.seqused_k ? (int64_t)n - p.seq_q : p.off;
  }
  static __device__ __forceinline__ int64_t entry_off(const attn_cu_params &p, int b) {
    return p.seqused_k ? (int64_t)used_keys(p, b) - p.seq_q : p.off;
  }
  __device__ __forceinline__ const T *rows(const attn_cu_params &p, const int32_t *table,
                                           size_t j0) const {
    const int j = (int)j0; // keys stay below 2^30 (ATTN_CU_MAX_SEQ)
    const int32_t page = __ldg(table + (row + j / p.page_tokens));
    return reinterpret_cast<const T *>(p.page_base + (size_t)page * p.page_bytes) +
           (j % p.page_tokens) * p.dp;
  }
  __device__ __forceinline__ const T *k_rows(const attn_cu_params &p, size_t j0) const {
    return rows(p, p.k_table, j0);
  }
  __device__ __forceinline__ const T *v_rows(const attn_cu_params &p, size_t j0) const {
    return rows(p, p.v_table, j0);
  }
};

// ---- the epilogue -----------------------------------------------------------

// Where a block's rows go: row index (b·Hq + h)·Nq + i of the output, and
// the split it computed. With one split, O (dtype T) and the statistics;
// with several, the F32 partials the merge kernel reads.
struct rows_out {
  const attn_cu_params *p;
  int nsplit, split;
  size_t nrows; // B·Hq·Nq

  __device__ float *part_o() const { return (float *)p->split_ws; }
  __device__ float *part_ml() const {
    return (float *)p->split_ws + (size_t)nsplit * nrows * (size_t)p->dp;
  }
  // Two neighbouring output elements (col even), already divided by l.
  template <typename T> __device__ void o2(size_t row, int col, float a, float b) const {
    if (nsplit == 1) {
      uint32_t v = mma_t<T>::pack(a, b);
      *reinterpret_cast<uint32_t *>((T *)p->o + row * p->dp + col) = v;
    } else {
      *reinterpret_cast<float2 *>(part_o() + ((size_t)split * nrows + row) * p->dp + col) =
          make_float2(a, b);
    }
  }
  __device__ void o1f(size_t row, int col, float a) const {
    if (nsplit == 1)
      ((float *)p->o)[row * p->dp + col] = a;
    else
      part_o()[((size_t)split * nrows + row) * p->dp + col] = a;
  }
  // Statistics of a row: running max in log2 units and the sum.
  __device__ void stats(size_t row, float m2, float l) const {
    if (nsplit == 1) {
      float m, lse;
      attn_cu_stats(m2, l, &m, &lse);
      if (p->m)
        p->m[row] = m;
      if (p->l)
        p->l[row] = l;
      if (p->lse)
        p->lse[row] = lse;
    } else {
      float *ml = part_ml() + 2 * ((size_t)split * nrows + row);
      ml[0] = m2;
      ml[1] = l;
    }
  }
};

// Host side: one launcher and one preparation per kernel file.
cudaError_t launch_mma_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_mma_d96(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_mma_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_mma_d160(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_mma_d192(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_mma_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_simt_f32(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_bwd_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_bwd_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_bwd_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_bwd_f32(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
// The Hopper instance sets its own shared-memory limit at launch: it has
// code only for compute capability 9.0.
cudaError_t launch_hopper_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_hopper_d96(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_hopper_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_hopper_d192(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_hopper_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
// The decode kernel (decode.cuh).
cudaError_t launch_decode_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t launch_decode_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t prepare_decode_d64();
cudaError_t prepare_decode_d128();
cudaError_t launch_decode_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s);
cudaError_t prepare_decode_d256();
cudaError_t prepare_mma_d64();
cudaError_t prepare_mma_d96();
cudaError_t prepare_mma_d128();
cudaError_t prepare_mma_d160();
cudaError_t prepare_mma_d192();
cudaError_t prepare_mma_d256();
cudaError_t prepare_simt_f32();
cudaError_t prepare_bwd_d64();
cudaError_t prepare_bwd_d128();
cudaError_t prepare_bwd_d256();
cudaError_t prepare_bwd_f32();

} // namespace attn_cu

#endif
