// Warp-wide reductions. All 32 lanes must call them together.
#pragma once

namespace pulsar {

// Sum over the warp's lanes, held by lane 0 (a shuffle tree: a fixed order, so the sum is
// reproducible run to run).
template <typename T>
__device__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Maximum and bitwise or of an unsigned word, on every lane: the reductions of sm_80 and
// later, shuffle trees on sm_75.
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
