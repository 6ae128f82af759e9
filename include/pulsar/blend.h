// Depth-weighted soft blending (docs/model.md sections 4-6): the exponent of one hit, the
// online-softmax accumulation, and the early-termination depth; derivatives beside them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "pulsar/depth_stats.h"
#include "pulsar/hd.h"

namespace pulsar {

// Per-image constants of the blend.
template <typename T>
struct BlendParams {
  T gamma;        // softness in [1e-5, 1]
  T inv_gamma;    // 1 / gamma
  T min_depth;    // resolved near depth (world units)
  T max_depth;    // far depth (world units)
  T inv_range;    // 1 / (max_depth - min_depth)
  T inv_gamma_range;  // 1 / (gamma (max_depth - min_depth)): the exponent's slope per unit opacity
  T bg_exponent;  // s_bg = beta / gamma
  T log_odds;     // ln(p / (1 - p)) of percent_allowed_difference p
  bool early_stop;  // p > 0

  PULSAR_HD T depth_range() const { return max_depth - min_depth; }
};

// Normalised depth n = (z - min_depth) / (max_depth - min_depth).
template <typename T>
PULSAR_HD T normalized_depth(const BlendParams<T>& p, T depth) {
  return (depth - p.min_depth) * p.inv_range;
}

// The depth range's part of normalized_depth's derivative, summed over many hits (a
// tile's or a lane's): dn/dmin = (z - max) / range^2 and dn/dmax = -(z - min) / range^2,
// so with g = dL/dn / range per hit, dL/dmin = (Z - max G) / range and
// dL/dmax = -(Z - min G) / range for the sums G = sum g and Z = sum g z. Two operations
// per hit instead of six. Z - max G rounds to about ulp(max) sum |g|, the bound of the
// per-hit form too (each g (z - max) rounds to ulp(max) |g| at most), though that form is
// exact in z - max where z lies within a factor 2 of max. (Each backend sums these camera
// terms in its own order in either form; the gradient parity tests bound the difference.)
template <typename T>
struct DepthRangeSums {
  T g = 0;   // sum of dL/dn / range
  T gz = 0;  // sum of dL/dn / range * z (z in world units)

  // Adds one hit's dL/dz (dL/dn / range) at depth z.
  PULSAR_HD void add(T grad_depth, T depth) {
    g += grad_depth;
    gz += grad_depth * depth;
  }
  // Adds to dL/dmin (grad_min_depth) and dL/dmax (grad_max_depth).
  PULSAR_HD void finish(const BlendParams<T>& p, T& grad_min_depth, T& grad_max_depth) const {
    grad_min_depth += (gz - p.max_depth * g) * p.inv_range;
    grad_max_depth -= (gz - p.min_depth * g) * p.inv_range;
  }
};

// dL/dz = dL/dn dn/dz (dn/dz = 1 / range) at fixed depth range.
template <typename T>
PULSAR_HD T normalized_depth_grad(const BlendParams<T>& p, T grad_n) {
  return grad_n * p.inv_range;
}

// Exponent s = o (1 - n) / gamma of a hit with opacity o at depth z (docs/model.md
// section 4), in the form s = b (max_depth - z) with the sphere's slope b = o / (gamma
// range) (blend_exponent_slope): 1 - n = (max_depth - z) / range. Two operations per hit
// from z where the form in n takes five (a subtraction, a product and a subtraction for
// 1 - n, two products), with the slope once per sphere; and as accurate: max_depth - z is
// exact where z lies within a factor 2 of max_depth, where 1 - n cancels after two
// roundings. Every backend computes s this way (so that they round it alike: at small
// gamma, one ulp of s moves a weight by more than the backends' parity). ds/dz = -b;
// ds/do = (max_depth - z) / (gamma range); the depth range's terms go through n
// (DepthRangeSums: dL/dz of a hit is dL/dn / range).
template <typename T>
PULSAR_HD T blend_exponent_slope(const BlendParams<T>& p, T opacity) {
  return opacity * p.inv_gamma_range;
}
template <typename T>
PULSAR_HD T blend_exponent(const BlendParams<T>& p, T slope, T depth) {
  return slope * (p.max_depth - depth);
}

// Twin of blend_exponent, in its two parts: given g = dL/ds, dL/do through s (the slope's
// opacity) and dL/dz (ds/dz = -slope).
template <typename T>
PULSAR_HD T blend_exponent_grad_opacity(const BlendParams<T>& p, T depth, T g) {
  return g * (p.max_depth - depth) * p.inv_gamma_range;
}
template <typename T>
PULSAR_HD T blend_exponent_grad_depth(T slope, T g) {
  return -(g * slope);
}

// exp(x) of an exponent difference x <= 0 in the online softmax. On the GPU in float the
// hardware exp2 of x log2(e): within about 2 ulp plus |x| 2^-24 relative (x > -87, below
// which both flush to 0), 2 instructions where expf takes 10 (the forward evaluates one
// per hit). The CUDA backward recomputes the weights with it too (render_backward.cu);
// within about 5e-6 relative down to -87, far under the gradients' 1e-4 parity with the
// CPU.
template <typename T>
PULSAR_HD T softmax_exp(T x) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value) return __expf(x);
#endif
  return std::exp(x);
}

