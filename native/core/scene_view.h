// Typed views of a call's arguments, shared by the backends (host and device code).
#pragma once

#include <cmath>
#include <cstdint>

#include "pulsar/blend.h"
#include "pulsar/camera.h"
#include "pulsar/hd.h"
#include "pulsar/renderer.h"

namespace pulsar {

// Typed view of the caller's scene arrays for one camera.
template <typename T>
struct SceneView {
  const T* positions;
  const T* features;
  const T* radii;
  const T* opacities;  // may be null
  const T* background;
  std::int64_t n;
  int channels;

  PULSAR_HD static SceneView of(const SceneArgs& s, int b, int channels) {
    const std::int64_t stride = s.shared_spheres ? 0 : s.n_spheres * b;
    SceneView v;
    v.positions = static_cast<const T*>(s.positions) + stride * 3;
    v.features = static_cast<const T*>(s.features) + stride * channels;
    v.radii = static_cast<const T*>(s.radii) + stride;
    v.opacities = s.opacities ? static_cast<const T*>(s.opacities) + stride : nullptr;
    v.background = static_cast<const T*>(s.background);
    v.n = s.n_spheres;
    v.channels = channels;
    return v;
  }
  PULSAR_HD T opacity(std::int64_t i) const { return opacities ? opacities[i] : T(1); }
};

// Camera b's packed parameters (CAMERA_PARAMS values).
template <typename T>
PULSAR_HD const T* packed_camera_of(const SceneArgs& s, int b) {
  return static_cast<const T*>(s.cameras) + std::int64_t(b) * CAMERA_PARAMS;
}

template <typename T>
PULSAR_HD CameraFrame<T> camera_of(const SceneArgs& s, int b, bool orthographic) {
  return load_camera(packed_camera_of<T>(s, b), orthographic, s.right_handed);
}

// gamma and p of a call: its values when it has them (RenderOptions::values).
PULSAR_HD double call_gamma(const RenderOptions& options) {
  return options.values ? options.values[CallValue::kGamma] : options.gamma;
}
PULSAR_HD double call_percent_allowed_difference(const RenderOptions& options) {
  return options.values ? options.values[CallValue::kPercentAllowedDifference] : options.percent_allowed_difference;
}

// Whether a call's values (RenderOptions::values) are in range: gamma in [1e-5, 1], p in
// [0, 1) and the call's depth range 0 <= near < far < inf (near 0: the focal length +
// 2e-6; packed cameras carry their own, made from these). NaN fails every comparison. The
// host checks the values it reads; this, where they are, guards those it does not.
PULSAR_HD bool call_values_valid(const double* values) {
  const double gamma = values[CallValue::kGamma], pad = values[CallValue::kPercentAllowedDifference];
  const double near = values[CallValue::kMinDepth], far = values[CallValue::kMaxDepth];
  return gamma >= 1e-5 && gamma <= 1.0 && pad >= 0.0 && pad < 1.0 && near >= 0.0 && far > near && far < HUGE_VAL;
}

template <typename T>
PULSAR_HD BlendParams<T> blend_params_of(const CameraFrame<T>& cam, const RendererConfig& config,
                                         const RenderOptions& options) {
  const double gamma = call_gamma(options);
  const double pad = call_percent_allowed_difference(options);
  BlendParams<T> p;
  p.gamma = T(gamma);
  p.inv_gamma = T(1.0 / gamma);
  p.min_depth = cam.min_depth;
  p.max_depth = cam.max_depth;
  p.inv_range = T(1) / (cam.max_depth - cam.min_depth);
  // In double, rounded once to T: the same bits on every backend (the GPU's float
  // division is the fast one), so that each sphere's exponent slope is the same too.
  p.inv_gamma_range = T(1.0 / (gamma * (double(cam.max_depth) - double(cam.min_depth))));
  p.bg_exponent = T(config.background_normalized_depth / gamma);
  p.early_stop = pad > 0;
  p.log_odds = p.early_stop ? T(log(pad / (1 - pad))) : T(0);
  return p;
}

}  // namespace pulsar
