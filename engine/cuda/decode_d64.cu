// decode_d64.cu — the decode kernel for head dims up to 64.
#include "decode.cuh"

namespace attn_cu {
cudaError_t launch_decode_d64(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_decode<64, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D64>(p, c, s);
}
cudaError_t prepare_decode_d64() {
  return prepare_decode<64, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D64>();
}
} // namespace attn_cu
