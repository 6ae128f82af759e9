// Ray-sphere intersection of one pixel and one sphere (docs/model.md section 4), for the
// perspective and the orthographic projection, each with its derivative twin.
//
// Forward: closeness kappa in [0, 1] and intersection depth z (world units, along the
// ray). Backward: given dL/dkappa and dL/dz, the gradients of the inputs. Points where
// the function has a kink (a ray through the centre, a tangent ray, the tiny-sphere rule
// switching) get the zero subgradient there, never NaN or Inf.
#pragma once

#include <cmath>
#include <type_traits>

#include "pulsar/exact_arith.h"
#include "pulsar/hd.h"
#include "pulsar/vec3.h"

namespace pulsar {

// a / b for a length b > 0 of the scene (a chord, half chord or distance: under the
// magnitude limit, far from the 2^126 where the fast reciprocal flushes). On the GPU in
// float the reciprocal and a product (2 instructions; the fast division's range checks
// take 3 more), within 2 ulp: the backward's gradients agree with the CPU to 1e-4.
template <typename T>
PULSAR_HD T div_length(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value) return __fdividef(a, b);
#endif
  return a / b;
}

// The tiny-sphere rule: a sphere projecting to under one pixel hits its centre pixel,
// perspective: the chord delta < this * pixel_size * t / focal (docs/model.md section 4).
constexpr double kTinyCentreRadiusPx = 0.75;

// Per (camera, sphere) constants of the pair tests, computed once per call by the setup
// stage (pair_terms in pixel_ray.h) so that the per-pixel work divides by nothing that
// belongs to the sphere.
template <typename T>
struct PairTerms {
  T inv_radius;    // 1 / r
  T inv_two_dist;  // perspective: 1 / (2 |c|); orthographic: 0 (unused)
  T tiny_radius;   // where the tiny-sphere rule applies: perspective, the chord below which
                   // it hits (0.75 ps t / f); orthographic, 0. Negative: it does not apply

  // The chord within which a pixel's ray hits a sphere of radius r: r, or the tiny rule's
  // where that is larger (the cone of hitting rays, cone_rows.h).
  PULSAR_HD T hit_chord(const T& r) const { return r > tiny_radius ? r : tiny_radius; }
};

template <typename T>
struct PairHit {
  bool hit = false;     // processed as a hit: inside, or the tiny-sphere rule
  bool inside = false;  // delta <= r
  bool tiny = false;    // the tiny-sphere rule fired: kappa = 1
  T kappa = 0;          // closeness
  T depth = 0;          // z = o1 - h
  // Intermediates for the backward twin.
  T delta = 0;          // chord (perspective) or in-plane distance (orthographic)
  T o1 = 0;             // depth of the centre's foot point along the ray
  T perp_sq = 0;        // l^2, l the distance of the centre from the ray
  T half_chord = 0;     // h
  Vec3<T> chord_vector{0, 0, 0};  // perspective: u = c - t d, whose length is delta
};

// Shared tail: closeness and depth from delta, o1 and l^2. inv_r = 1 / r. The half chord
// takes r^2 - l^2 directly: forming l first would cost a square root and be no more
// accurate (l carries the same relative rounding). The closeness cancels near a
// silhouette and, with a small gamma, one ulp of it can move a pixel by 1e-4 (the
// sphere's weight there is kappa exp(s), exp(s) up to 1e5): it is one fused operation
// (exact_arith.h), like the chord it comes from, so that every backend gets its bits.
template <typename T>
PULSAR_HD void finish_hit(PairHit<T>& h, T r, T inv_r) {
  h.kappa = h.tiny ? T(1) : fma_rn(-h.delta, inv_r, T(1));
  h.kappa = min_or(max_or(h.kappa, T(0)), T(1));  // min and max instructions, no branch
  const T rest_sq = r * r - h.perp_sq;
  h.half_chord = (h.inside && rest_sq > T(0)) ? std::sqrt(rest_sq) : T(0);
  h.depth = h.o1 - h.half_chord;
}

// dL/dr of pairs of one sphere, in the two parts finish_hit_backward gives: r enters a
// pair through kappa = 1 - delta / r (dkappa/dr = delta / r^2) and through the half chord
// h = sqrt(r^2 - l^2) (dh/dr = r / h). Summed over any number of the sphere's pairs, they
// resolve once (the CUDA backward: once per entry, 2 operations per pair instead of 4).
template <typename T>
struct RadiusGradSums {
  T closeness = 0;   // sum of dL/dkappa * delta
  T half_chord = 0;  // sum of dL/dh / h
  PULSAR_HD T resolve(T r, T inv_r) const { return closeness * inv_r * inv_r + half_chord * r; }
};

