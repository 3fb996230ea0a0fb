// bwd_d128.cu — the tensor-core backward pass for head dims up to 128 (Q and dO fragments re-read
// from shared memory, so dQ, S and dP fit in registers).
#include "bwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_bwd_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_bwd<128, ATTN_CU_BWD_BN_D128, 1, 2, ATTN_CU_BWDQ_BN_D128, false, 2>(p, c, s);
}
cudaError_t prepare_bwd_d128() {
  return prepare_bwd<128, ATTN_CU_BWD_BN_D128, 1, 2, ATTN_CU_BWDQ_BN_D128, false, 2>();
}
} // namespace attn_cu
