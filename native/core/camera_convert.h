// Device implementations of camera_params_to_packed / camera_params_backward
// (include/pulsar/renderer.h). Arguments are validated by the public functions
// (camera_convert.cpp) before they reach these.
#pragma once

#include "pulsar/camera_params.h"
#include "pulsar/renderer.h"

namespace pulsar {

// The per-call part of CameraParamsArgs that the per-camera conversion reads (its depth
// range as the fields give it: with_call_depths takes it from the values where they are).
inline CameraParamsSpec camera_params_spec(const CameraParamsArgs& args) {
  CameraParamsSpec spec;
  spec.length = args.length;
  spec.width = args.width;
  spec.height = args.height;
  spec.orthographic = args.orthographic;
  spec.right_handed = args.right_handed;
  spec.first_R_then_T = args.first_R_then_T;
  spec.min_depth = args.min_depth;
  spec.max_depth = args.max_depth;
  return spec;
}

// `spec` with the depth range of a call's values (CameraParamsArgs::values; null: as it
// is). Read where the conversion runs: on the device for a CUDA call.
PULSAR_HD CameraParamsSpec with_call_depths(CameraParamsSpec spec, const double* values) {
  if (values) {
    spec.min_depth = values[CallValue::kMinDepth];
    spec.max_depth = values[CallValue::kMaxDepth];
  }
  return spec;
}

#ifdef PULSAR_WITH_CUDA
// One thread per camera, enqueued on args.stream (native/cuda/camera_convert.cu).
void cuda_camera_params_to_packed(const CameraParamsArgs& args, void* packed);
void cuda_camera_params_backward(const CameraParamsArgs& args, const void* grad_packed, void* grad_params);
#endif

}  // namespace pulsar
