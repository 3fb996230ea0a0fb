// fwd_d192.cu — the tensor-core forward pass for head dims up to 192.
#include "fwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_mma_d192(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_mma<192, ATTN_CU_BM_D192, ATTN_CU_BN_D192>(p, c, s);
}
cudaError_t prepare_mma_d192() { return prepare_mma<192, ATTN_CU_BM_D192, ATTN_CU_BN_D192>(); }
} // namespace attn_cu
