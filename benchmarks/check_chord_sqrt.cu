// Exhaustive check of chord_sqrt (include/pulsar/exact_arith.h) on the GPU: for every
// float from the floor 2^-100 to FLT_MAX, chord_sqrt must equal __fsqrt_rn bit for bit
// (the correctly rounded root, which the CPU's std::sqrt also gives), built with the
// render kernels' flags. Prints the count of mismatches (0 expected) and the first few.
// benchmarks/gpu_check.sh runs it; by hand, on a GPU machine:
//   nvcc -std=c++17 -arch=sm_90 --fmad=true -prec-div=false -prec-sqrt=false -ftz=true
//   --expt-relaxed-constexpr -Iinclude benchmarks/check_chord_sqrt.cu -o /tmp/check_chord_sqrt
//   && /tmp/check_chord_sqrt
#include <cstdio>
#include <cstring>

#include "pulsar/exact_arith.h"

__global__ void compare(unsigned first, unsigned long long count, unsigned long long* mismatches, unsigned* examples) {
  const unsigned long long stride = std::size_t(gridDim.x) * blockDim.x;
  for (unsigned long long i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += stride) {
    const unsigned bits = first + unsigned(i);
    const float x = __uint_as_float(bits);
    if (__float_as_uint(pulsar::chord_sqrt(x)) != __float_as_uint(__fsqrt_rn(x))) {
      const unsigned long long k = atomicAdd(mismatches, 1ull);
      if (k < 8) examples[k] = bits;
    }
  }
}

int main() {
  const unsigned first = 0x0d800000u;  // 2^-100
  const unsigned last = 0x7f7fffffu;   // FLT_MAX
  unsigned long long* mismatches;
  unsigned* examples;
  if (cudaMallocManaged(&mismatches, sizeof(*mismatches)) != cudaSuccess ||
      cudaMallocManaged(&examples, 8 * sizeof(*examples)) != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  *mismatches = 0;
  compare<<<4096, 256>>>(first, 1ull + last - first, mismatches, examples);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  std::printf("chord_sqrt vs __fsqrt_rn over [2^-100, FLT_MAX] (%llu floats): %llu mismatches\n", 1ull + last - first,
              *mismatches);
  for (unsigned long long k = 0; k < *mismatches && k < 8; ++k) {
    float x;
    std::memcpy(&x, &examples[k], sizeof(x));
    std::printf("  x = %a\n", x);
  }
  return *mismatches == 0 ? 0 : 1;
}
