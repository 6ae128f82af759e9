// Pulsar's camera vector converted to the packed general camera (camera.h), written once.
//
// Why native: the same conversion as torch code (pulsar_py/cameras/params.py,
// camera_from_params, plus the near/far resolution of pulsar_py/renderer.py) is about 60
// tiny tensor operations forward and as many backward: on a GPU, as many kernel launches,
// each paid for in host time. Here it is one loop (CPU) or one kernel (CUDA) forward, and
// one backward.
//
// The conversion is a template over the scalar type S: float or double for the forward,
// Dual<T, 13> (dual.h) for the backward, which is therefore the exact forward-mode
// derivative of this very code. It mirrors cameras/params.py operation for operation
// (same order, same small-angle series, divisions where torch divides), so its values
// agree with the torch reference to rounding of sin/cos.
//
// Camera vector (docs/model.md section 2), L = spec.length values in {8, 10, 11, 13}:
//   [0:3] position, world units;
//   rotation: axis-angle (3, radians; L = 8, 10) or 6D (6, two rows a1, a2; L = 11, 13);
//   focal length (world units; must be 0 for orthographic and is then ignored);
//   sensor width (world units);
//   optionally (L = 10, 13) principal-point offsets ox, oy in pixels (real-valued).
// Packed output, CAMERA_PARAMS = 15 values (camera.h): eye, p00_rel, pdx, pdy (3 each),
// focal (0 if orthographic), min_depth (resolved), max_depth.
#pragma once

#include <cmath>
#include <limits>

#include "pulsar/camera.h"
#include "pulsar/dual.h"
#include "pulsar/hd.h"
#include "pulsar/vec3.h"

namespace pulsar {

// Longest camera vector: 3 position + 6 rotation + focal + sensor + 2 offsets.
constexpr int kMaxCameraParams = 13;

// Everything of the conversion that is not a camera value; the same for all B cameras.
struct CameraParamsSpec {
  int length = 8;               // L in {8, 10, 11, 13}
  int width = 1, height = 1;    // image size in pixels
  bool orthographic = false;    // focal length ignored (packed as 0), sensor centre = eye
  bool right_handed = false;    // optical axis = -M(0, 0, 1)
  bool first_R_then_T = false;  // eye = M * position instead of position
  double min_depth = 0.0;       // near depth, world units; 0 means focal + 2e-6
  double max_depth = 1.0;       // far depth, world units
};

namespace camera_params_detail {

// v / s component-wise: torch's normalize3 divides (it does not multiply by 1 / s).
template <typename S>
PULSAR_HD Vec3<S> divide(Vec3<S> v, S s) {
  return {v.x / s, v.y / s, v.z / s};
}

template <typename S>
PULSAR_HD Vec3<S> normalize_by_division(Vec3<S> v) {
  using std::sqrt;
  return divide(v, sqrt(dot(v, v)));
}

// 3 x 3 rotation matrix, row-major: m[row][column].
template <typename S>
struct Mat3 {
  S m[3][3];
  PULSAR_HD Vec3<S> column(int c) const { return {m[0][c], m[1][c], m[2][c]}; }
  PULSAR_HD Vec3<S> row(int r) const { return {m[r][0], m[r][1], m[r][2]}; }
};

// Rodrigues' formula M = I + a K + b K^2 with a = sin(t)/t, b = (1 - cos t)/t^2,
// t = |r| in radians, K the cross-product matrix of r and K^2 = r r^T - t^2 I. Below
// t^2 = 1e-8 the series a = 1 - t^2/6, b = 1/2 - t^2/24 keep value and derivative exact
// at the identity (sin(t)/t is 0/0 there).
template <typename S>
PULSAR_HD Mat3<S> axis_angle_to_matrix(Vec3<S> r) {
  using T = typename ScalarOf<S>::type;
  using std::cos;
  using std::sin;
  using std::sqrt;
  const S theta2 = dot(r, r);
  S a, b;
  if (value_of(theta2) < T(1e-8)) {
    a = T(1) - theta2 / T(6);
    b = T(0.5) - theta2 / T(24);
  } else {
    const S theta = sqrt(theta2);
    a = sin(theta) / theta;
    b = (T(1) - cos(theta)) / theta2;
  }
  const S zero(T(0));
  const S k[3][3] = {{zero, -r.z, r.y}, {r.z, zero, -r.x}, {-r.y, r.x, zero}};
  const S rv[3] = {r.x, r.y, r.z};
  Mat3<S> out;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const S identity(T(i == j ? 1 : 0));
      // (I + a K) + b (r r^T - t^2 I), grouped as the torch reference evaluates it.
      out.m[i][j] = (identity + a * k[i][j]) + b * (rv[i] * rv[j] - theta2 * identity);
    }
  }
  return out;
}

