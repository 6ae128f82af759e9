// Host/device qualifiers for math shared by the CPU and CUDA backends.
#pragma once

#if defined(__CUDACC__)
#define PULSAR_HD __host__ __device__ __forceinline__
#else
#define PULSAR_HD inline
#endif