// Running normaliser of the online softmax: the total weight is D * exp(m).
// Starts from the background: m = s_bg, D = 1 (its weight exp(s_bg)).
template <typename T>
struct OnlineSoftmax {
  T m;  // running maximum exponent
  T D;  // normaliser relative to exp(m), background included

  PULSAR_HD static OnlineSoftmax start(const BlendParams<T>& p) { return {p.bg_exponent, T(1)}; }

  // Adds a weight factor * exp(s). Returns that weight relative to the new exp(m) and sets
  // rescale to the factor by which earlier accumulations (relative to the old m) shrink.
  PULSAR_HD T add(T s, T factor, T& rescale) {
    if (s > m) {
      rescale = softmax_exp(m - s);
      m = s;
      D = D * rescale + factor;
      return factor;
    }
    rescale = T(1);
    const T w = factor * softmax_exp(s - m);
    D += w;
    return w;
  }

  // The same in two steps, for a caller that keeps the rescale apart from the common
  // path (the CUDA forward): if raises(s), raise(s) makes s the maximum and returns the
  // factor (< 1) by which earlier accumulations shrink; then add_at_most_max(s, factor)
  // adds the weight factor * exp(s) (s <= m now) and returns it relative to exp(m): the
  // factor itself after a raise (exp(0) = 1). The same values as add, each sum rounded
  // in two steps where add fused one.
  PULSAR_HD bool raises(T s) const { return s > m; }
  PULSAR_HD T raise(T s) {
    const T rescale = softmax_exp(m - s);
    m = s;
    D *= rescale;
    return rescale;
  }
  PULSAR_HD T add_at_most_max(T s, T factor) {
    const T w = factor * softmax_exp(s - m);
    D += w;
    return w;
  }
};

// A share's own normaliser after a partial render (RenderOptions::partial): its blend
// started from the background's weight (D = 1 at m = s_bg), which the merge of shares adds
// once; this takes it out, D_share = D - exp(s_bg - m) >= 0 (clamped: exp(s_bg - m) and the
// rescales D went through may round apart by an ulp). The share's feature sum is A = C D for
// the image C it blended with zero background features. The merge (docs/model.md section 5)
// is m = max m_r, D = exp(s_bg - m) + sum D_r exp(m_r - m), A = exp(s_bg - m) bg +
// sum A_r exp(m_r - m), C = A / D. No derivative: backward takes the merged state.
template <typename T>
PULSAR_HD T partial_normalizer(T norm_d, T m, T bg_exponent) {
  const T share = norm_d - std::exp(bg_exponent - m);
  return share > T(0) ? share : T(0);
}

