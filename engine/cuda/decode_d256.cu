// decode_d256.cu — the decode kernel for head dims up to 256.
#include "decode.cuh"

namespace attn_cu {
cudaError_t launch_decode_d256(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_decode<256, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D256>(p, c, s);
}
cudaError_t prepare_decode_d256() {
  return prepare_decode<256, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D256>();
}
} // namespace attn_cu
