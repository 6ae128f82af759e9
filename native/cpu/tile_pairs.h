// A tile's entries as one array per field of the pair test and of the blend, gathered once
// per tile (a pixel's hits then read them from the tile's arrays, not from the scene's
// arrays indexed by sphere, which are far apart in a large scene), and
// the pair tests of one pixel against a run of them (PairBatch). In float with the
// perspective projection, where the build targets AVX and FMA, eight entries go through
// each vector instruction; each lane computes exactly what evaluate_pair computes for its
// entry (the same operations in the same order, each rounded once: the fused operations
// are the FMA instructions std::fma compiles to, and max_or / min_or are the max and min
// instructions, which return their second operand unless the first is greater / less,
// NaN included), so the results are those of the entry-by-entry test, bit for bit.
// Elsewhere the batch runs evaluate_pair entry by entry.
#pragma once

#include <cstdint>

#include "../core/scene_view.h"
#include "cpu_scratch.h"
#include "pulsar/blend.h"
#include "pulsar/pixel_ray.h"

#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#define PULSAR_CPU_PAIR_LANES 8
#endif

namespace pulsar {

template <typename T>
struct TileEntryArrays {
  // The pair test's inputs (SphereRecord: c, dist, the radius and its PairTerms).
  T *cx, *cy, *cz, *dist, *radius, *inv_radius, *inv_two_dist, *tiny_radius;
  T* closest_depth;  // zc
  T* key;            // the forward's termination key of zc (fill_keys)
  T* opacity;        // the sphere's opacity (1 without opacities)
  T* slope;          // its blend_exponent_slope
  T* features;       // [count + kPad, channels]: the sphere's features
  // The pixel box (PixelBounds).
  std::int32_t *x0, *y0, *x1, *y1;

  static constexpr int kReals = 12, kInts = 4;
  // Room past the last entry: a batch reads whole groups of lanes.
  static constexpr std::size_t kPad = 8;
  static std::size_t bytes(std::size_t count, int channels) {
    return (count + kPad) * ((kReals + std::size_t(channels)) * sizeof(T) + kInts * sizeof(std::int32_t));
  }

  // Lays the arrays for `count` entries of `channels` features out in `mem`
  // (bytes(count, channels)).
  static TileEntryArrays in(void* mem, std::size_t count, int channels) {
    const std::size_t n = count + kPad;
    TileEntryArrays a;
    T* reals = static_cast<T*>(mem);
    T** real_fields[kReals] = {&a.cx,         &a.cy,           &a.cz,          &a.dist,          &a.radius,
                               &a.inv_radius, &a.inv_two_dist, &a.tiny_radius, &a.closest_depth, &a.key,
                               &a.opacity,    &a.slope};
    for (int f = 0; f < kReals; ++f) *real_fields[f] = reals + f * n;
    a.features = reals + kReals * n;
    auto* ints = reinterpret_cast<std::int32_t*>(a.features + std::size_t(channels) * n);
    std::int32_t** int_fields[kInts] = {&a.x0, &a.y0, &a.x1, &a.y1};
    for (int f = 0; f < kInts; ++f) *int_fields[f] = ints + f * n;
    return a;
  }

  // Gathers entries[0 .. count) of one camera's records and of the scene's radii,
  // opacities and features (sv: the camera's spheres), and each entry's exponent slope
  // under the call's blend (bp).
  void gather(const std::int32_t* entries, std::int64_t count, const SphereRecord<T>* rec, const SceneView<T>& sv,
              int channels, const BlendParams<T>& bp) const {
    const T* radii = sv.radii;
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int32_t i = entries[k];
      const SphereRecord<T>& r = rec[i];
      opacity[k] = sv.opacity(i);
      slope[k] = blend_exponent_slope(bp, opacity[k]);
      const T* f = sv.features + std::int64_t(i) * channels;
      for (int ch = 0; ch < channels; ++ch) features[k * channels + ch] = f[ch];
      cx[k] = r.c.x;
      cy[k] = r.c.y;
      cz[k] = r.c.z;
      dist[k] = r.dist;
      radius[k] = radii[i];
      inv_radius[k] = r.terms.inv_radius;
      inv_two_dist[k] = r.terms.inv_two_dist;
      tiny_radius[k] = r.terms.tiny_radius;
      closest_depth[k] = r.closest_depth;
      x0[k] = r.bounds.x0;
      y0[k] = r.bounds.y0;
      x1[k] = r.bounds.x1;
      y1[k] = r.bounds.y1;
    }
    // The padding holds finite values: lanes past the end compute, and are dropped.
    for (std::size_t k = 0; k < kPad; ++k) {
      cx[count + k] = cy[count + k] = cz[count + k] = dist[count + k] = T(1);
      radius[count + k] = inv_radius[count + k] = inv_two_dist[count + k] = T(1);
      tiny_radius[count + k] = T(-1);
      closest_depth[count + k] = key[count + k] = opacity[count + k] = slope[count + k] = T(0);
      x0[count + k] = y0[count + k] = 0;
      x1[count + k] = y1[count + k] = -1;
    }
  }

