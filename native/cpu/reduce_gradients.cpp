// Stage 4 on the CPU: reduce the per-instance and per-tile partials of stage 3 into the
// caller's gradient arrays, always in the same order (tiles ascending, each tile's list
// in depth order), so gradients are bitwise identical run to run.
#include <cstring>

#include "cpu_scratch.h"
#include "parallel_for.h"

namespace pulsar {

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
  if (pos) std::memset(pos, 0, sizeof(T) * std::size_t(sphere_sets * n * 3));
  if (rad) std::memset(rad, 0, sizeof(T) * std::size_t(sphere_sets * n));
  if (opa) std::memset(opa, 0, sizeof(T) * std::size_t(sphere_sets * n));
  if (col) std::memset(col, 0, sizeof(T) * std::size_t(sphere_sets * n * channels));

  // Sphere gradients: one work item per sphere set (each owns its output slice); within
  // it cameras, tiles and entries in ascending order.
  parallel_for(scratch.workers(), sphere_sets, [&](std::int64_t set, int) {
    const int b_first = scene.shared_spheres ? 0 : int(set);
    const int b_last = scene.shared_spheres ? scene.batch_size : int(set) + 1;
    const std::int64_t base = set * n;
    for (int b = b_first; b < b_last; ++b) {
      for (std::int64_t e = offsets[b * n_tiles]; e < offsets[(b + 1) * n_tiles]; ++e) {
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
