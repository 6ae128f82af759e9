// The general camera of docs/model.md section 2, as the native core reads it, and the
// quantities derived from it once per image (optical axis, orthographic frame, pixel
// size), with the derivative twin of that derivation.
#pragma once

#include "pulsar/exact_arith.h"
#include "pulsar/hd.h"
#include "pulsar/vec3.h"

namespace pulsar {

// Layout of one packed camera: CAMERA_PARAMS values of the scene's dtype.
//   [0:3] eye, [3:6] pixel_0_0_center - eye (p00_rel), [6:9] pixel_vec_x (pdx),
//   [9:12] pixel_vec_y (pdy), [12] focal length (0 if orthographic),
//   [13] min_depth (already resolved: never 0 meaning "focal + 2e-6"), [14] max_depth.
// All in world units. The gradient with respect to a camera has the same layout.
// The film is given relative to the eye so that a sensor close to the eye (a small focal
// length in a scene far from the origin) keeps its precision in float32.
constexpr int CAMERA_PARAMS = 15;
enum CameraSlot : int { kEye = 0, kP00 = 3, kPdx = 6, kPdy = 9, kFocal = 12, kMinDepth = 13, kMaxDepth = 14 };

// Perspective culling: the centre must be in front, c.z / |c| >= this (docs/model.md
// section 3).
constexpr double kMinForwardCosine = 1e-6;

template <typename T>
struct CameraFrame {
  Vec3<T> eye, p00_rel, pdx, pdy;  // p00_rel = pixel_0_0_center - eye
  Vec3<T> z_axis;      // unit optical axis = +-normalize(pdy x pdx)
  Vec3<T> x_unit;      // normalize(pdx): orthographic frame
  Vec3<T> y_unit;      // normalize(pdy)
  T pixel_width;       // |pdx|
  T pixel_height;      // |pdy|
  T pixel_size;        // sqrt(|pdx| |pdy|): the tiny-sphere rule's pixel size
  T focal;             // 0 if orthographic
  T min_depth, max_depth;
  bool orthographic;
  bool right_handed;

  // Sensor point of film pixel (column i, row j), relative to the eye (rounded step by
  // step: exact_arith.h).
  PULSAR_HD Vec3<T> sensor_offset(T i, T j) const {
    return add_rn(add_rn(p00_rel, scale_rn(i, pdx)), scale_rn(j, pdy));
  }
};

template <typename T>
PULSAR_HD CameraFrame<T> load_camera(const T* packed, bool orthographic, bool right_handed) {
  CameraFrame<T> cam;
  cam.eye = load_vec3(packed + kEye);
  cam.p00_rel = load_vec3(packed + kP00);
  cam.pdx = load_vec3(packed + kPdx);
  cam.pdy = load_vec3(packed + kPdy);
  cam.focal = packed[kFocal];
  cam.min_depth = packed[kMinDepth];
  cam.max_depth = packed[kMaxDepth];
  cam.orthographic = orthographic;
  cam.right_handed = right_handed;
  // Rounded step by step (exact_arith.h): every backend derives the same frame.
  const Vec3<T> z = normalize_rn(cross_rn(cam.pdy, cam.pdx));
  cam.z_axis = right_handed ? -z : z;
  cam.pixel_width = norm_rn(cam.pdx);
  cam.pixel_height = norm_rn(cam.pdy);
  cam.x_unit = scale_rn(div_rn(T(1), cam.pixel_width), cam.pdx);
  cam.y_unit = scale_rn(div_rn(T(1), cam.pixel_height), cam.pdy);
  cam.pixel_size = sqrt_rn(mul_rn(cam.pixel_width, cam.pixel_height));
  return cam;
}

// Gradients with respect to the camera, accumulated in the derived frame and reduced to
// the packed layout once per image by frame_backward.
template <typename T>
struct CameraGrad {
  Vec3<T> eye{0, 0, 0}, p00_rel{0, 0, 0}, pdx{0, 0, 0}, pdy{0, 0, 0};
  Vec3<T> z_axis{0, 0, 0}, x_unit{0, 0, 0}, y_unit{0, 0, 0};
  T min_depth = 0, max_depth = 0;

  PULSAR_HD void add(const CameraGrad& o) {
    eye += o.eye;
    p00_rel += o.p00_rel;
    pdx += o.pdx;
    pdy += o.pdy;
    z_axis += o.z_axis;
    x_unit += o.x_unit;
    y_unit += o.y_unit;
    min_depth += o.min_depth;
    max_depth += o.max_depth;
  }

  // Flat layout, for reductions: eye, p00_rel, pdx, pdy, z_axis, x_unit, y_unit (3 each),
  // min_depth, max_depth (kValues values).
  static constexpr int kValues = 23;
  PULSAR_HD void to_array(T* out) const {
    store_vec3(out + 0, eye);
    store_vec3(out + 3, p00_rel);
    store_vec3(out + 6, pdx);
    store_vec3(out + 9, pdy);
    store_vec3(out + 12, z_axis);
    store_vec3(out + 15, x_unit);
    store_vec3(out + 18, y_unit);
    out[21] = min_depth;
    out[22] = max_depth;
  }
  PULSAR_HD static CameraGrad from_array(const T* in) {
    CameraGrad g;
    g.eye = load_vec3(in + 0);
    g.p00_rel = load_vec3(in + 3);
    g.pdx = load_vec3(in + 6);
    g.pdy = load_vec3(in + 9);
    g.z_axis = load_vec3(in + 12);
    g.x_unit = load_vec3(in + 15);
    g.y_unit = load_vec3(in + 18);
    g.min_depth = in[21];
    g.max_depth = in[22];
    return g;
  }

  // A gradient with respect to the sensor offset of pixel (i, j) reaches p00_rel, pdx, pdy.
  PULSAR_HD void add_sensor_offset(Vec3<T> g, T i, T j) {
    p00_rel += g;
    pdx += i * g;
    pdy += j * g;
  }
};

// Twin of load_camera's derivation: folds the gradients of z_axis, x_unit and y_unit
// into pdx and pdy and writes the packed gradient (CAMERA_PARAMS values).
template <typename T>
PULSAR_HD void frame_backward(const CameraFrame<T>& cam, const CameraGrad<T>& g, T* packed_grad) {
  Vec3<T> gpdx = g.pdx + normalize_backward(cam.pdx, g.x_unit);
  Vec3<T> gpdy = g.pdy + normalize_backward(cam.pdy, g.y_unit);
  // z = s * normalize(pdy x pdx), s = -1 if right-handed.
  const Vec3<T> gz = cam.right_handed ? -g.z_axis : g.z_axis;
  const Vec3<T> gcross = normalize_backward(cross(cam.pdy, cam.pdx), gz);
  cross_backward(cam.pdy, cam.pdx, gcross, gpdy, gpdx);
  store_vec3(packed_grad + kEye, g.eye);
  store_vec3(packed_grad + kP00, g.p00_rel);
  store_vec3(packed_grad + kPdx, gpdx);
  store_vec3(packed_grad + kPdy, gpdy);
  packed_grad[kFocal] = T(0);  // focal length enters only the (discrete) tiny-sphere rule
  packed_grad[kMinDepth] = g.min_depth;
  packed_grad[kMaxDepth] = g.max_depth;
}

}  // namespace pulsar
