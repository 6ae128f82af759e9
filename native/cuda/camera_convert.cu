// camera_params_to_packed / camera_params_backward on CUDA: one thread per camera, on
// the caller's stream. The conversion itself is include/pulsar/camera_params.h, the same
// template the CPU runs (compiled without FMA contraction, CMakeLists.txt, so the packed
// cameras agree with the CPU's to rounding of sin/cos).
#include <string>

#include "../core/backend.h"
#include "../core/camera_convert.h"
#include "cuda_check.h"

namespace pulsar {

namespace {

constexpr int kThreads = 128;
// Tangents per dual in the backward (camera_params.h), one thread per run of that many:
// all 13 at once make a thread spill kilobytes in double, and runs of several put a
// camera's columns one after another on one thread, at the end of every backward; one
// tangent per thread runs every column in parallel.
constexpr int kTangentChunk = 1;

template <typename T>
__global__ void camera_to_packed_kernel(CameraParamsSpec spec, const double* values, int batch, const T* params,
                                        T* packed) {
  const int b = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  packed_camera_from_params<T>(params + std::size_t(b) * spec.length, with_call_depths(spec, values),
                               packed + std::size_t(b) * CAMERA_PARAMS);
}

// Runs of kTangentChunk columns per camera.
__host__ __device__ inline int runs_per_camera(const CameraParamsSpec& spec) {
  return (spec.length + kTangentChunk - 1) / kTangentChunk;
}

// One thread per (camera, run of kTangentChunk columns of its dL/dparams).
template <typename T>
__global__ void camera_backward_kernel(CameraParamsSpec spec, const double* values, int batch, const T* params,
                                       const T* grad_packed, T* grad_params) {
  spec = with_call_depths(spec, values);
  const int runs = runs_per_camera(spec);
  const int t = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= batch * runs) return;
  const int b = t / runs;
  const std::size_t in = std::size_t(b) * spec.length;
  packed_camera_from_params_backward_run<T, kTangentChunk>(params + in, spec,
                                                           grad_packed + std::size_t(b) * CAMERA_PARAMS,
                                                           grad_params + in, (t - b * runs) * kTangentChunk);
}

void check_device_index(int device_index) {
  int count = 0;
  PULSAR_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (device_index < 0 || device_index >= count)
    throw std::invalid_argument("device_index: CUDA device " + std::to_string(device_index) + " requested, but " +
                                std::to_string(count) + " are present");
}

int blocks_for(int batch) { return (batch + kThreads - 1) / kThreads; }

// Common to both entry points: the device, its guard, the spec and the stream; calls
// launch(T{}, spec, stream) for the call's dtype.
template <typename Launch>
void on_device(const CameraParamsArgs& args, Launch launch) {
  check_device_index(args.device_index);
  DeviceGuard guard(args.device_index);
  const CameraParamsSpec spec = camera_params_spec(args);
  const auto stream = static_cast<cudaStream_t>(args.stream);
  dispatch_dtype(args.dtype, [&](auto tag) { launch(tag, spec, stream); });
}

}  // namespace

void cuda_camera_params_to_packed(const CameraParamsArgs& args, void* packed) {
  on_device(args, [&](auto tag, const CameraParamsSpec& spec, cudaStream_t stream) {
    using T = decltype(tag);
    camera_to_packed_kernel<T><<<blocks_for(args.batch_size), kThreads, 0, stream>>>(
        spec, args.values, args.batch_size, static_cast<const T*>(args.params), static_cast<T*>(packed));
    PULSAR_CUDA_LAUNCH_CHECK("camera_to_packed_kernel");
  });
}

void cuda_camera_params_backward(const CameraParamsArgs& args, const void* grad_packed, void* grad_params) {
  on_device(args, [&](auto tag, const CameraParamsSpec& spec, cudaStream_t stream) {
    using T = decltype(tag);
    camera_backward_kernel<T><<<blocks_for(args.batch_size * runs_per_camera(spec)), kThreads, 0, stream>>>(
        spec, args.values, args.batch_size, static_cast<const T*>(args.params), static_cast<const T*>(grad_packed),
        static_cast<T*>(grad_params));
    PULSAR_CUDA_LAUNCH_CHECK("camera_backward_kernel");
  });
}

}  // namespace pulsar