  // key[k] = TerminationTest<T>::key(p, offset, closest_depth[k]) for k < count.
  void fill_keys(std::int64_t count, const BlendParams<T>& p, T offset) const {
    for (std::int64_t k = 0; k < count; ++k) key[k] = TerminationTest<T>::key(p, offset, closest_depth[k]);
  }

  bool in_box(std::int64_t k, int x, int y) const { return (x >= x0[k]) & (x <= x1[k]) & (y >= y0[k]) & (y <= y1[k]); }
};

// The pairs of one pixel and up to kMax (<= 32) consecutive entries of a tile: an array
// per real PairHit member, a bit mask per flag (bit k: entry k). hit: the pixel lies in
// the entry's box and the pair hits.
template <typename T, int kMax>
struct PairBatch {
  static_assert(kMax <= 32, "one bit per entry in a 32-bit mask");
  T kappa[kMax], depth[kMax], delta[kMax], o1[kMax], perp_sq[kMax], half_chord[kMax];
  T ux[kMax], uy[kMax], uz[kMax];  // chord_vector
  std::uint32_t hit = 0, inside = 0, tiny = 0;

  static bool bit(std::uint32_t mask, int k) { return (mask >> k) & 1u; }
  bool hits(int k) const { return bit(hit, k); }

  PairHit<T> get(int k) const {
    PairHit<T> h;
    h.hit = bit(hit, k);
    h.inside = bit(inside, k);
    h.tiny = bit(tiny, k);
    h.kappa = kappa[k];
    h.depth = depth[k];
    h.delta = delta[k];
    h.o1 = o1[k];
    h.perp_sq = perp_sq[k];
    h.half_chord = half_chord[k];
    h.chord_vector = make_vec3(ux[k], uy[k], uz[k]);
    return h;
  }
  void set(int k, const PairHit<T>& h, bool in_box) {
    hit |= std::uint32_t(in_box & h.hit) << k;
    inside |= std::uint32_t(h.inside) << k;
    tiny |= std::uint32_t(h.tiny) << k;
    kappa[k] = h.kappa;
    depth[k] = h.depth;
    delta[k] = h.delta;
    o1[k] = h.o1;
    perp_sq[k] = h.perp_sq;
    half_chord[k] = h.half_chord;
    ux[k] = h.chord_vector.x;
    uy[k] = h.chord_vector.y;
    uz[k] = h.chord_vector.z;
  }

