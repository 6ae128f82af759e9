// Per-sphere preparation for one camera (docs/model.md section 3): culling, the closest
// possible depth zc that orders traversal, the tiny-sphere flag, and a screen bounding
// box that contains every pixel the sphere can hit. No gradient flows through this
// stage: culling and bounds are discrete decisions.
#pragma once

#include <cmath>

#include "pulsar/camera.h"
#include "pulsar/hd.h"
#include "pulsar/intersection.h"
#include "pulsar/vec3.h"

namespace pulsar {

struct PixelBounds {
  int x0, y0, x1, y1;  // inclusive pixel range; empty when x0 > x1 or y0 > y1
  PULSAR_HD bool empty() const { return x0 > x1 || y0 > y1; }
  PULSAR_HD bool contains(int x, int y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

template <typename T>
struct SphereSetup {
  bool visible;       // survives culling and touches the image
  bool is_tiny;       // projects to under one pixel: the tiny-sphere rule applies
  T closest_depth;    // zc: t - r (perspective) or c.z - r (orthographic), world units
  PixelBounds bounds;
};

// Rounding allowance of the per-pixel pair test (float32), as an angle between the ray
// and the centre: the chord |c - t d| carries an error of a few ulp of t (the unit ray d
// and the product t d round to about 1e-7 relative), under 1e-6 rad of that angle. A
// perspective box is grown by this angle, so that no pixel the test hits falls outside.
// (A margin of half a pixel on each side would enlarge a small sphere's box by a large
// fraction, radius r + 1/2 px against r, and every pixel of a box costs a test.)
constexpr double kPairAngleSlack = 4e-6;
// Pixels of margin on each side of a cone's box, against the double rounding of the conic.
constexpr double kConeBoxPixelSlack = 1.0 / 32;

// Bounds of the pixel centres whose ray makes an angle of at most `angle` (radians) with
// the unit direction `axis` from the eye. The cone's image on the film is a conic; the
// tangent lines u = const and v = const of its dual give the box exactly, up to
// kConeBoxPixelSlack. Computed in double; anything degenerate (the cone reaching the
// plane of the eye) falls back to the whole image, which is always safe.
PULSAR_HD PixelBounds cone_pixel_bounds(Vec3<double> axis, double angle, Vec3<double> pdx, Vec3<double> pdy,
                                        Vec3<double> p00_rel, int width, int height) {
  const PixelBounds whole{0, 0, width - 1, height - 1};
  // Direction from the eye through film coordinates (u, v): M (u, v, 1), M = [pdx pdy p00-eye].
  Vec3<double> film_normal = normalize(cross(pdx, pdy));
  if (dot(film_normal, p00_rel) < 0) film_normal = -film_normal;
  if (!(angle < 1.5) || dot(axis, film_normal) <= std::sin(angle) + 1e-9) return whole;
  const double cos2 = std::cos(angle) * std::cos(angle);
  const Vec3<double> cols[3] = {pdx, pdy, p00_rel};
  double q[3][3];  // conic C = (M^T a)(M^T a)^T - cos^2 M^T M
  for (int r = 0; r < 3; ++r)
    for (int s = 0; s < 3; ++s) q[r][s] = dot(cols[r], axis) * dot(cols[s], axis) - cos2 * dot(cols[r], cols[s]);
  // Adjugate entries (the dual conic up to scale) that the tangents need.
  const double a11 = q[1][1] * q[2][2] - q[1][2] * q[2][1];
  const double a22 = q[0][0] * q[2][2] - q[0][2] * q[2][0];
  const double a33 = q[0][0] * q[1][1] - q[0][1] * q[1][0];
  const double a13 = q[0][1] * q[1][2] - q[0][2] * q[1][1];
  const double a23 = -(q[0][0] * q[1][2] - q[0][2] * q[1][0]);
  const double disc_u = a13 * a13 - a11 * a33;
  const double disc_v = a23 * a23 - a22 * a33;
  if (!(a33 != 0) || !(disc_u >= 0) || !(disc_v >= 0)) return whole;
  const double su = std::sqrt(disc_u), sv = std::sqrt(disc_v);
  const double u_lo = std::fmin((a13 - su) / a33, (a13 + su) / a33);
  const double u_hi = std::fmax((a13 - su) / a33, (a13 + su) / a33);
  const double v_lo = std::fmin((a23 - sv) / a33, (a23 + sv) / a33);
  const double v_hi = std::fmax((a23 - sv) / a33, (a23 + sv) / a33);
  const double lim = 4.0 * (width > height ? width : height);
  PixelBounds b;
  b.x0 = (int)std::ceil(std::fmax(u_lo - kConeBoxPixelSlack, -1.0));
  b.x1 = (int)std::floor(std::fmin(u_hi + kConeBoxPixelSlack, lim));
  b.y0 = (int)std::ceil(std::fmax(v_lo - kConeBoxPixelSlack, -1.0));
  b.y1 = (int)std::floor(std::fmin(v_hi + kConeBoxPixelSlack, lim));
  return b;
}

PULSAR_HD PixelBounds clamp_bounds(PixelBounds b, int width, int height) {
  b.x0 = b.x0 < 0 ? 0 : b.x0;
  b.y0 = b.y0 < 0 ? 0 : b.y0;
  b.x1 = b.x1 > width - 1 ? width - 1 : b.x1;
  b.y1 = b.y1 > height - 1 ? height - 1 : b.y1;
  return b;
}

template <typename T>
PULSAR_HD Vec3<double> to_double(Vec3<T> v) {
  return Vec3<double>{(double)v.x, (double)v.y, (double)v.z};
}

template <typename T>
PULSAR_HD SphereSetup<T> setup_sphere(const CameraFrame<T>& cam, Vec3<T> centre, T radius, int width, int height) {
  SphereSetup<T> s;
  s.visible = false;
  s.is_tiny = false;
  s.bounds = PixelBounds{0, 0, -1, -1};
  const Vec3<T> c = centre - cam.eye;
  if (cam.orthographic) {
    const T cz = dot(c, cam.z_axis);
    s.closest_depth = cz - radius;
    if (!(s.closest_depth >= cam.min_depth) || !(s.closest_depth <= cam.max_depth)) return s;
    s.is_tiny = radius / cam.pixel_size < T(1);
    // Film coordinates of the centre (orthogonal pixel vectors).
    const Vec3<T> rel = c - cam.p00_rel;  // centre - p00
    const double u = (double)dot(rel, cam.x_unit) / (double)cam.pixel_width;
    const double v = (double)dot(rel, cam.y_unit) / (double)cam.pixel_height;
    const double ru = std::fmax((double)radius / (double)cam.pixel_width, s.is_tiny ? 0.5 : 0.0) + 0.5;
    const double rv = std::fmax((double)radius / (double)cam.pixel_height, s.is_tiny ? 0.5 : 0.0) + 0.5;
    const double lim = 4.0 * (width > height ? width : height);
    s.bounds.x0 = (int)std::ceil(std::fmax(u - ru, -1.0));
    s.bounds.x1 = (int)std::floor(std::fmin(u + ru, lim));
    s.bounds.y0 = (int)std::ceil(std::fmax(v - rv, -1.0));
    s.bounds.y1 = (int)std::floor(std::fmin(v + rv, lim));
  } else {
    const T t = norm(c);
    s.closest_depth = t - radius;
    if (!(s.closest_depth >= cam.min_depth) || !(s.closest_depth <= cam.max_depth)) return s;
    if (!(dot(c, cam.z_axis) / t >= T(kMinForwardCosine))) return s;
    s.is_tiny = radius * cam.focal / (t * cam.pixel_size) < T(1);
    // A pixel hits when the chord |c - t d| <= rho, i.e. the ray's angle to c is at most
    // 2 asin(rho / 2t); rho = r, or the tiny rule's centre radius when that is larger.
    double rho = (double)radius;
    if (s.is_tiny) rho = std::fmax(rho, kTinyCentreRadiusPx * (double)cam.pixel_size * (double)t / (double)cam.focal);
    const double half_sin = rho / (2.0 * (double)t);
    const double angle = half_sin >= 1.0 ? 4.0 : 2.0 * std::asin(half_sin) * (1.0 + 1e-6) + kPairAngleSlack;
    s.bounds = cone_pixel_bounds(normalize(to_double(c)), angle, to_double(cam.pdx), to_double(cam.pdy),
                                 to_double(cam.p00_rel), width, height);
  }
  s.bounds = clamp_bounds(s.bounds, width, height);
  s.visible = !s.bounds.empty();
  return s;
}

}  // namespace pulsar
