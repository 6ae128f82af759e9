// The columns of each pixel row that a perspective sphere may hit: a superset of the
// pixels its pair test hits, like the screen box (sphere_setup.h) but row by row. The
// CUDA two-pixel forward (large spheres, float) takes an entry's coverage of a tile's
// pixels from it where the box covers more than a few (render_forward.cu, stage_batch),
// and the backward's whole-warp kernels the rectangle of the tile that an entry's pairs
// walk (bounds_within; render_backward.cu, stage_entry): about a fifth of a round
// sphere's box lies outside its image (1 - pi/4 of a disc's bounding square), and each of
// those pixels would cost a visit that misses. No derivative: it only decides which
// pixels test a pair, and a pixel it leaves out would have missed (docs/model.md section
// 6: skipping entries that do not hit changes nothing).
//
// Geometry. A pixel hits only when its ray lies within the cone of half-angle theta about
// the centre's direction a, theta = 2 asin(rho / 2t) grown by kPairAngleSlack, rho the
// radius or the tiny-sphere rule's chord, whichever is larger (PairTerms::hit_chord).
// With the sensor offset p(u, v) = p_o + u pdx + v pdy of the pixel (ox + u, oy + v), the
// cone is |p x a|^2 <= sin^2(theta) |p|^2, the conic
//   g(u, v) = A u^2 + 2 B u v + C v^2 + 2 D u + 2 E v + F <= 0,
// an ellipse when the cone lies in front of the eye (A > 0, A C - B^2 > 0). On row v it
// spans u_c(v) -+ sqrt(w2(v)), u_c linear and w2 quadratic in v.
//
// Rounding. The cross products keep their digits (p x a is small only where p and a agree,
// and is formed from the inputs, not as a difference of the large terms of g), the
// vectors are scaled by 1 / |p_o| first (no coefficient near float's flush-to-zero range,
// whatever the world's units), and the origin (ox, oy) is the box's centre pixel, so that
// u_c and w2 carry relative errors of a few float ulps of the cone's extent L (pixels),
// also where cancellation in p x a costs digits (theta down to 1e-4). Every interval is
// widened by kConeRowAreaSlack L^2 under the square root and kConeRowPixelSlack outside
// it, which exceeds that rounding by orders of magnitude; sin(theta) is bounded from above
// (ConeRows::of). Where the cone is wide (theta above about 30 degrees) or the conic not
// an ellipse, `active` is false and every row keeps the box's columns.
#pragma once

#include <cmath>

#include "pulsar/hd.h"
#include "pulsar/intersection.h"
#include "pulsar/sphere_setup.h"
#include "pulsar/vec3.h"

namespace pulsar {

constexpr double kConeRowPixelSlack = 0.25;  // pixels added on each side of a row's interval
constexpr double kConeRowAreaSlack = 1e-4;   // times L^2, added to w2 before its square root

template <typename T>
struct ConeRows {
  bool active = false;  // false: every row of the box may hit
  int ox = 0, oy = 0;   // origin pixel of (u, v): the box's centre
  T uc0 = 0, uc1 = 0;   // u_c(v) = uc0 + uc1 v
  T w0 = 0, w1 = 0, w2 = 0;  // w2(v) = w0 + w1 v + w2 v^2, slack included
  T a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;  // g's coefficients (A, B, C, D, E, F) over |p_o|^2

