// Stage 4 on the CPU: reduce the per-instance and per-tile partials of stage 3 into the
// caller's gradient arrays, always in the same order (tiles ascending, each tile's list
// in depth order), so gradients are bitwise identical run to run.
#include <algorithm>
#include <cstring>

#include "cpu_scratch.h"
#include "parallel_for.h"

namespace pulsar {

namespace {
constexpr std::int64_t kMinPart = 16384;  // fewest spheres per part of a sphere set
}  // namespace

template <typename T>
void cpu_reduce_gradients(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                          CpuScratch& scratch) {
  const int channels = config.n_channels, stride = kInstFeatures + channels;
  const std::int64_t n = scene.n_spheres;
  const std::int64_t n_tiles = Tiling::of(config.width, config.height).n_tiles();
  const auto* offsets = scratch.tile_offsets.as<std::int64_t>();
  const auto* entries = scratch.entries.as<std::int32_t>();
  const T* inst = scratch.instance_grads.as<T>();
  auto* pos = static_cast<T*>(grads.positions);
  auto* rad = static_cast<T*>(grads.radii);
  auto* opa = static_cast<T*>(grads.opacities);
  auto* col = static_cast<T*>(grads.features);
  const int sphere_sets = scene.shared_spheres ? 1 : scene.batch_size;

  // Sphere gradients: each sphere set (it owns its output slice) split into `parts`
  // ranges of sphere ids so that one set uses every worker. A work item walks all of its
  // set's entries (cameras, tiles and entries ascending) and adds those in its range:
  // each output value sums the same terms in the same order for any number of parts.
  const int parts = int(std::max<std::int64_t>(1, std::min<std::int64_t>(scratch.threads / sphere_sets, n / kMinPart)));
  parallel_for(scratch.workers(), std::int64_t(sphere_sets) * parts, [&](std::int64_t item, int) {
    const std::int64_t set = item / parts;
    const int p = int(item % parts);
    const std::int32_t lo = std::int32_t(n * p / parts), hi = std::int32_t(n * (p + 1) / parts);
    const int b_first = scene.shared_spheres ? 0 : int(set);
    const int b_last = scene.shared_spheres ? scene.batch_size : int(set) + 1;
    const std::int64_t base = set * n;
    // The item's outputs start at zero.
    const std::size_t first = std::size_t(base + lo), count = std::size_t(hi - lo);
    if (pos) std::memset(pos + 3 * first, 0, sizeof(T) * 3 * count);
    if (rad) std::memset(rad + first, 0, sizeof(T) * count);
    if (opa) std::memset(opa + first, 0, sizeof(T) * count);
    if (col) std::memset(col + first * channels, 0, sizeof(T) * count * std::size_t(channels));
    for (int b = b_first; b < b_last; ++b) {
      for (std::int64_t e = offsets[b * n_tiles]; e < offsets[(b + 1) * n_tiles]; ++e) {
        if (entries[e] < lo || entries[e] >= hi) continue;
        const std::int64_t i = base + entries[e];
        const T* g = inst + e * stride;
        if (pos)
          for (int d = 0; d < 3; ++d) pos[3 * i + d] += g[kInstPos + d];
        if (rad) rad[i] += g[kInstRadius];
        if (opa) opa[i] += g[kInstOpacity];
        if (col)
          for (int ch = 0; ch < channels; ++ch) col[i * channels + ch] += g[kInstFeatures + ch];
      }
    }
  });

  if (grads.cameras) {
    const auto* tile_cam = scratch.tile_camera_grads.as<CameraGrad<T>>();
    for (int b = 0; b < scene.batch_size; ++b) {
      CameraGrad<T> total;
      for (std::int64_t t = 0; t < n_tiles; ++t) total.add(tile_cam[b * n_tiles + t]);
      const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
      frame_backward(cam, total, static_cast<T*>(grads.cameras) + std::int64_t(b) * CAMERA_PARAMS);
    }
  }
  if (grads.background) {
    const T* tile_bg = scratch.tile_background_grads.as<T>();
    auto* bg = static_cast<T*>(grads.background);
    for (int ch = 0; ch < channels; ++ch) bg[ch] = T(0);
    for (std::int64_t t = 0; t < scene.batch_size * n_tiles; ++t)
      for (int ch = 0; ch < channels; ++ch) bg[ch] += tile_bg[t * channels + ch];
  }
}

template void cpu_reduce_gradients<float>(const RendererConfig&, const SceneArgs&, const GradientOutputs&, CpuScratch&);
template void cpu_reduce_gradients<double>(const RendererConfig&, const SceneArgs&, const GradientOutputs&,
                                           CpuScratch&);

}  // namespace pulsar