// One pixel of a partial render, in place: its image C [channels] becomes A = C D and its
// blend state (m, D) becomes (m, partial_normalizer).
template <typename T>
PULSAR_HD void to_partial_state(T* features, int channels, T* state, T bg_exponent) {
  const T m = state[0], norm_d = state[1];
  for (int c = 0; c < channels; ++c) features[c] *= norm_d;
  state[1] = partial_normalizer(norm_d, m, bg_exponent);
}

// w / total for weights 0 <= w <= total, total > 0: the share of one weight in a sum that
// contains it (in [0, 1] after rounding too). On the GPU in float the fast division (2
// instructions): the forward there flushes denormals, so total is a normal number, far
// below the 2^126 where the fast reciprocal flushes (total <= hits + 1).
template <typename T>
PULSAR_HD T weight_share(T w, T total) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value) return fminf(__fdividef(w, total), 1.0f);
#endif
  return w / total;
}

// The depth statistics of a pixel's hits (docs/model.md section 7), accumulated beside the
// online softmax: the hits' total weight W_h relative to exp(m) (rescaled with the blend),
// the mean of their normalised depths n under the weights b_i = w_i / W_h, and the sum of
// w_i (n_i - mean)^2 relative to exp(m). West's weighted update: the mean moves by the new
// hit's share of the deviation, and the squares grow by w (1 - share) dev^2, a product of
// non-negative factors, so the variance is never negative and nothing cancels (the raw
// moments' M_0 M_2 - M_1^2 loses every digit when the depths are close). A hit of weight 0
// (underflowed) changes nothing; without any weight the mean and variance are 0.
//
// The mean is kept as an unevaluated sum mean + mean_low: each step's rounding error is
// carried in mean_low (Fast2Sum). The backward forms each hit's deviation n_i - mean from
// both; from a rounded mean alone, the deviation of a hit that dominates its pixel (within
// a rounding of the mean of it) would lose its digits, and the variance's gradient with
// them (with a sharp blend, several times a plain float evaluation's error).
template <typename T>
struct DepthStats {
  T weight = 0;    // W_h, relative to exp(m)
  T mean = 0;      // sum b_i n_i, with mean_low
  T mean_low = 0;
  T squares = 0;   // sum w_i (n_i - mean)^2, relative to exp(m)

  // The blend's maximum exponent rose: the sums relative to it shrink by `rescale`.
  PULSAR_HD void scale(T rescale) {
    weight *= rescale;
    squares *= rescale;
  }
  // Adds a hit of weight w (relative to exp(m)) at normalised depth n.
  PULSAR_HD void add(T w, T n) {
    weight += w;
    const T share = weight > T(0) ? weight_share(w, weight) : T(0);
    const T dev = (n - mean) - mean_low;
    const T step = share * dev;
    const T next = mean + step;
    mean_low += step - (next - mean);
    mean = next;
    squares += (w * (T(1) - share)) * (dev * dev);
  }
  // The variance of n under b (0 without any weight).
  PULSAR_HD T variance() const { return weight > T(0) ? squares / weight : T(0); }
  // Writes the pixel's depth statistics (ForwardOutputs::depth_moments, DepthStatSlot),
  // given its blend normaliser D: the coverage M_0 = W_h / D (both relative to exp(m)).
  PULSAR_HD void store(T* out, T norm_d) const {
    out[kCoverage] = weight / norm_d;
    out[kDepthMean] = mean;
    out[kDepthVariance] = variance();
    out[kDepthMeanLow] = mean_low;
  }
};

// The depth outputs' part of a hit's gradient. With M_0 = W_h / W (W the total weight,
// background included), the mean and the variance V of n under b_i = w_i / W_h:
//   dM_0/dw_i W = 1 - M_0 = the background's share a_bg (taken from the blend state, not as
//     1 - M_0: where the pixel is nearly covered, 1 - M_0 would be the rounding of M_0);
//   dmean/dw_i W_h = n_i - mean, dV/dw_i W_h = (n_i - mean)^2 - V;
//   dmean/dn_i = b_i, dV/dn_i = 2 b_i (n_i - mean).
// The last three are in units of b_i, which stays within [0, 1] however small the coverage
// (in units of the blend weight a_i = M_0 b_i they would divide by M_0, which underflows).
template <typename T>
struct DepthStatsGrad {
  T mean = 0, mean_low = 0, variance = 0;  // the pixel's outputs (DepthStats)
  T grad_mean = 0, grad_variance = 0;      // dL/dmean, dL/dV

