// hopper_d96.cu — the Hopper (sm_90a) forward instance for head dims up to
// 96 (hopper.cuh), from 65: tiles stored as the 128 instance's, S = Q Kᵀ
// over 96 columns. Compile-verified only; selected only through the
// self-check's hook (kernels.h).
#include "hopper.cuh"

namespace attn_cu {
cudaError_t launch_hopper_d96(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return hp_launch<96>(p, c, s);
}
} // namespace attn_cu
