// fwd_d128.cu — the tensor-core forward pass for head dims up to 128.
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<128, ATTN_CU_BM_D128, ATTN_CU_BN_D128>(p, c, s);
}
cudaError_t prepare_mma_d128() { return prepare_mma<128, ATTN_CU_BM_D128, ATTN_CU_BN_D128>(); }
} // namespace attn_cu