  PULSAR_HD T deviation(T n) const { return (n - mean) - mean_low; }
  // dL/dw_i * W_h through the mean and the variance, for a hit at normalised depth n.
  PULSAR_HD T weight_grad(T n) const {
    const T dev = deviation(n);
    return grad_mean * dev + grad_variance * (dev * dev - variance);
  }
  // dL/dn_i / b_i.
  PULSAR_HD T depth_grad(T n) const { return grad_mean + T(2) * grad_variance * deviation(n); }
};

// Early termination (docs/model.md section 6): a sphere whose closest depth exceeds this
// would contribute less than the share p; with its depth sorted list, traversal stops.
template <typename T>
PULSAR_HD T termination_depth(const BlendParams<T>& p, const OnlineSoftmax<T>& state) {
  return p.min_depth + p.depth_range() * (T(1) - p.gamma * (std::log(state.D) + p.log_odds + state.m));
}

// An upper bound of log2(d) for the online softmax's normaliser d (0 < d <= hits + 1: each
// term is at most 1 relative to the largest exponent's), cheaper than the logarithm, less
// kLog2BoundSlack. On the GPU the hardware log2 of max(d, 1e-30), within 2^-22 absolute or
// 2 ulp of log2 d: that argument stays clear of the denormals that float flushes, and its
// logarithm bounds log2 d from above once the slack is added (one instruction where a range
// test and its branch take five; the forward takes one per hit). Elsewhere the binary
// exponent e of d = mantissa * 2^e, mantissa in [0.5, 1): log2 d < e. (A NaN or infinite d,
// from NaN or infinite inputs with value checks off, gives some bound: the stopping
// decision is then the exact depth's, as for any entry beyond the bound.)
template <typename T>
PULSAR_HD T log2_upper_bound_less_slack(T d) {
#ifdef __CUDA_ARCH__
  return T(__log2f(fmaxf(float(d), 1e-30f)));
#else
  // For a normal d, frexp's exponent is the biased exponent field less (bias - 1): read
  // from the bits, where GCC keeps std::frexp a library call (one per hit in the forward).
  // Zero, denormals, infinities and NaN go to frexp itself.
  using Bits = typename std::conditional<std::is_same<T, float>::value, std::uint32_t, std::uint64_t>::type;
  constexpr int kMantissaBits = std::numeric_limits<T>::digits - 1;
  constexpr int kExponentMask = 2 * std::numeric_limits<T>::max_exponent - 1;
  Bits bits;
  std::memcpy(&bits, &d, sizeof(T));
  const int biased = int(bits >> kMantissaBits) & kExponentMask;
  if (biased != 0 && biased != kExponentMask) return T(biased - (std::numeric_limits<T>::max_exponent - 2));
  int e;
  std::frexp(d, &e);
  return T(e);
#endif
}
// Above the hardware log2's error for any d in [1e-30, 2^31] (|log2 d| < 100): 2^-22
// absolute for d in [0.5, 2], else 2 ulp, under 1.6e-5. A constant rather than one that
// grows with |log2 d| (two operations per hit), so that the test below folds it into its
// entries' keys; the CPU's exact bound takes it too (an upper bound stays one).
constexpr double kLog2BoundSlack = 1.01e-4;
constexpr double kLn2 = 0.69314718055994531;  // ln 2: log2 to natural units

