// bwd_d256.cu — the tensor-core backward pass for head dims up to 256 (two warps share each 16
// keys, half the dims each, and one stage of each tile, so registers and shared memory (under 99
// KiB) both fit).
#include "bwd_mma.cuh"

namespace attn_cu {
cudaError_t launch_bwd_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_bwd<256, ATTN_CU_BWD_BN_D256, 2, 1, ATTN_CU_BWDQ_BN_D256, false, 1>(p, c, s);
}
cudaError_t prepare_bwd_d256() {
  return prepare_bwd<256, ATTN_CU_BWD_BN_D256, 2, 1, ATTN_CU_BWDQ_BN_D256, false, 1>();
}
} // namespace attn_cu
