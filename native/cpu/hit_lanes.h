// The CPU backward's gradient terms of up to kMax hits of one pixel, eight at a time, in
// float with the perspective projection where the build targets AVX and FMA: the common
// case of render_backward's hit_backward (a hit that does not dominate its pixel, no depth
// statistics, geometry gradients requested). Each lane computes exactly what hit_backward
// computes for its hit through intersect_perspective_backward, finish_hit_grads and the
// resolves of CentreGradSums and RadiusGradSums (intersection.h), and blend.h's exponent
// twins: the same operations in the same order, each rounded once, the selects of the
// scalar code as blends, the sums that start from zero as additions to zero. What the
// hits share (the camera's, the ray's, the depth range's and the others' sums) the caller
// adds up hit by hit in list order from the lanes' results.
#pragma once

#include <cstdint>

#include "pulsar/blend.h"
#include "tile_pairs.h"

namespace pulsar {

#ifdef PULSAR_CPU_PAIR_LANES

template <int kMax>
struct HitLanes {
  static_assert(kMax % PULSAR_CPU_PAIR_LANES == 0 && kMax <= 32, "whole groups of lanes, one mask bit each");
  // Inputs: the blend's terms (HitTerms, the weight and g), the pair (PairHit) and the
  // sphere (SphereRecord: c, dist, its PairTerms, the radius).
  float weight[kMax], g[kMax], opacity[kMax], unit[kMax], slope[kMax];
  float kappa[kMax], depth[kMax], half_chord[kMax], delta[kMax], ux[kMax], uy[kMax], uz[kMax];
  float cx[kMax], cy[kMax], cz[kMax], dist[kMax], radius[kMax], inv_radius[kMax], inv_two_dist[kMax];
  std::uint32_t tiny = 0;  // bit l: the tiny-sphere rule fired
  // Outputs: dL/ds, dL/dopacity, dL/dz and dL/dz * z (the depth range's sums), dL/dc
  // (world), dL/dradius, and t dL/du (what the ray's gradient loses).
  float grad_s[kMax], grad_opacity[kMax], grad_depth[kMax], depth_term[kMax];
  float grad_cx[kMax], grad_cy[kMax], grad_cz[kMax], grad_radius[kMax], ray_x[kMax], ray_y[kMax], ray_z[kMax];

  // Lane l's inputs: the hit's blend weight and terms (HitTerms), pair k of the batch's
  // pairs (PairBatch) and entry `at` of the tile's arrays (TileEntryArrays). The tiny bits
  // are the caller's (set once per batch).
  template <typename Terms, typename Pairs, typename Tile>
  void load(int l, float hit_weight, const Terms& t, const Pairs& pairs, int k, const Tile& tile, std::int64_t at) {
    weight[l] = hit_weight;
    g[l] = t.g;
    opacity[l] = t.opacity;
    unit[l] = t.unit;
    slope[l] = t.slope;
    kappa[l] = pairs.kappa[k];
    depth[l] = pairs.depth[k];
    half_chord[l] = pairs.half_chord[k];
    delta[l] = pairs.delta[k];
    ux[l] = pairs.ux[k];
    uy[l] = pairs.uy[k];
    uz[l] = pairs.uz[k];
    cx[l] = tile.cx[at];
    cy[l] = tile.cy[at];
    cz[l] = tile.cz[at];
    dist[l] = tile.dist[at];
    radius[l] = tile.radius[at];
    inv_radius[l] = tile.inv_radius[at];
    inv_two_dist[l] = tile.inv_two_dist[at];
  }

  void compute(int n, const BlendParams<float>& bp) {
    for (int l = 0; l < n; l += PULSAR_CPU_PAIR_LANES) group(l, bp);
  }

