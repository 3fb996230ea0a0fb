// fwd_d256.cu — the tensor-core forward pass for head dims up to 256 (the generic instance).
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<256, ATTN_CU_BM_D256, ATTN_CU_BN_D256>(p, c, s);
}
cudaError_t prepare_mma_d256() { return prepare_mma<256, ATTN_CU_BM_D256, ATTN_CU_BN_D256>(); }
} // namespace attn_cu