// 6D rotation (Zhou et al.): Gram-Schmidt of rows a1, a2; the matrix's rows are b1, b2, b3.
template <typename S>
PULSAR_HD Mat3<S> rotation_6d_to_matrix(Vec3<S> a1, Vec3<S> a2) {
  const Vec3<S> b1 = normalize_by_division(a1);
  const Vec3<S> b2 = normalize_by_division(a2 - dot(b1, a2) * b1);
  const Vec3<S> b3 = cross(b1, b2);
  Mat3<S> out;
  const Vec3<S> rows[3] = {b1, b2, b3};
  for (int i = 0; i < 3; ++i) {
    out.m[i][0] = rows[i].x;
    out.m[i][1] = rows[i].y;
    out.m[i][2] = rows[i].z;
  }
  return out;
}

// The next representable value above x (x finite).
template <typename T>
PULSAR_HD T next_above(T x) {
#ifdef __CUDA_ARCH__
  return nextafter(x, T(INFINITY));
#else
  return std::nextafter(x, std::numeric_limits<T>::infinity());
#endif
}

// The near depth that min_depth = 0 stands for (docs/model.md section 1): focal + 2e-6 in
// T, or, where that sum rounds back to the focal length (float32 from a focal length of
// 64 on), the next representable value above it. Its derivative with respect to the
// focal length is 1 either way (the step added is a constant).
template <typename S>
PULSAR_HD S near_for_focal(const S& focal) {
  using T = typename ScalarOf<S>::type;
  const S plain = focal + T(2e-6);
  if (value_of(plain) > value_of(focal)) return plain;
  const T f = value_of(focal);
  return focal + (next_above(f) - f);
}

}  // namespace camera_params_detail

