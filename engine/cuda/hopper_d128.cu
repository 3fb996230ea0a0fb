// hopper_d128.cu — the Hopper (sm_90a) forward instance for head dims up to
// 128 (hopper.cuh), from 97. Compile-verified only; selected only through the
// self-check's hook (kernels.h).
#include "hopper.cuh"

namespace attn_cu {
cudaError_t launch_hopper_d128(const attn_cu_params &p, const attn_cu_choice &c, cudaStream_t s) {
  return hp_launch<128>(p, c, s);
}
} // namespace attn_cu