// The stopping rule of docs/model.md section 6 with the logarithm deferred. An entry with
// closest depth zc stops the traversal when zc > termination_depth, which is, with
// s1(zc) = (max_depth - zc) / (gamma range) the exponent a hit of opacity 1 at zc would
// have, when s1(zc) - log_odds < m + ln D: its largest possible weight is under the share
// p of the total. After each hit (after_hit) the test keeps hi = m + ln 2 l, l an upper
// bound of log2 D less a constant (log2_upper_bound_less_slack): one fused operation per
// hit. The entry's side, its key s1(zc) - log_odds less a slack far above the rounding of
// either side (key_offset), is a per-image function of zc that the GPU forward forms once
// per staged entry. An entry whose key is at least hi goes on without a logarithm; only
// one below needs the exact depth, so the decisions are exactly termination_depth's. (In
// depth units the bound would take three operations per hit and a register move. The
// binary exponent alone, the CPU's bound, overestimates ln D by up to ln 2, which puts
// the cheap depth bound up to about 2.8 world units short at gamma 0.1 and range 40, and
// sends many more entries to the exact test than the GPU's hardware log2 does.)
//
// Why the key may stand for zc: key >= hi gives s1(zc) >= m + ln D + log_odds + slack /
// (gamma range) (ln D <= ln 2 (l + kLog2BoundSlack)), that is zc <= termination_depth -
// slack, slack = 1e-5 (|min_depth| + range). In key units that slack is at least 1e-5 /
// gamma, where the key, m and ln D, all within about 1 / gamma + 100 of 0 near a
// decision, round by under 3e-7 / gamma: a factor 30 to spare.
template <typename T>
struct TerminationTest {
  T hi;            // >= m + ln D less the slacks; -inf before the first hit, +inf once the hit cap stops the pixel
  T exact;         // termination_depth after exact_hits hits
  int exact_hits;  // the hit count of exact (-1: none yet; a count, not a flag written per hit)

  // key(zc) = s1(zc) - key_offset; key_offset = log_odds + the slacks (0 without early
  // termination, where log_odds is -inf: hi then stays -inf, and finite keys let the
  // hit cap's +inf stop the pixel).
  PULSAR_HD static T key_offset(const BlendParams<T>& p) {
    if (!p.early_stop) return T(0);
    const T slack = T(1e-5) * (std::abs(p.min_depth) + p.depth_range()) * p.inv_gamma_range;
    return p.log_odds + slack + T(kLn2 * kLog2BoundSlack);
  }
  PULSAR_HD static T key(const BlendParams<T>& p, T offset, T zc) {
    return blend_exponent(p, p.inv_gamma_range, zc) - offset;
  }
  PULSAR_HD static TerminationTest start() { return {-std::numeric_limits<T>::infinity(), T(0), -1}; }
  PULSAR_HD void after_hit(const OnlineSoftmax<T>& state) {
    hi = state.m + T(kLn2) * log2_upper_bound_less_slack(state.D);
  }
  // The hit cap is reached: every later entry is beyond the bound, where the caller
  // tests the cap.
  PULSAR_HD void cap_reached() { hi = std::numeric_limits<T>::infinity(); }
  // Whether an entry with closest depth zc (and key(p, offset, zc)) stops the traversal
  // after `hits` hits.
  PULSAR_HD bool stops(T zc, T key, const BlendParams<T>& p, const OnlineSoftmax<T>& state, int hits) {
    return beyond_bound(key) && stops_beyond_bound(zc, p, state, hits);
  }
  // The same in two steps, the first alone on the common path (the GPU forward's visit
  // branches on it; the combined test would materialise a flag per entry): whether the
  // entry lies beyond the cheap bound, and if so, whether it stops the traversal.
  PULSAR_HD bool beyond_bound(T key) const { return key < hi; }
  PULSAR_HD bool stops_beyond_bound(T zc, const BlendParams<T>& p, const OnlineSoftmax<T>& state, int hits) {
    if (hits != exact_hits) {
      exact = termination_depth(p, state);
      exact_hits = hits;
    }
    return zc > exact;
  }
};

// The same depth for a total weight exp(log_weight) (background included), in double:
// the CUDA binning bounds it from below-estimated weights (tile_depth_bound.cu).
template <typename T>
PULSAR_HD double termination_depth_for_weight(const BlendParams<T>& p, double log_weight) {
  return double(p.min_depth) + double(p.depth_range()) * (1.0 - double(p.gamma) * (log_weight + double(p.log_odds)));
}

}  // namespace pulsar
