// fwd_d96.cu — the tensor-core forward pass for head dims up to 96.
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d96(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<96, ATTN_CU_BM_D96, ATTN_CU_BN_D96>(p, c, s);
}
cudaError_t prepare_mma_d96() { return prepare_mma<96, ATTN_CU_BM_D96, ATTN_CU_BN_D96>(); }
} // namespace attn_cu
