// camera_params_to_packed / camera_params_backward (include/pulsar/renderer.h):
// validation, device dispatch, and the CPU implementation (a plain loop over the B
// cameras; each is a few hundred flops, far below the cost of spawning threads).
#include "camera_convert.h"

#include "backend.h"
#include "errors.h"

namespace pulsar {

namespace {

void check_camera_params_args(const CameraParamsArgs& args) {
  PULSAR_REQUIRE(args.length == 8 || args.length == 10 || args.length == 11 || args.length == 13,
                 "length: expected 8, 10, 11 or 13 values per camera vector, got ", args.length);
  PULSAR_REQUIRE(args.batch_size >= 1, "batch_size: expected >= 1 camera, got ", args.batch_size);
  PULSAR_REQUIRE(args.width >= 1, "width: expected >= 1 pixel, got ", args.width);
  PULSAR_REQUIRE(args.height >= 1, "height: expected >= 1 pixel, got ", args.height);
  PULSAR_REQUIRE(args.params != nullptr, "params: expected a pointer to [", args.batch_size, ", ", args.length,
                 "] camera vectors, got null");
  PULSAR_REQUIRE(args.dtype == DType::Float32 || args.dtype == DType::Float64,
                 "dtype: expected float32 or float64, got ", static_cast<int>(args.dtype));
  PULSAR_REQUIRE(args.device == DeviceKind::CPU || args.device == DeviceKind::CUDA,
                 "device: expected cpu or cuda, got ", static_cast<int>(args.device));
#ifndef PULSAR_WITH_CUDA
  if (args.device == DeviceKind::CUDA)
    throw std::invalid_argument(
        "device: CUDA requested, but this build of pulsar_py has no CUDA backend "
        "(see pulsar_py.build_info())");
#endif
}

template <typename T>
void cpu_to_packed(const CameraParamsArgs& args, T* packed) {
  const CameraParamsSpec spec = with_call_depths(camera_params_spec(args), args.values);
  const T* params = static_cast<const T*>(args.params);
  for (int b = 0; b < args.batch_size; ++b)
    packed_camera_from_params<T>(params + std::size_t(b) * args.length, spec, packed + std::size_t(b) * CAMERA_PARAMS);
}

template <typename T>
void cpu_backward(const CameraParamsArgs& args, const T* grad_packed, T* grad_params) {
  const CameraParamsSpec spec = with_call_depths(camera_params_spec(args), args.values);
  const T* params = static_cast<const T*>(args.params);
  for (int b = 0; b < args.batch_size; ++b) {
    const std::size_t in = std::size_t(b) * args.length;
    packed_camera_from_params_backward<T>(params + in, spec, grad_packed + std::size_t(b) * CAMERA_PARAMS,
                                          grad_params + in);
  }
}

}  // namespace

void camera_params_to_packed(const CameraParamsArgs& args, void* packed) {
  check_camera_params_args(args);
  PULSAR_REQUIRE(packed != nullptr, "packed: expected a pointer to [", args.batch_size, ", ", CAMERA_PARAMS,
                 "] packed cameras, got null");
#ifdef PULSAR_WITH_CUDA
  if (args.device == DeviceKind::CUDA) return cuda_camera_params_to_packed(args, packed);
#endif
  dispatch_dtype(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    cpu_to_packed<T>(args, static_cast<T*>(packed));
  });
}

void camera_params_backward(const CameraParamsArgs& args, const void* grad_packed, void* grad_params) {
  check_camera_params_args(args);
  PULSAR_REQUIRE(grad_packed != nullptr, "grad_packed: expected a pointer to [", args.batch_size, ", ", CAMERA_PARAMS,
                 "] gradients, got null");
  PULSAR_REQUIRE(grad_params != nullptr, "grad_params: expected a pointer to [", args.batch_size, ", ", args.length,
                 "] gradients, got null");
#ifdef PULSAR_WITH_CUDA
  if (args.device == DeviceKind::CUDA) return cuda_camera_params_backward(args, grad_packed, grad_params);
#endif
  dispatch_dtype(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    cpu_backward<T>(args, static_cast<const T*>(grad_packed), static_cast<T*>(grad_params));
  });
}

}  // namespace pulsar
