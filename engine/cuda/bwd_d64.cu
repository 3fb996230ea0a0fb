// bwd_d64.cu — the tensor-core backward pass for head dims up to 64 (dQ keeps Q and dO fragments in
// registers).
#include "bwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_bwd_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_bwd<64, ATTN_CU_BWD_BN_D64, 1, 2, ATTN_CU_BWDQ_BN_D64, true, 2>(p, c, s);
}
cudaError_t prepare_bwd_d64() {
  return prepare_bwd<64, ATTN_CU_BWD_BN_D64, 1, 2, ATTN_CU_BWDQ_BN_D64, true, 2>();
}
} // namespace attn_cu
