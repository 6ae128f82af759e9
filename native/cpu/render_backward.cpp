// Stage 3 on the CPU: per pixel, re-traverse the hits the forward processed (every hit
// before its traversal end: termination only ever stops, never skips) and write
// the exact gradient of the blend (docs/model.md section 8). Sphere terms accumulate per
// (tile, sphere) instance and camera terms per tile; each is owned by one work item,
// so the later fixed-order reduction makes the result bitwise reproducible.
#include <cmath>
#include <cstring>

#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/blend.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

template <typename T>
void cpu_render_backward(const RendererConfig& config, const SceneArgs& scene,
                         const RenderOptions& options, const BackwardArgs& args,
                         const GradientOutputs& grads, CpuScratch& scratch) {
  const int channels = config.n_channels;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t n_tiles = tiling.n_tiles();
  const std::int64_t pixels = std::int64_t(config.width) * config.height;
  const int stride = kInstFeatures + channels;
  const auto* entries = scratch.entries.as<std::int32_t>();
  T* inst = scratch.instance_grads.reserve<T>(std::size_t(scratch.n_instances) * stride, "instance gradients");
  auto* tile_cam = scratch.tile_camera_grads.reserve<CameraGrad<T>>(std::size_t(scene.batch_size) * n_tiles, "camera gradients");
  T* tile_bg = scratch.tile_background_grads.reserve<T>(std::size_t(scene.batch_size) * n_tiles * channels, "background gradients");
  const auto* grad_image = static_cast<const T*>(args.grad_image);
  const auto* image = static_cast<const T*>(args.image);
  const auto* state = static_cast<const T*>(args.blend_state);
  const auto* moments = static_cast<const T*>(args.depth_moments);
  const auto* grad_moments = static_cast<const T*>(args.grad_depth_moments);
  const bool want_geometry = grads.positions || grads.radii || grads.cameras;
  const bool want_blend = want_geometry || grads.opacities;

  parallel_for(scratch.threads, scene.batch_size * n_tiles, [&](std::int64_t item, int) {
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
    T* bg = tile_bg + item * channels;
    for (int ch = 0; ch < channels; ++ch) bg[ch] = T(0);
    for (int y = w.y_begin; y < w.y_end; ++y) {
      for (int x = w.x_begin; x < w.x_end; ++x) {
        const std::int64_t pix = std::int64_t(b) * pixels + std::int64_t(y) * config.width + x;
        const T* g_img = grad_image + pix * channels;
        const T* colour = image + pix * channels;
        const T m = state[2 * pix], norm_d = state[2 * pix + 1];
        const std::int64_t end = first + args.traversal_end[pix];
        const T* mom = moments ? moments + 3 * pix : nullptr;
        const T* g_mom = grad_moments ? grad_moments + 3 * pix : nullptr;
        // Background: C = (exp(s_bg) bg + sum w col) / (exp(s_bg) + sum w).
        const T bg_share = std::exp(bp.bg_exponent - m) / norm_d;
        for (int ch = 0; ch < channels; ++ch) bg[ch] += g_img[ch] * bg_share;
        if (end == first) continue;
        const PixelRay<T> ray = pixel_ray(cam, x, y);
        const Vec3<T> sensor_rel = cam.sensor_offset(T(x), T(y));  // S = P - eye
        Vec3<T> grad_ray{0, 0, 0};     // perspective: dL/d(unit ray)
        Vec3<T> grad_sensor{0, 0, 0};  // orthographic: dL/dS
        for (std::int64_t e = first; e < end; ++e) {
          const std::int32_t i = entries[e];
          const SphereRecord<T>& r = rec[i];
          if (!r.bounds.contains(x, y)) continue;
          const T radius = sv.radii[i];
          const PairHit<T> h = evaluate_pair(cam, r.c, r.dist, radius, r.terms, ray);
          if (!h.hit) continue;
          const T opacity = sv.opacity(i);
          const T slope = blend_exponent_slope(bp, opacity);
          const T s = blend_exponent(bp, slope, h.depth);
          const T unit = std::exp(s - m) / norm_d;  // exp(s) / total weight
          const T weight = h.kappa * opacity * unit;  // normalised blend weight
          const T* col = sv.features + std::int64_t(i) * channels;
          T* gi = inst + e * stride;
          // g = dL/dw * total weight. Image: gL . (col - C). Moments M_k = sum a n^k:
          // dM_k/dw * total weight = n^k - M_k, and dM_k/dn = a k n^(k-1) directly.
          T g = 0, grad_n = 0;
          for (int ch = 0; ch < channels; ++ch) {
            g += g_img[ch] * (col[ch] - colour[ch]);
            gi[kInstFeatures + ch] += weight * g_img[ch];
          }
          if (g_mom) {
            const T n_depth = normalized_depth(bp, h.depth);
            g += g_mom[0] * (T(1) - mom[0]) + g_mom[1] * (n_depth - mom[1]) +
                 g_mom[2] * (n_depth * n_depth - mom[2]);
            grad_n += weight * (g_mom[1] + T(2) * g_mom[2] * n_depth);
          }
          if (!want_blend) continue;
          // w = kappa * o * exp(s): dL/ds = weight * g, dL/dkappa = o * unit * g, and
          // opacity enters both as a factor and through s.
          const T grad_s = weight * g;
          const T grad_opacity = h.kappa * unit * g + blend_exponent_grad_opacity(bp, h.depth, grad_s);
          // dL/dz through s and through the moments' n; its depth range terms with it.
          const T grad_depth = blend_exponent_grad_depth(slope, grad_s) + normalized_depth_grad(bp, grad_n);
          range_sums.add(grad_depth, h.depth);
          gi[kInstOpacity] += grad_opacity;
          if (!want_geometry) continue;
          const T grad_kappa = opacity * unit * g;
          RadiusGradSums<T> radius_parts;
          Vec3<T> grad_c{0, 0, 0};  // world dL/d(centre - eye)
          if (cam.orthographic) {
            T ga = 0, gb = 0, gcz = 0;
            intersect_orthographic_backward(h, r.c.x - ray.sx, r.c.y - ray.sy, r.c.z, r.terms, grad_kappa,
                                            grad_depth, ga, gb, gcz, radius_parts);
            grad_c = ga * cam.x_unit + gb * cam.y_unit + gcz * cam.z_axis;
            // a = (c - S).x_unit, b = (c - S).y_unit, cz = c.z_axis, all in world terms.
            const Vec3<T> c_world = load_vec3(sv.positions + 3 * std::int64_t(i)) - cam.eye;
            cg.x_unit += ga * (c_world - sensor_rel);
            cg.y_unit += gb * (c_world - sensor_rel);
            cg.z_axis += gcz * c_world;
            grad_sensor -= ga * cam.x_unit + gb * cam.y_unit;
          } else {
            CentreGradSums<T> centre;
            intersect_perspective_backward(h, r.dist, r.terms, grad_kappa, grad_depth, centre, radius_parts,
                                           grad_ray);
            grad_c = centre.resolve(r.c, r.terms);
          }
          gi[kInstPos + 0] += grad_c.x;
          gi[kInstPos + 1] += grad_c.y;
          gi[kInstPos + 2] += grad_c.z;
          gi[kInstRadius] += radius_parts.resolve(radius, r.terms.inv_radius);
          cg.eye -= grad_c;
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
  });
}

template void cpu_render_backward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         const BackwardArgs&, const GradientOutputs&, CpuScratch&);
template void cpu_render_backward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                          const BackwardArgs&, const GradientOutputs&, CpuScratch&);

}  // namespace pulsar