  // Entries first .. first + n of the tile (n <= kMax) against pixel (x, y).
  void evaluate(const CameraFrame<T>& cam, const PixelRay<T>& ray, int x, int y, const TileEntryArrays<T>& a,
                std::int64_t first, int n) {
    hit = inside = tiny = 0;
#ifdef PULSAR_CPU_PAIR_LANES
    if constexpr (std::is_same<T, float>::value) {
      static_assert(kMax % PULSAR_CPU_PAIR_LANES == 0, "whole groups of lanes");
      if (!cam.orthographic) {
        for (int k = 0; k < n; k += PULSAR_CPU_PAIR_LANES) perspective_lanes(ray, x, y, a, first + k, k);
        return;
      }
    }
#endif
    for (int k = 0; k < n; ++k) {
      const std::int64_t e = first + k;
      const PairTerms<T> terms{a.inv_radius[e], a.inv_two_dist[e], a.tiny_radius[e]};
      set(k, evaluate_pair(cam, make_vec3(a.cx[e], a.cy[e], a.cz[e]), a.dist[e], a.radius[e], terms, ray),
          a.in_box(e, x, y));
    }
  }

#ifdef PULSAR_CPU_PAIR_LANES
  // intersect_perspective and finish_hit (intersection.h) for entries e .. e + 7 into
  // slots k .. k + 7, operation for operation, and the box test (PixelBounds::contains).
  void perspective_lanes(const PixelRay<float>& ray, int x, int y, const TileEntryArrays<float>& a, std::int64_t e,
                         int k) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    const __m256 cx = _mm256_loadu_ps(a.cx + e), cy = _mm256_loadu_ps(a.cy + e), cz = _mm256_loadu_ps(a.cz + e);
    const __m256 t = _mm256_loadu_ps(a.dist + e), r = _mm256_loadu_ps(a.radius + e);
    const __m256 inv_r = _mm256_loadu_ps(a.inv_radius + e), inv_two_dist = _mm256_loadu_ps(a.inv_two_dist + e);
    const __m256 tiny_radius = _mm256_loadu_ps(a.tiny_radius + e);
    // fused_difference: fma(-t, d, c) = -(t d) + c, one rounding.
    const __m256 ux = _mm256_fnmadd_ps(t, _mm256_set1_ps(ray.dir.x), cx);
    const __m256 uy = _mm256_fnmadd_ps(t, _mm256_set1_ps(ray.dir.y), cy);
    const __m256 uz = _mm256_fnmadd_ps(t, _mm256_set1_ps(ray.dir.z), cz);
    // fused_square, then chord_sqrt: sqrt(max_or(a, 2^-100)).
    const __m256 chord_sq = _mm256_fmadd_ps(ux, ux, _mm256_fmadd_ps(uy, uy, _mm256_mul_ps(uz, uz)));
    const __m256 delta = _mm256_sqrt_ps(_mm256_max_ps(chord_sq, _mm256_set1_ps(0x1p-100f)));
    const __m256 inside = _mm256_cmp_ps(delta, r, _CMP_LE_OQ);
    const __m256 tiny = _mm256_cmp_ps(delta, tiny_radius, _CMP_LT_OQ);
    const __m256 hit = _mm256_or_ps(inside, tiny);
    const __m256 q = _mm256_mul_ps(delta, inv_two_dist);
    const __m256 o1 = _mm256_sub_ps(t, _mm256_mul_ps(delta, q));
    const __m256 perp_sq = _mm256_mul_ps(chord_sq, _mm256_sub_ps(one, _mm256_mul_ps(q, q)));
    // finish_hit.
    __m256 kappa = _mm256_blendv_ps(_mm256_fnmadd_ps(delta, inv_r, one), one, tiny);
    kappa = _mm256_min_ps(_mm256_max_ps(kappa, zero), one);
    const __m256 rest_sq = _mm256_sub_ps(_mm256_mul_ps(r, r), perp_sq);
    const __m256 has_chord = _mm256_and_ps(inside, _mm256_cmp_ps(rest_sq, zero, _CMP_GT_OQ));
    const __m256 half_chord = _mm256_and_ps(_mm256_sqrt_ps(_mm256_max_ps(rest_sq, zero)), has_chord);
    const __m256 depth = _mm256_sub_ps(o1, half_chord);
    _mm256_storeu_ps(this->kappa + k, kappa);
    _mm256_storeu_ps(this->depth + k, depth);
    _mm256_storeu_ps(this->delta + k, delta);
    _mm256_storeu_ps(this->o1 + k, o1);
    _mm256_storeu_ps(this->perp_sq + k, perp_sq);
    _mm256_storeu_ps(this->half_chord + k, half_chord);
    _mm256_storeu_ps(this->ux + k, ux);
    _mm256_storeu_ps(this->uy + k, uy);
    _mm256_storeu_ps(this->uz + k, uz);
    // Outside the box: x0 > x, x > x1, y0 > y or y > y1; four lanes per comparison.
    const __m128i xv = _mm_set1_epi32(x), yv = _mm_set1_epi32(y);
    auto outside = [&](std::int64_t at) {
      auto load = [at](const std::int32_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at)); };
      const __m128i out = _mm_or_si128(_mm_or_si128(_mm_cmpgt_epi32(load(a.x0), xv), _mm_cmpgt_epi32(xv, load(a.x1))),
                                       _mm_or_si128(_mm_cmpgt_epi32(load(a.y0), yv), _mm_cmpgt_epi32(yv, load(a.y1))));
      return _mm_movemask_ps(_mm_castsi128_ps(out));
    };
    const int outside_bits = outside(e) | (outside(e + 4) << 4);
    const int hit_bits = _mm256_movemask_ps(hit) & ~outside_bits, inside_bits = _mm256_movemask_ps(inside),
              tiny_bits = _mm256_movemask_ps(tiny);
    this->hit |= std::uint32_t(hit_bits) << k;
    this->inside |= std::uint32_t(inside_bits) << k;
    this->tiny |= std::uint32_t(tiny_bits) << k;
  }
#endif
};

}  // namespace pulsar
