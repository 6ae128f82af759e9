// Stage 1 on the CPU: per-sphere setup (culling, closest depth, screen bounds) and
// binning into per-tile lists ordered by (closest depth, sphere index).
#include <algorithm>
#include <numeric>

#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

namespace {

// Tiles touched by a sphere's pixel bounds.
struct TileRange {
  int tx0, ty0, tx1, ty1;
};
inline TileRange tiles_of(const PixelBounds& b) {
  return TileRange{b.x0 / kTileSize, b.y0 / kTileSize, b.x1 / kTileSize, b.y1 / kTileSize};
}

constexpr std::int64_t kSetupChunk = 4096;  // spheres per work item

}  // namespace

template <typename T>
void cpu_setup_and_bin(const RendererConfig& config, const SceneArgs& scene, CpuScratch& scratch) {
  const int batch = scene.batch_size;
  const std::int64_t n = scene.n_spheres;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t n_tiles = tiling.n_tiles();
  auto* records = scratch.records.reserve<SphereRecord<T>>(std::size_t(batch) * n, "sphere records");
  auto* order = scratch.order.reserve<std::int32_t>(std::size_t(batch) * n, "depth order");
  auto* offsets = scratch.tile_offsets.reserve<std::int64_t>(std::size_t(batch) * n_tiles + 1, "tile offsets");

  // Per-sphere setup, chunked over (camera, spheres).
  const std::int64_t chunks = (n + kSetupChunk - 1) / kSetupChunk;
  parallel_for(scratch.workers(), batch * chunks, [&](std::int64_t item, int) {
    const int b = int(item / chunks);
    const std::int64_t begin = (item % chunks) * kSetupChunk;
    const std::int64_t end = std::min(n, begin + kSetupChunk);
    const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
    const SceneView<T> sv = SceneView<T>::of(scene, b, config.n_channels);
    for (std::int64_t i = begin; i < end; ++i) {
      const Vec3<T> p = load_vec3(sv.positions + 3 * i);
      const SphereSetup<T> s = setup_sphere(cam, p, sv.radii[i], config.width, config.height);
      SphereRecord<T>& rec = records[b * n + i];
      const Vec3<T> c = p - cam.eye;
      rec.c = cam.orthographic ? make_vec3(dot(c, cam.x_unit), dot(c, cam.y_unit), dot(c, cam.z_axis)) : c;
      rec.dist = norm(c);
      rec.closest_depth = s.visible ? s.closest_depth : T(0);
      rec.bounds = s.visible ? s.bounds : PixelBounds{0, 0, -1, -1};
      rec.terms = pair_terms(cam, rec.dist, sv.radii[i], s.is_tiny);
    }
  });

  // Per camera: visible spheres sorted by (zc, index), then tile counts.
  std::fill(offsets, offsets + batch * n_tiles + 1, std::int64_t(0));
  std::vector<std::int64_t> visible_count(batch);
  parallel_for(scratch.workers(), batch, [&](std::int64_t b, int) {
    const SphereRecord<T>* rec = records + b * n;
    std::int32_t* ord = order + b * n;
    std::int64_t count = 0;
    for (std::int64_t i = 0; i < n; ++i)
      if (!rec[i].bounds.empty()) ord[count++] = std::int32_t(i);
    std::sort(ord, ord + count, [rec](std::int32_t a, std::int32_t c) {
      return rec[a].closest_depth < rec[c].closest_depth || (rec[a].closest_depth == rec[c].closest_depth && a < c);
    });
    visible_count[b] = count;
    std::int64_t* tile_count = offsets + 1 + b * n_tiles;
    for (std::int64_t k = 0; k < count; ++k) {
      const TileRange r = tiles_of(rec[ord[k]].bounds);
      for (int ty = r.ty0; ty <= r.ty1; ++ty)
        for (int tx = r.tx0; tx <= r.tx1; ++tx) ++tile_count[std::int64_t(ty) * tiling.tiles_x + tx];
    }
  });
  std::partial_sum(offsets, offsets + batch * n_tiles + 1, offsets);
  scratch.n_instances = offsets[batch * n_tiles];
  PULSAR_REQUIRE(scratch.n_instances < (std::int64_t(1) << 40),
                 "too many sphere-tile instances: ", scratch.n_instances);
  auto* entries = scratch.entries.reserve<std::int32_t>(std::size_t(scratch.n_instances), "tile entries");

  // Fill each tile's list in depth order.
  parallel_for(scratch.workers(), batch, [&](std::int64_t b, int) {
    const SphereRecord<T>* rec = records + b * n;
    const std::int32_t* ord = order + b * n;
    std::vector<std::int64_t> cursor(offsets + b * n_tiles, offsets + (b + 1) * n_tiles);
    for (std::int64_t k = 0; k < visible_count[b]; ++k) {
      const TileRange r = tiles_of(rec[ord[k]].bounds);
      for (int ty = r.ty0; ty <= r.ty1; ++ty)
        for (int tx = r.tx0; tx <= r.tx1; ++tx) entries[cursor[std::int64_t(ty) * tiling.tiles_x + tx]++] = ord[k];
    }
  });
}

template void cpu_setup_and_bin<float>(const RendererConfig&, const SceneArgs&, CpuScratch&);
template void cpu_setup_and_bin<double>(const RendererConfig&, const SceneArgs&, CpuScratch&);

}  // namespace pulsar
