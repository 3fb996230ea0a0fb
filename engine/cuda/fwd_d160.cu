// fwd_d160.cu — the tensor-core forward pass for head dims up to 160.
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d160(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<160, ATTN_CU_BM_D160, ATTN_CU_BN_D160, false>(p, c, s); // no paged variant
}
cudaError_t prepare_mma_d160() {
  return prepare_mma<160, ATTN_CU_BM_D160, ATTN_CU_BN_D160, false>();
}
} // namespace attn_cu
