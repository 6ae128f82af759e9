// Warp-wide maximum and bitwise or of an unsigned word: the reductions of sm_80 and
// later, shuffle trees on sm_75. All 32 lanes must call them together.
#pragma once

namespace pulsar {

__device__ inline unsigned warp_max(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
#endif
}

__device__ inline unsigned warp_or(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_or_sync(0xffffffffu, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v |= __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
#endif
}

}  // namespace pulsar