// finish_hit's dependence on delta, r and l^2, shared by both twins: kappa = 1 - delta / r,
// or 1 by the tiny-sphere rule (no dependence then), and z = o1 - h with h = sqrt(r^2 - l^2)
// (no dependence where h = 0). Adds dL/dr's parts to grad_r; returns the closeness
// gradient that counts and dL/dz / h. Selects instead of branches (around a branch the
// GPU zeroes the outputs first).
template <typename T>
struct FinishHitGrads {
  T closeness;    // dL/dkappa, 0 by the tiny-sphere rule
  T depth_per_h;  // dL/dz / h, 0 where h = 0
};
template <typename T>
PULSAR_HD FinishHitGrads<T> finish_hit_grads(const PairHit<T>& h, T grad_kappa, T grad_depth,
                                             RadiusGradSums<T>& grad_r) {
  const T closeness = h.tiny ? T(0) : grad_kappa;
  grad_r.closeness += closeness * h.delta;
  const T depth_per_h = h.half_chord > T(0) ? div_length(grad_depth, h.half_chord) : T(0);
  grad_r.half_chord -= depth_per_h;  // dL/dh = -dL/dz
  return {closeness, depth_per_h};
}

// Twin of finish_hit: from dL/dkappa and dL/dz, dL/ddelta, dL/do1, dL/d(l^2) and dL/dr (as
// its parts).
template <typename T>
PULSAR_HD void finish_hit_backward(const PairHit<T>& h, T inv_r, T grad_kappa, T grad_depth, T& grad_delta, T& grad_o1,
                                   T& grad_perp_sq, RadiusGradSums<T>& grad_r) {
  const FinishHitGrads<T> f = finish_hit_grads(h, grad_kappa, grad_depth, grad_r);
  grad_delta = -f.closeness * inv_r;
  grad_o1 = grad_depth;                   // z = o1 - h
  grad_perp_sq = T(0.5) * f.depth_per_h;    // dz/d(l^2) = -dh/d(l^2) = 1 / (2h)
}

// Perspective. c = centre - eye, t = |c| (> 0), r the radius, k its PairTerms, d the
// pixel's unit ray.
//
// docs/model.md defines o1 = min(c.d, t) and l = sqrt((t + o1)(t - o1)). With |d| = 1 the
// chord gives both without cancellation: c.d = t - delta^2 / (2t) (never above t, so the
// min is that value) and l^2 = delta^2 (1 - delta^2 / (4 t^2)). In float32 the literal
// forms lose most digits of l for a sphere far away (t - o1 ~ l^2 / 2t), these keep them.
// c - t d cancels to a length under r from two of length t: the chord is computed with
// fused operations (exact_arith.h), the product t d unrounded, so that every backend gets
// the same one.
template <typename T>
PULSAR_HD PairHit<T> intersect_perspective(Vec3<T> c, T t, T r, const PairTerms<T>& k, Vec3<T> d) {
  PairHit<T> h;
  h.chord_vector = fused_difference(c, t, d);
  const T chord_sq = fused_square(h.chord_vector);
  h.delta = chord_sqrt(chord_sq);
  h.inside = h.delta <= r;
  h.tiny = h.delta < k.tiny_radius;  // never when negative
  h.hit = h.inside || h.tiny;
  // The rest is computed for a miss too (its values then mean nothing): most pairs of a
  // sphere's box hit, and a branch around these few products, with the values the GPU
  // zeroes on the way out, costs every pair more than the products cost a miss.
  const T q = h.delta * k.inv_two_dist;  // sin(phi / 2), phi the angle between c and d
  h.o1 = t - h.delta * q;
  h.perp_sq = chord_sq * (T(1) - q * q);  // delta^2 before its root: one product less
  finish_hit(h, r, k.inv_radius);
  return h;
}

// dL/dc of perspective pairs of one sphere, in the two parts the twin below gives: c
// enters a pair through u = c - t d (dL/du) and through t = |c| (dL/dt; dt/dc = c / t).
// Summed over any number of the sphere's pairs, they resolve once: dL/dc = sum dL/du +
// (sum dL/dt / t) c. (The CUDA backward resolves once per entry: 4 additions per pair
// where adding each pair's dL/dc takes 6 operations and 2 products.)
template <typename T>
struct CentreGradSums {
  Vec3<T> chord{0, 0, 0};  // sum of dL/du
  T dist = 0;              // sum of dL/dt
  PULSAR_HD Vec3<T> resolve(Vec3<T> c, const PairTerms<T>& k) const {
    return chord + (dist * T(2) * k.inv_two_dist) * c;  // 1 / t = 2 inv_two_dist
  }
};