 private:
  void group(int l, const BlendParams<float>& bp) {
    auto load = [l](const float* p) { return _mm256_loadu_ps(p + l); };
    const __m256 zero = _mm256_setzero_ps(), two = _mm256_set1_ps(2.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 weight = load(this->weight), g = load(this->g), unit = load(this->unit);
    const __m256 kappa = load(this->kappa), depth = load(this->depth);
    // hit_backward: grad_s = weight g, dL/dkappa = o unit g, dL/d(factor) = kappa unit g.
    const __m256 grad_s = _mm256_mul_ps(weight, g);
    const __m256 grad_kappa = _mm256_mul_ps(_mm256_mul_ps(load(opacity), unit), g);
    const __m256 grad_factor = _mm256_mul_ps(_mm256_mul_ps(kappa, unit), g);
    // blend_exponent_grad_opacity: g (max_depth - z) / (gamma range).
    const __m256 grad_opacity = _mm256_add_ps(
        grad_factor, _mm256_mul_ps(_mm256_mul_ps(grad_s, _mm256_sub_ps(_mm256_set1_ps(bp.max_depth), depth)),
                                   _mm256_set1_ps(bp.inv_gamma_range)));
    // blend_exponent_grad_depth + normalized_depth_grad of grad_n = 0.
    const __m256 grad_depth = _mm256_add_ps(_mm256_xor_ps(_mm256_mul_ps(grad_s, load(slope)), sign),
                                            _mm256_mul_ps(zero, _mm256_set1_ps(bp.inv_range)));
    // finish_hit_grads.
    const __m256 tiny_mask = lane_mask(tiny >> l);
    const __m256 delta = load(this->delta), half_chord = load(this->half_chord);
    const __m256 closeness = _mm256_blendv_ps(grad_kappa, zero, tiny_mask);
    const __m256 closeness_sum = _mm256_add_ps(zero, _mm256_mul_ps(closeness, delta));
    const __m256 depth_per_h =
        _mm256_and_ps(_mm256_div_ps(grad_depth, half_chord), _mm256_cmp_ps(half_chord, zero, _CMP_GT_OQ));
    const __m256 half_chord_sum = _mm256_sub_ps(zero, depth_per_h);
    // intersect_perspective_backward.
    const __m256 inv_two_dist = load(this->inv_two_dist), inv_radius = load(this->inv_radius);
    const __m256 q = _mm256_mul_ps(delta, inv_two_dist);
    const __m256 depth_part = _mm256_mul_ps(depth_per_h, delta);
    const __m256 p = _mm256_sub_ps(depth_part, _mm256_mul_ps(closeness, inv_radius));
    const __m256 grad_delta =
        _mm256_sub_ps(p, _mm256_mul_ps(_mm256_mul_ps(two, q), _mm256_add_ps(grad_depth, _mm256_mul_ps(q, depth_part))));
    const __m256 grad_t = _mm256_add_ps(grad_depth, _mm256_mul_ps(q, p));
    const __m256 grad_per_delta =
        _mm256_and_ps(_mm256_div_ps(grad_delta, delta), _mm256_cmp_ps(delta, zero, _CMP_GT_OQ));
    const __m256 gux = _mm256_mul_ps(grad_per_delta, load(ux));
    const __m256 guy = _mm256_mul_ps(grad_per_delta, load(uy));
    const __m256 guz = _mm256_mul_ps(grad_per_delta, load(uz));
    const __m256 t = load(dist);
    _mm256_storeu_ps(ray_x + l, _mm256_mul_ps(t, gux));
    _mm256_storeu_ps(ray_y + l, _mm256_mul_ps(t, guy));
    _mm256_storeu_ps(ray_z + l, _mm256_mul_ps(t, guz));
    // CentreGradSums::resolve of sums that start from zero: chord + (dist 2 / (2 t)) c.
    const __m256 scale = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(zero, grad_t), two), inv_two_dist);
    _mm256_storeu_ps(grad_cx + l, _mm256_add_ps(_mm256_add_ps(zero, gux), _mm256_mul_ps(scale, load(cx))));
    _mm256_storeu_ps(grad_cy + l, _mm256_add_ps(_mm256_add_ps(zero, guy), _mm256_mul_ps(scale, load(cy))));
    _mm256_storeu_ps(grad_cz + l, _mm256_add_ps(_mm256_add_ps(zero, guz), _mm256_mul_ps(scale, load(cz))));
    // RadiusGradSums::resolve: closeness / r^2 (as two products by 1 / r) + half_chord r.
    _mm256_storeu_ps(grad_radius + l, _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(closeness_sum, inv_radius), inv_radius),
                                                    _mm256_mul_ps(half_chord_sum, load(radius))));
    _mm256_storeu_ps(this->grad_s + l, grad_s);
    _mm256_storeu_ps(this->grad_opacity + l, grad_opacity);
    _mm256_storeu_ps(this->grad_depth + l, grad_depth);
    _mm256_storeu_ps(depth_term + l, _mm256_mul_ps(grad_depth, depth));
  }

  // All bits set in lane l where bit l of `bits` is.
  static __m256 lane_mask(std::uint32_t bits) {
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    // The AND in the float domain (AVX has no 256-bit integer AND), then the lane's bit as
    // an integer converted to float, compared with zero.
    const __m256 set =
        _mm256_and_ps(_mm256_castsi256_ps(_mm256_set1_epi32(int(bits & 0xffu))), _mm256_castsi256_ps(lane_bit));
    return _mm256_cmp_ps(_mm256_cvtepi32_ps(_mm256_castps_si256(set)), _mm256_setzero_ps(), _CMP_NEQ_OQ);
  }
};

#endif

}  // namespace pulsar