// The conversion for one camera, over any scalar type S (T or Dual<T, N>).
//   params: spec.length values (layout above); packed: CAMERA_PARAMS values out.
template <typename S>
PULSAR_HD void camera_from_params_generic(const S* params, const CameraParamsSpec& spec, S* packed) {
  using namespace camera_params_detail;
  using T = typename ScalarOf<S>::type;
  const int n_rot = (spec.length == 11 || spec.length == 13) ? 6 : 3;
  Vec3<S> pos = {params[0], params[1], params[2]};
  const Mat3<S> rot = n_rot == 6 ? rotation_6d_to_matrix(Vec3<S>{params[3], params[4], params[5]},
                                                         Vec3<S>{params[6], params[7], params[8]})
                                 : axis_angle_to_matrix(Vec3<S>{params[3], params[4], params[5]});
  const S focal = params[3 + n_rot];
  const S sensor_width = params[4 + n_rot];
  if (spec.first_R_then_T) pos = {dot(rot.row(0), pos), dot(rot.row(1), pos), dot(rot.row(2), pos)};
  // Image axes in world coordinates: x = M(1, 0, 0), y = M(0, -1, 0) (rows go down),
  // z = M(0, 0, 1), negated for a right-handed system.
  const Vec3<S> x_axis = rot.column(0);
  const Vec3<S> y_axis = -rot.column(1);
  const Vec3<S> z_axis = spec.right_handed ? -rot.column(2) : rot.column(2);
  const S pixel_size = sensor_width / T(spec.width);  // world units per pixel
  const Vec3<S> pdx = pixel_size * x_axis;
  const Vec3<S> pdy = pixel_size * y_axis;
  // Sensor centre relative to the eye: f z (perspective) or the eye itself.
  const S zero(T(0));
  const Vec3<S> centre = spec.orthographic ? Vec3<S>{zero, zero, zero} : focal * z_axis;
  const S half_w(T((spec.width - 1) / 2.0));   // pixels from pixel 0 to the centre
  const S half_h(T((spec.height - 1) / 2.0));
  Vec3<S> p00_rel = (centre - half_w * pdx) - half_h * pdy;
  if (spec.length == 10 || spec.length == 13) {
    // A positive offset moves the optical axis left/up: the film moves right/down.
    const S offset_x = params[5 + n_rot];
    const S offset_y = params[6 + n_rot];
    p00_rel = (p00_rel + offset_x * pdx) + offset_y * pdy;
  }
  const S focal_out = spec.orthographic ? zero : focal;
  // min_depth 0 stands for "just past the sensor" (Pulsar's convention); compared in T
  // like the torch reference compares its T-typed depth tensor.
  const T min_depth = T(spec.min_depth);
  const S near = min_depth == T(0) ? near_for_focal(focal_out) : S(min_depth);
  store_vec3(packed + kEye, pos);
  store_vec3(packed + kP00, p00_rel);
  store_vec3(packed + kPdx, pdx);
  store_vec3(packed + kPdy, pdy);
  packed[kFocal] = focal_out;
  packed[kMinDepth] = near;
  packed[kMaxDepth] = S(T(spec.max_depth));
}

// Forward for one camera: params [spec.length] in, packed [CAMERA_PARAMS] out.
template <typename T>
PULSAR_HD void packed_camera_from_params(const T* params, const CameraParamsSpec& spec, T* packed) {
  camera_from_params_generic<T>(params, spec, packed);
}

// One run of packed_camera_from_params_backward: the columns [first, first + Chunk) of
// dL/dparams (those below spec.length). Runs are independent (a GPU gives each its own
// thread), and each column's value is the same whatever the chunk: dual arithmetic is
// component-wise.
template <typename T, int Chunk>
PULSAR_HD void packed_camera_from_params_backward_run(const T* params, const CameraParamsSpec& spec,
                                                      const T* grad_packed, T* grad_params, int first) {
  using D = Dual<T, Chunk>;
  const int count = spec.length - first < Chunk ? spec.length - first : Chunk;
  D in[kMaxCameraParams];
  for (int j = 0; j < spec.length; ++j) in[j] = D(params[j]);
  for (int c = 0; c < count; ++c) in[first + c].d[c] = T(1);
  D out[CAMERA_PARAMS];
  camera_from_params_generic<D>(in, spec, out);
  for (int c = 0; c < count; ++c) {
    T sum = T(0);
    for (int k = 0; k < CAMERA_PARAMS; ++k) sum += grad_packed[k] * out[k].d[c];
    grad_params[first + c] = sum;
  }
}

// Backward for one camera: grad_params[j] = sum_k grad_packed[k] d packed[k] / d params[j],
// j < spec.length. The Jacobian (15 x L) is the exact forward-mode derivative of the
// forward above: the same template run on duals seeded with the identity. Chunk tangents
// are carried per run (ceil(L / Chunk) runs, each seeded with the next Chunk columns of
// the identity): the default, one run with all 13, suits the CPU; a GPU thread picks a
// smaller Chunk so that the duals fit in registers.
template <typename T, int Chunk = kMaxCameraParams>
PULSAR_HD void packed_camera_from_params_backward(const T* params, const CameraParamsSpec& spec, const T* grad_packed,
                                                  T* grad_params) {
  for (int first = 0; first < spec.length; first += Chunk)
    packed_camera_from_params_backward_run<T, Chunk>(params, spec, grad_packed, grad_params, first);
}

}  // namespace pulsar
