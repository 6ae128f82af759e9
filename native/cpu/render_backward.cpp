// Stage 3 on the CPU: per pixel, re-traverse the hits the forward processed (every hit
// before its traversal end: termination only ever stops, never skips) and write
// the exact gradient of the blend (docs/model.md section 8). Sphere terms accumulate per
// (tile, sphere) instance and camera terms per tile; each is owned by one work item,
// so the later fixed-order reduction makes the result bitwise reproducible.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/blend.h"
#include "pulsar/pixel_ray.h"
#include "hit_lanes.h"
#include "tile_pairs.h"

namespace pulsar {

namespace {

// What the backward keeps of one hit between its blend terms and the rest (render_backward),
// beside its PairHit.
template <typename T>
struct HitTerms {
  std::int64_t e = 0;  // list position (its instance row)
  std::int32_t i = 0;  // sphere
  T opacity = 0, slope = 0;
  T rel = 0;   // exp(s - m)
  T unit = 0;  // exp(s) / total weight
  T g = 0;     // dL/dw * total weight through the image and the coverage
};

// to = h, member by member. A copy of a whole pair right after it was computed makes GCC
// store it field by field and reload it 16 bytes at a time, loads that cannot be served
// from those narrower stores and stall until they retire; member by member, the pair
// stays in registers until it is stored.
template <typename T>
inline void store_pair(PairHit<T>& to, const PairHit<T>& h) {
  to.hit = h.hit;
  to.inside = h.inside;
  to.tiny = h.tiny;
  to.kappa = h.kappa;
  to.depth = h.depth;
  to.delta = h.delta;
  to.o1 = h.o1;
  to.perp_sq = h.perp_sq;
  to.half_chord = h.half_chord;
  to.chord_vector = h.chord_vector;
}

// Entries per batch: its pairs and pending hits (a few kilobytes) stay in the L1 cache.
constexpr int kHitBatch = 32;

}  // namespace

template <typename T>
void cpu_render_backward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                         const BackwardArgs& args, const GradientOutputs& grads, CpuScratch& scratch) {
  const int channels = config.n_channels;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t n_tiles = tiling.n_tiles();
  const std::int64_t pixels = std::int64_t(config.width) * config.height;
  const int stride = kInstFeatures + channels;
  const auto* entries = scratch.entries.as<std::int32_t>();
  T* inst = scratch.instance_grads.reserve<T>(std::size_t(scratch.n_instances) * stride, "instance gradients");
  auto* tile_cam =
      scratch.tile_camera_grads.reserve<CameraGrad<T>>(std::size_t(scene.batch_size) * n_tiles, "camera gradients");
  T* tile_bg = scratch.tile_background_grads.reserve<T>(std::size_t(scene.batch_size) * n_tiles * channels,
                                                        "background gradients");
  const auto* grad_image = static_cast<const T*>(args.grad_image);
  const auto* image = static_cast<const T*>(args.image);
  const auto* state = static_cast<const T*>(args.blend_state);
  const auto* moments = static_cast<const T*>(args.depth_moments);
  const auto* grad_moments = static_cast<const T*>(args.grad_depth_moments);
  const bool want_geometry = grads.positions || grads.radii || grads.cameras;
  const bool want_blend = want_geometry || grads.opacities;
  // A share of a partial render (RenderOptions::partial) does not see the pixel's other
  // shares' hits, so a dominant hit cannot take minus the others' sum (below): it keeps
  // its own product, as the CUDA backward does.
  const bool whole_pixel = !options.partial;
#ifdef PULSAR_CPU_PAIR_LANES
  const bool three = channels == 3;
#endif

  // The tile's background gradient accumulates in the worker's row (a pixel at a time) and
  // is stored once the tile is done: neighbouring tiles' rows of tile_bg share lines.
  const auto worker_bg =
      WorkerRows<T>::reserve(scratch.pixel_scratch, std::size_t(channels), scratch.threads, "background gradient rows");
  const std::int64_t longest = longest_tile_list(scratch, scene.batch_size * n_tiles);
  const auto tile_mem = WorkerRows<unsigned char>::reserve(
      scratch.tile_entries, TileEntryArrays<T>::bytes(std::size_t(longest), channels), scratch.threads, "tile entries");

  parallel_for(scratch.workers(), scene.batch_size * n_tiles, [&](std::int64_t item, int worker) {
    const TileWork<T> w = TileWork<T>::of(item, config, scene, options, scratch);
    const int b = w.b;
    const CameraFrame<T>& cam = w.cam;
    const SceneView<T>& sv = w.scene;
    const BlendParams<T>& bp = w.blend;
    const SphereRecord<T>* rec = w.records;
    const std::int64_t first = w.first, last = w.last;
    std::memset(inst + first * stride, 0, sizeof(T) * std::size_t((last - first) * stride));
    CameraGrad<T> cg;
    DepthRangeSums<T> range_sums;  // the depth range's camera terms, resolved after the tile
    T* bg = worker_bg.row(worker);
    for (int ch = 0; ch < channels; ++ch) bg[ch] = T(0);
    const TileEntryArrays<T> tile = TileEntryArrays<T>::in(tile_mem.row(worker), std::size_t(longest), channels);
    tile.gather(entries + first, last - first, rec, sv, channels, bp);
    PairBatch<T, kHitBatch> pairs;  // a batch's pairs (below)
    HitTerms<T> pending[kHitBatch];  // and its hits'
    int pending_slot[kHitBatch];     // the hits' slots in `pairs`
#ifdef PULSAR_CPU_PAIR_LANES
    HitLanes<kHitBatch> lanes;          // float: the hits' gradient terms (below)
    std::int64_t lane_row[kHitBatch];  // and their instance rows
#endif
    for (int y = w.y_begin; y < w.y_end; ++y) {
      for (int x = w.x_begin; x < w.x_end; ++x) {
        const std::int64_t pix = std::int64_t(b) * pixels + std::int64_t(y) * config.width + x;
        const T* g_img = grad_image + pix * channels;
        const T* colour = image + pix * channels;
#ifdef PULSAR_CPU_PAIR_LANES
        // Three channels (the common case): the pixel's dL/dimage and image in locals.
        const T g0 = three ? g_img[0] : T(0), g1 = three ? g_img[1] : T(0), g2 = three ? g_img[2] : T(0);
        const T c0 = three ? colour[0] : T(0), c1 = three ? colour[1] : T(0), c2 = three ? colour[2] : T(0);
#endif
        const T m = state[2 * pix], norm_d = state[2 * pix + 1];
        const std::int64_t end = first + args.traversal_end[pix];
        const T* mom = moments ? moments + kDepthStats * pix : nullptr;
        const T* g_mom = grad_moments ? grad_moments + kDepthStats * pix : nullptr;
        // Background: C = (exp(s_bg) bg + sum w col) / (exp(s_bg) + sum w).
        const T bg_share = std::exp(bp.bg_exponent - m) / norm_d;
        for (int ch = 0; ch < channels; ++ch) bg[ch] += g_img[ch] * bg_share;
        if (end == first) continue;
        // The depth outputs (docs/model.md section 7): coverage M_0 = W_h / W, and the mean
        // and variance of n under b_i = w_i / W_h (blend.h, DepthStatsGrad).
        T g_coverage = 0;    // dL/dM_0 * (1 - M_0): a hit's dL/dw * W through M_0
        T hits_weight = 0;   // W_h relative to exp(m)
        DepthStatsGrad<T> stats;
        if (g_mom) {
          g_coverage = g_mom[kCoverage] * bg_share;
          hits_weight = mom[kCoverage] * norm_d;
          stats = DepthStatsGrad<T>{mom[kDepthMean], mom[kDepthMeanLow], mom[kDepthVariance], g_mom[kDepthMean],
                                    g_mom[kDepthVariance]};
        }
        const bool with_stats = g_mom != nullptr && hits_weight > T(0);
#ifdef PULSAR_CPU_PAIR_LANES
        // The common case that HitLanes computes (with the perspective projection).
        const bool lanes_apply = !cam.orthographic && want_geometry && !with_stats;
#endif
        const PixelRay<T> ray = pixel_ray(cam, x, y);
        const Vec3<T> sensor_rel = cam.sensor_offset(T(x), T(y));  // S = P - eye
        Vec3<T> grad_ray{0, 0, 0};     // perspective: dL/d(unit ray)
        Vec3<T> grad_sensor{0, 0, 0};  // orthographic: dL/dS
        // Everything of a hit's gradient but its features', given the part of dL/ds that
        // comes through the image and the coverage (blend_grad_s). dominant: the hit's
        // weight exceeds 1/2 (below).
        auto hit_backward = [&](const HitTerms<T>& t, const PairHit<T>& h, T blend_grad_s, bool dominant) {
          const SphereRecord<T>& r = rec[t.i];
          T* gi = inst + t.e * stride;
          // w = kappa * o * exp(s): dL/ds = weight * g, dL/dkappa = o * unit * g, and
          // opacity enters both as a factor (dL/d(factor) = kappa * unit * g) and through s.
          T grad_s = blend_grad_s;
          T grad_kappa = t.opacity * t.unit * t.g;
          T grad_factor = h.kappa * t.unit * t.g;
          T grad_n = 0;  // dL/dn directly (the mean and variance)
          if (with_stats) {
            // The mean and variance, in units of b_i = w_i / W_h (<= 1): dL/dw through them
            // is hits_g / W_h, and dL/dn is b_i depth_grad. The quotients by W_h come last,
            // so that a tiny W_h (a pixel barely covered) overflows nothing that is finite:
            // a lone hit (hits_g 0) keeps 0 however small its weight.
            const T n_depth = normalized_depth(bp, h.depth);
            const T hits_g = stats.weight_grad(n_depth);
            const T share = h.kappa * t.opacity * t.rel / hits_weight;  // b_i
            grad_s += share * hits_g;
            grad_kappa += t.opacity * t.rel * hits_g / hits_weight;
            grad_factor += h.kappa * t.rel * hits_g / hits_weight;
            grad_n = share * stats.depth_grad(n_depth);
          }
          if (dominant) {
            // w = kappa o exp(s) exactly, so dL/dkappa = dL/ds / kappa and dL/d(factor o) =
            // dL/ds / o (both positive here): the same cancellation-free dL/ds.
            grad_kappa = grad_s / h.kappa;
            grad_factor = grad_s / t.opacity;
          }
          const T grad_opacity = grad_factor + blend_exponent_grad_opacity(bp, h.depth, grad_s);
          // dL/dz through s and through the moments' n; its depth range terms with it.
          const T grad_depth = blend_exponent_grad_depth(t.slope, grad_s) + normalized_depth_grad(bp, grad_n);
          range_sums.add(grad_depth, h.depth);
          gi[kInstOpacity] += grad_opacity;
          if (!want_geometry) return;
          RadiusGradSums<T> radius_parts;
          Vec3<T> grad_c{0, 0, 0};  // world dL/d(centre - eye)
          if (cam.orthographic) {
            T ga = 0, gb = 0, gcz = 0;
            intersect_orthographic_backward(h, r.c.x - ray.sx, r.c.y - ray.sy, r.c.z, r.terms, grad_kappa, grad_depth,
                                            ga, gb, gcz, radius_parts);
            grad_c = ga * cam.x_unit + gb * cam.y_unit + gcz * cam.z_axis;
            // a = (c - S).x_unit, b = (c - S).y_unit, cz = c.z_axis, all in world terms.
            const Vec3<T> c_world = load_vec3(sv.positions + 3 * std::int64_t(t.i)) - cam.eye;
            cg.x_unit += ga * (c_world - sensor_rel);
            cg.y_unit += gb * (c_world - sensor_rel);
            cg.z_axis += gcz * c_world;
            grad_sensor -= ga * cam.x_unit + gb * cam.y_unit;
          } else {
            CentreGradSums<T> centre;
            intersect_perspective_backward(h, r.dist, r.terms, grad_kappa, grad_depth, centre, radius_parts, grad_ray);
            grad_c = centre.resolve(r.c, r.terms);
          }
          gi[kInstPos + 0] += grad_c.x;
          gi[kInstPos + 1] += grad_c.y;
          gi[kInstPos + 2] += grad_c.z;
          gi[kInstRadius] += radius_parts.resolve(tile.radius[t.e - first], r.terms.inv_radius);
          cg.eye -= grad_c;
        };
        // The image's and coverage's dL/ds of the blend's contributors (hits and background)
        // sum to 0 (softmax weights): a hit that dominates its pixel (weight above 1/2) takes
        // minus the others' sum, whose rounding is that of the small weights. Its own
        // product weight * g would carry the rounding of the stored C (dL/dw * W = gL .
        // (col - C), nearly 0 there), which the exponent's slope 1 / (gamma range) and, at a
        // silhouette, 1 / kappa then amplify in every saturated pixel.
        HitTerms<T> dominant;
        PairHit<T> dominant_hit;
        bool has_dominant = false;
        T others_grad_s = 0;  // sum of weight * g over the other contributors
        // The entries go in batches, in three passes each: the pairs (PairBatch), then the
        // hits' exponentials, both independent of the other hits, so that the long
        // latencies of their square roots, divisions and exponentials overlap; then each
        // hit's gradient terms, in list order.
        for (std::int64_t batch_first = first; batch_first < end; batch_first += kHitBatch) {
          const int n_batch = int(std::min<std::int64_t>(kHitBatch, end - batch_first));
          pairs.evaluate(cam, ray, x, y, tile, batch_first - first, n_batch);
          int n_hits = 0;
          for (int k = 0; k < n_batch; ++k) {
            pending_slot[n_hits] = k;
            n_hits += pairs.hits(k) ? 1 : 0;
          }
          for (int j = 0; j < n_hits; ++j) {
            HitTerms<T>& t = pending[j];
            t.e = batch_first + pending_slot[j];
            t.i = entries[t.e];
            t.opacity = tile.opacity[t.e - first];
            t.slope = tile.slope[t.e - first];
            const T s = blend_exponent(bp, t.slope, pairs.depth[pending_slot[j]]);
            t.rel = std::exp(s - m);  // exp(s) relative to exp(m)
            t.unit = t.rel / norm_d;  // exp(s) / total weight
          }
#ifdef PULSAR_CPU_PAIR_LANES
          if constexpr (std::is_same<T, float>::value) {
            if (lanes_apply) {
              // The hits' features, g and the dominant hit in list order; the others'
              // gradient terms eight at a time (HitLanes), then their shared sums in list
              // order.
              int n_lanes = 0;
              std::uint32_t lanes_tiny = 0;
              for (int j = 0; j < n_hits; ++j) {
                const int k = pending_slot[j];
                HitTerms<T>& t = pending[j];
                const T weight = pairs.kappa[k] * t.opacity * t.unit;  // normalised blend weight a_i
                const T* col = tile.features + (t.e - first) * channels;
                T* gi = inst + t.e * stride;
                t.g = g_coverage;
                if (three) {  // the loop below with the pixel's values in locals
                  t.g += g0 * (col[0] - c0);
                  t.g += g1 * (col[1] - c1);
                  t.g += g2 * (col[2] - c2);
                  gi[kInstFeatures + 0] += weight * g0;
                  gi[kInstFeatures + 1] += weight * g1;
                  gi[kInstFeatures + 2] += weight * g2;
                } else {
                  for (int ch = 0; ch < channels; ++ch) {
                    t.g += g_img[ch] * (col[ch] - colour[ch]);
                    gi[kInstFeatures + ch] += weight * g_img[ch];
                  }
                }
                if (!has_dominant && whole_pixel && weight > T(0.5)) {
                  dominant = t;
                  store_pair(dominant_hit, pairs.get(k));
                  has_dominant = true;
                  continue;
                }
                lanes.load(n_lanes, weight, t, pairs, k, tile, t.e - first);
                lanes_tiny |= std::uint32_t(PairBatch<T, kHitBatch>::bit(pairs.tiny, k)) << n_lanes;
                lane_row[n_lanes] = t.e;
                ++n_lanes;
              }
              lanes.tiny = lanes_tiny;
              lanes.compute(n_lanes, bp);
              for (int l = 0; l < n_lanes; ++l) {
                T* gi = inst + lane_row[l] * stride;
                others_grad_s += lanes.grad_s[l];
                range_sums.g += lanes.grad_depth[l];
                range_sums.gz += lanes.depth_term[l];
                gi[kInstOpacity] += lanes.grad_opacity[l];
                grad_ray.x -= lanes.ray_x[l];
                grad_ray.y -= lanes.ray_y[l];
                grad_ray.z -= lanes.ray_z[l];
                gi[kInstPos + 0] += lanes.grad_cx[l];
                gi[kInstPos + 1] += lanes.grad_cy[l];
                gi[kInstPos + 2] += lanes.grad_cz[l];
                gi[kInstRadius] += lanes.grad_radius[l];
                cg.eye.x -= lanes.grad_cx[l];
                cg.eye.y -= lanes.grad_cy[l];
                cg.eye.z -= lanes.grad_cz[l];
              }
              continue;
            }
          }
#endif
          for (int j = 0; j < n_hits; ++j) {
            const PairHit<T> h = pairs.get(pending_slot[j]);
            HitTerms<T>& t = pending[j];
            const T weight = h.kappa * t.opacity * t.unit;  // normalised blend weight a_i
            const T* col = tile.features + (t.e - first) * channels;
            T* gi = inst + t.e * stride;
            // g = dL/dw * total weight. Image: gL . (col - C); coverage: g_coverage.
            t.g = g_coverage;
            for (int ch = 0; ch < channels; ++ch) {
              t.g += g_img[ch] * (col[ch] - colour[ch]);
              gi[kInstFeatures + ch] += weight * g_img[ch];
            }
            if (!want_blend) continue;
            if (!has_dominant && whole_pixel && weight > T(0.5)) {
              dominant = t;
              store_pair(dominant_hit, h);
              has_dominant = true;
              continue;
            }
            const T grad_s = weight * t.g;
            others_grad_s += grad_s;
            hit_backward(t, h, grad_s, false);
          }
        }
        if (has_dominant) {
          // The background's weight * g: gL . (bg - C), and through the coverage -M_0 dL/dM_0.
          T g_bg = g_mom ? -mom[kCoverage] * g_mom[kCoverage] : T(0);
          for (int ch = 0; ch < channels; ++ch) g_bg += g_img[ch] * (sv.background[ch] - colour[ch]);
          hit_backward(dominant, dominant_hit, -(others_grad_s + bg_share * g_bg), true);
        }
        // The pixel's own camera terms: its ray (perspective) or sensor point (orthographic).
        if (want_geometry) {
          const Vec3<T> grad_s = cam.orthographic ? grad_sensor : normalize_backward(sensor_rel, grad_ray);
          cg.add_sensor_offset(grad_s, T(x), T(y));
        }
      }
    }
    range_sums.finish(bp, cg.min_depth, cg.max_depth);
    tile_cam[item] = cg;
    for (int ch = 0; ch < channels; ++ch) tile_bg[item * channels + ch] = bg[ch];
  });
}

template void cpu_render_backward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         const BackwardArgs&, const GradientOutputs&, CpuScratch&);
template void cpu_render_backward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                          const BackwardArgs&, const GradientOutputs&, CpuScratch&);

}  // namespace pulsar
