// fwd_d64.cu — the tensor-core forward pass for head dims up to 64.
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<64, ATTN_CU_BM_D64, ATTN_CU_BN_D64>(p, c, s);
}
cudaError_t prepare_mma_d64() { return prepare_mma<64, ATTN_CU_BM_D64, ATTN_CU_BN_D64>(); }
} // namespace attn_cu
