// What one pixel contributes to every pair it is part of: its ray (perspective) or its
// film coordinates (orthographic), and the pair evaluation on top of a prepared sphere.
#pragma once

#include <cmath>
#include <limits>

#include "pulsar/camera.h"
#include "pulsar/hd.h"
#include "pulsar/intersection.h"
#include "pulsar/vec3.h"

namespace pulsar {

template <typename T>
struct PixelRay {
  Vec3<T> dir;  // perspective: unit ray normalize(P - eye)
  T sx, sy;     // orthographic: (P - eye) . (x_unit, y_unit)
};

template <typename T>
PULSAR_HD PixelRay<T> pixel_ray(const CameraFrame<T>& cam, int x, int y) {
  PixelRay<T> r;
  const Vec3<T> s = cam.sensor_offset(T(x), T(y));
  // Rounded step by step (exact_arith.h): every backend casts the same rays.
  if (cam.orthographic) {
    r.sx = dot_rn(s, cam.x_unit);
    r.sy = dot_rn(s, cam.y_unit);
    r.dir = cam.z_axis;
  } else {
    r.dir = normalize_rn(s);
    r.sx = r.sy = T(0);
  }
  return r;
}

// The per-sphere constants of evaluate_pair for a sphere of radius `radius` at distance
// dist = |centre - eye|; is_tiny: it projects to under one pixel (sphere_setup.h).
template <typename T>
PULSAR_HD PairTerms<T> pair_terms(const CameraFrame<T>& cam, T dist, T radius, bool is_tiny) {
  PairTerms<T> k;
  // 1 / r, at most the largest finite value: a denormal radius (valid input) would give
  // infinity, and the backward's products with it (dL/dkappa / r, where the tiny-sphere
  // rule makes dL/dkappa 0) NaN. Capped, such a sphere hits by the tiny-sphere rule or
  // at delta <= r, and its derivatives are those of the capped reciprocal.
  k.inv_radius = std::fmin(T(1) / radius, std::numeric_limits<T>::max());
  if (cam.orthographic) {
    k.inv_two_dist = T(0);
    k.tiny_radius = is_tiny ? T(0) : T(-1);
  } else {
    k.inv_two_dist = T(1) / (T(2) * dist);
    k.tiny_radius = is_tiny ? T(kTinyCentreRadiusPx) * cam.pixel_size * dist / cam.focal : T(-1);
  }
  return k;
}

// Evaluates one pixel-sphere pair. c: perspective, centre - eye in world coordinates;
// orthographic, the same vector in the camera frame (x_unit, y_unit, z_axis). dist = |c|;
// k = pair_terms(cam, dist, radius, is_tiny).
template <typename T>
PULSAR_HD PairHit<T> evaluate_pair(const CameraFrame<T>& cam, Vec3<T> c, T dist, T radius, const PairTerms<T>& k,
                                   const PixelRay<T>& ray) {
  if (cam.orthographic)
    return intersect_orthographic(c.x - ray.sx, c.y - ray.sy, c.z, radius, k, cam.pixel_width, cam.pixel_height);
  return intersect_perspective(c, dist, radius, k, ray.dir);
}

}  // namespace pulsar
