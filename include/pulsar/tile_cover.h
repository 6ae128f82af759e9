// Certain coverage of a pixel rectangle by one sphere, and the lower bound of its blend
// weight there. The CUDA binning uses it to bound, per tile, the depth beyond which no
// pixel of the tile can process a sphere (native/cuda/tile_depth_bound.cu). No derivative:
// the bound only decides which (tile, sphere) instances are stored, never a value.
#pragma once

#include <cmath>

#include "pulsar/camera.h"
#include "pulsar/hd.h"
#include "pulsar/pixel_ray.h"
#include "pulsar/sphere_setup.h"
#include "pulsar/vec3.h"

namespace pulsar {

// The core of a sphere: the pixels within chord (perspective) or in-plane distance
// (orthographic) kCoreChord * r of its centre, where the closeness is at least 1/4.
// 3/4 rather than 1/2 lets spheres from about 15 px radius cover a tile
// (kMinCoverRadiusPx), so that more tiles get a tight depth bound and binning stores
// fewer instances.
constexpr double kCoreChord = 0.75;

// Below this projected radius (pixels) the core (kCoreChord of it) cannot hold a 16 x 16
// tile, whose half diagonal is 11.3 px.
constexpr double kMinCoverRadiusPx = 15.5;

// The sphere's radius on the film in pixels (perspective: at its centre's distance t).
template <typename T>
PULSAR_HD double projected_radius_px(const CameraFrame<T>& cam, T r, T t) {
  return cam.orthographic ? double(r) / double(cam.pixel_size)
                          : double(r) * double(cam.focal) / (double(t) * double(cam.pixel_size));
}

// Whether a sphere may cover a whole tile (tile_depth_bound.cu): large enough on the film,
// and drawn with a positive opacity.
template <typename T>
PULSAR_HD bool may_cover_tiles(const CameraFrame<T>& cam, T r, T t, T opacity) {
  return opacity > T(0) && projected_radius_px(cam, r, t) >= kMinCoverRadiusPx;
}

// Unclamped pixel bounds of the sphere's core. Only a hint of where to look: every tile
// found in it is verified by covered_closeness. Empty when the sphere is too large
// against its distance for the verification to be valid.
// c: centre - eye (world units), t = |c|.
template <typename T>
PULSAR_HD PixelBounds core_region_bounds(const CameraFrame<T>& cam, Vec3<T> c, T t, T r, int width, int height) {
  const PixelBounds none{1, 1, 0, 0};
  if (cam.orthographic) {
    const Vec3<T> rel = c - cam.p00_rel;  // centre - p00
    const double u = (double)dot(rel, cam.x_unit) / (double)cam.pixel_width;
    const double v = (double)dot(rel, cam.y_unit) / (double)cam.pixel_height;
    const double ru = kCoreChord * (double)r / (double)cam.pixel_width;
    const double rv = kCoreChord * (double)r / (double)cam.pixel_height;
    const double lim = 4.0 * (width > height ? width : height);
    PixelBounds b;
    b.x0 = (int)std::ceil(std::fmax(u - ru, -1.0));
    b.x1 = (int)std::floor(std::fmin(u + ru, lim));
    b.y0 = (int)std::ceil(std::fmax(v - rv, -1.0));
    b.y1 = (int)std::floor(std::fmin(v + rv, lim));
    return b;
  }
  // covered_closeness takes the largest chord over a rectangle at its corners, which holds
  // when the cone of rays within the chord meets the film plane in an ellipse: keep the
  // sphere small against its distance and well in front.
  if (!(r <= T(0.5) * t) || !(dot(c, cam.z_axis) >= T(0.6) * t)) return none;
  const double angle = 2.0 * std::asin(0.5 * kCoreChord * (double)r / (double)t);
  return cone_pixel_bounds(normalize(to_double(c)), angle, to_double(cam.pdx), to_double(cam.pdy),
                           to_double(cam.p00_rel), width, height);
}

// The smallest closeness kappa of the sphere over the pixel centres of the rectangle
// [x0, x1] x [y0, y1], or 0 when some pixel might miss it. The chord is largest at a
// corner: the pixels within a given chord form an ellipse (perspective, under the
// conditions core_region_bounds checks) or a disk (orthographic), both convex.
// c, dist: as for evaluate_pair.
template <typename T>
PULSAR_HD T covered_closeness(const CameraFrame<T>& cam, Vec3<T> c, T dist, T r, int x0, int y0, int x1, int y1) {
  T smallest = T(1);
  const PairTerms<T> k = pair_terms(cam, dist, r, false);
  for (int corner = 0; corner < 4; ++corner) {
    const int x = (corner & 1) ? x1 : x0, y = (corner & 2) ? y1 : y0;
    const PairHit<T> h = evaluate_pair(cam, c, dist, r, k, pixel_ray(cam, x, y));
    if (!h.inside) return T(0);
    smallest = h.kappa < smallest ? h.kappa : smallest;
  }
  return smallest;
}

}  // namespace pulsar