// Twin of intersect_perspective: accumulates dL/dc (as its parts, above), dL/dr and dL/dd
// (d enters through the pair's chord vector u = c - t d alone).
template <typename T>
PULSAR_HD void intersect_perspective_backward(const PairHit<T>& h, T t, const PairTerms<T>& k, T grad_kappa,
                                              T grad_depth, CentreGradSums<T>& grad_c, RadiusGradSums<T>& grad_r,
                                              Vec3<T>& grad_d) {
  const FinishHitGrads<T> f = finish_hit_grads(h, grad_kappa, grad_depth, grad_r);
  // With g = dL/dz and q = delta / (2t): o1 = t - delta^2 / (2t) (do1/dt = 1 + 2 q^2,
  // do1/ddelta = -2q), l^2 = delta^2 - delta^4 / (4 t^2) (dl^2/ddelta = 2 delta (1 - 2 q^2),
  // dl^2/dt = 4 q^3 delta) and dz/dl^2 = 1 / (2h). delta = |u| with u = c - t d adds, through
  // du/dt = -d, -dL/du . d = dL/ddelta q to dL/dt (u . d = c . d - t = o1 - t = -delta q).
  // Collected, with P = (g / h) delta - dL/dkappa / r:
  //   dL/ddelta = P - 2q (g + q (g / h) delta),   dL/dt = g + q P
  // (the q^2 terms of dL/dt cancel exactly; summed term by term they cost the CUDA
  // backward's round more instructions, and in float they round where this form does not).
  const T q = h.delta * k.inv_two_dist;
  const T depth_part = f.depth_per_h * h.delta;  // (g / h) delta
  const T p = depth_part - f.closeness * k.inv_radius;
  const T grad_delta = p - T(2) * q * (grad_depth + q * depth_part);
  const T grad_t = grad_depth + q * p;
  // dL/du = (dL/ddelta / delta) u, the zero subgradient at delta = 0 (a ray through the
  // centre). Without a branch: around one the GPU backward zeroes six values per pair to
  // skip these few products.
  const T grad_per_delta = h.delta > T(0) ? div_length(grad_delta, h.delta) : T(0);
  const Vec3<T> grad_u = grad_per_delta * h.chord_vector;
  grad_d -= t * grad_u;
  grad_c.chord += grad_u;
  grad_c.dist += grad_t;
}

// Orthographic. (a, b) = (centre - sensor point) in the unit pixel frame, cz = the
// centre's depth along the optical axis from the eye, k the sphere's PairTerms (the
// tiny-sphere rule applies when r < pixel size; its centre pixel test is
// |a| < pixel_width / 2 and |b| < pixel_height / 2).
template <typename T>
PULSAR_HD PairHit<T> intersect_orthographic(T a, T b, T cz, T r, const PairTerms<T>& k, T pixel_width, T pixel_height) {
  PairHit<T> h;
  h.delta = chord_sqrt(fma_rn(a, a, mul_rn(b, b)));  // fused, as the perspective chord
  h.inside = h.delta <= r;
  h.tiny = k.tiny_radius >= T(0) && std::abs(a) < T(0.5) * pixel_width && std::abs(b) < T(0.5) * pixel_height;
  h.hit = h.inside || h.tiny;  // the rest for a miss too, as intersect_perspective
  h.o1 = std::abs(cz);
  h.perp_sq = a * a + b * b;  // l = delta
  finish_hit(h, r, k.inv_radius);
  return h;
}

// Twin of intersect_orthographic: accumulates dL/da, dL/db, dL/dcz, dL/dr (as its parts).
template <typename T>
PULSAR_HD void intersect_orthographic_backward(const PairHit<T>& h, T a, T b, T cz, const PairTerms<T>& k, T grad_kappa,
                                               T grad_depth, T& grad_a, T& grad_b, T& grad_cz,
                                               RadiusGradSums<T>& grad_r) {
  T grad_delta, grad_o1, grad_perp_sq;
  finish_hit_backward(h, k.inv_radius, grad_kappa, grad_depth, grad_delta, grad_o1, grad_perp_sq, grad_r);
  grad_delta += grad_perp_sq * T(2) * h.delta;  // l^2 = delta^2
  if (h.delta > T(0)) {
    const T grad_per_delta = div_length(grad_delta, h.delta);
    grad_a += grad_per_delta * a;
    grad_b += grad_per_delta * b;
  }
  grad_cz += cz >= T(0) ? grad_o1 : -grad_o1;  // o1 = |cz|
}

}  // namespace pulsar