  // The cone of a sphere with centre - eye `centre` (world), t = |centre|, rho as above
  // and screen box `box` (non-empty), under the perspective camera whose film vectors are
  // p00_rel, pdx and pdy (CameraFrame's).
  static PULSAR_HD ConeRows of(Vec3<T> p00_rel, Vec3<T> pdx, Vec3<T> pdy, Vec3<T> centre, T t, T rho, PixelBounds box) {
    ConeRows r;
    const T h = rho / (T(2) * t);
    if (!(t > T(0)) || !(h < T(0.25))) return r;  // a wide cone (over about 30 degrees)
    // sin(theta) <= 2 h sqrt(1 - h^2) + 2.1e-6 h + kPairAngleSlack: the box's angle is
    // 2 asin(h) (1 + 1e-6) + slack, |d sin| <= |d theta|, 2 asin(h) <= 2.1 h for h < 1/4;
    // grown by 1e-5 for this line's own rounding.
    const T s = (T(2) * h * std::sqrt(T(1) - h * h) + T(2.1e-6) * h + T(kPairAngleSlack)) * T(1 + 1e-5);
    const T s2 = s * s;
    r.ox = (box.x0 + box.x1) / 2;
    r.oy = (box.y0 + box.y1) / 2;
    const Vec3<T> po_raw = p00_rel + T(r.ox) * pdx + T(r.oy) * pdy;
    const T scale = T(1) / norm(po_raw);
    const Vec3<T> po = scale * po_raw, du = scale * pdx, dv = scale * pdy;
    const Vec3<T> axis = (T(1) / t) * centre;
    const Vec3<T> U = cross(po, axis), V = cross(du, axis), W = cross(dv, axis);
    r.a = dot(V, V) - s2 * dot(du, du);
    r.b = dot(V, W) - s2 * dot(du, dv);
    r.c = dot(W, W) - s2 * dot(dv, dv);
    r.d = dot(U, V) - s2 * dot(po, du);
    r.e = dot(U, W) - s2 * dot(po, dv);
    r.f = dot(U, U) - s2 * dot(po, po);
    const T det = r.a * r.c - r.b * r.b;
    if (!(r.a > T(0)) || !(det > T(0))) return r;
    const T inv_a = T(1) / r.a;
    r.uc1 = -r.b * inv_a;
    r.uc0 = -r.d * inv_a;
    // w2(v) = ((B v + D)^2 - A (C v^2 + 2 E v + F)) / A^2, plus the slack.
    const T inv_a2 = inv_a * inv_a;
    const T half_w = T(box.x1 - box.x0) * T(0.5) + T(1), half_h = T(box.y1 - box.y0) * T(0.5) + T(1);
    r.w2 = -det * inv_a2;
    r.w1 = T(2) * (r.b * r.d - r.a * r.e) * inv_a2;
    r.w0 = (r.d * r.d - r.a * r.f) * inv_a2 + T(kConeRowAreaSlack) * (half_w * half_w + half_h * half_h);
    r.active = true;
    return r;
  }

  // Whether pixel (x, y) lies strictly within the (unwidened) ellipse: g < 0. Rounding
  // may err either way at its rim; callers use it only to skip the rows' work where a
  // rectangle's corners are all inside, keeping the whole rectangle (the ellipse is
  // convex): an error there keeps pixels or computes rows, never drops a hit.
  PULSAR_HD bool inside(int x, int y) const {
    const T u = T(x - ox), v = T(y - oy);
    return (a * u + T(2) * (b * v + d)) * u + (c * v + T(2) * e) * v + f < T(0);
  }

  // The smallest rectangle within `box` (pixels) that holds the columns of each of its
  // rows: the pixels of the box the sphere may hit (empty: none). The whole box where its
  // four corners lie inside the ellipse (it is convex: then the box holds no miss to cut).
  // Only for an active cone.
  PULSAR_HD PixelBounds bounds_within(PixelBounds box) const {
    if (inside(box.x0, box.y0) && inside(box.x1, box.y0) && inside(box.x0, box.y1) && inside(box.x1, box.y1))
      return box;
    PixelBounds out{box.x1 + 1, box.y1 + 1, box.x0 - 1, box.y0 - 1};  // empty until a row has columns
    for (int y = box.y0; y <= box.y1; ++y) {
      int lo, hi;
      columns(y, lo, hi);
      lo = lo > box.x0 ? lo : box.x0;
      hi = hi < box.x1 ? hi : box.x1;
      if (lo > hi) continue;
      out.x0 = lo < out.x0 ? lo : out.x0;
      out.x1 = hi > out.x1 ? hi : out.x1;
      out.y0 = y < out.y0 ? y : out.y0;
      out.y1 = y;
    }
    return out;
  }

  // The columns [lo, hi] of pixel row y that may hit (lo > hi: none), before any clamp to
  // a box; only for an active cone.
  PULSAR_HD void columns(int y, int& lo, int& hi) const {
    const T v = T(y - oy);
    const T w = (w2 * v + w1) * v + w0;
    if (!(w >= T(0))) {
      lo = 1;
      hi = 0;
      return;
    }
    const T half = std::sqrt(w) + T(kConeRowPixelSlack);
    const T uc = uc0 + uc1 * v;
    // Clamped before the conversion: the interval lies within the box, whose pixels are
    // image pixels (at most 32767 from the origin: int16 boxes).
    const T lo_u = std::fmax(uc - half, T(-40000)), hi_u = std::fmin(uc + half, T(40000));
    lo = ox + int(std::ceil(lo_u));
    hi = ox + int(std::floor(hi_u));
  }
};

}  // namespace pulsar
