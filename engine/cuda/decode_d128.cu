// decode_d128.cu — the decode kernel for head dims up to 128.
#include "decode.cuh"

namespace attn_cu {
cudaError_t launch_decode_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return launch_decode<128, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D128>(p, c, s);
}
cudaError_t prepare_decode_d128() {
  return prepare_decode<128, ATTN_CU_DEC_WARPS, ATTN_CU_DEC_STAGES_D128>();
}
} // namespace attn_cu
