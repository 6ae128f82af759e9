// Stage 1 on the CPU: per-sphere setup (culling, closest depth, screen bounds) and
// binning into per-tile lists ordered by (closest depth, sphere index).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

namespace {

// The depth order's sort key of a visible sphere: (zc, index) as one value whose built-in
// order is that of (zc, index), so that the sort compares keys in one array instead of
// reading two records per comparison. zc's bits map to an unsigned integer of the same
// order (negative values reversed, below the positive ones; -0 is taken as +0, which a
// comparison of values does not tell apart). Float: the mapped bits above the index in 64
// bits; double: the mapped bits and the index.
inline std::uint64_t ordered_bits(std::uint64_t bits, std::uint64_t sign) {
  return (bits & sign) ? ~bits : (bits | sign);
}
inline std::uint64_t depth_key(float zc, std::int32_t index) {
  const float z = zc + 0.0f;  // -0 -> +0
  std::uint32_t bits;
  std::memcpy(&bits, &z, sizeof(bits));
  const std::uint32_t ordered = std::uint32_t(ordered_bits(bits, 0x80000000u));
  return (std::uint64_t(ordered) << 32) | std::uint32_t(index);
}
inline std::int32_t depth_key_index(std::uint64_t key) { return std::int32_t(key & 0xffffffffu); }
struct WideDepthKey {
  std::uint64_t zc;
  std::int32_t index;
  bool operator<(const WideDepthKey& o) const { return zc < o.zc || (zc == o.zc && index < o.index); }
};
inline WideDepthKey depth_key(double zc, std::int32_t index) {
  const double z = zc + 0.0;  // -0 -> +0
  std::uint64_t bits;
  std::memcpy(&bits, &z, sizeof(bits));
  return WideDepthKey{ordered_bits(bits, 0x8000000000000000ull), index};
}
inline std::int32_t depth_key_index(const WideDepthKey& key) { return key.index; }
template <typename T>
using DepthKey = decltype(depth_key(T(0), 0));

// The visible spheres among rec[begin, end) (indices into rec) in (zc, index) order,
// written to out; returns their count. keys: room for end - begin keys.
template <typename T>
std::int64_t sort_visible(const SphereRecord<T>* rec, std::int64_t begin, std::int64_t end, DepthKey<T>* keys,
                          std::int32_t* out) {
  std::int64_t count = 0;
  for (std::int64_t i = begin; i < end; ++i)
    if (!rec[i].bounds.empty()) keys[count++] = depth_key(rec[i].closest_depth, std::int32_t(i));
  std::sort(keys, keys + count);
  for (std::int64_t k = 0; k < count; ++k) out[k] = depth_key_index(keys[k]);
  return count;
}

// Tiles touched by a sphere's pixel bounds.
struct TileRange {
  int tx0, ty0, tx1, ty1;
};
inline TileRange tiles_of(const PixelBounds& b) {
  return TileRange{b.x0 / kTileSize, b.y0 / kTileSize, b.x1 / kTileSize, b.y1 / kTileSize};
}

constexpr std::int64_t kSetupChunk = 4096;  // spheres per work item
constexpr std::int64_t kMinPart = 16384;   // fewest spheres per part of a camera's binning

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

  // Per camera: visible spheres sorted by (zc, index), then tile counts and the tile
  // lists. A camera is split into `parts` pieces so that a single view uses every
  // worker. (zc, index) is a strict total order (zc is finite for a visible sphere and
  // the indices differ), so the sorted order does not depend on how the sort is split,
  // and each tile's list is filled piece by piece in that order: the lists are the same
  // for any number of parts.
  const int parts = int(std::max<std::int64_t>(1, std::min<std::int64_t>(scratch.threads / batch, n / kMinPart)));
  // The merge's order of two of camera b's spheres: their depth keys', the order of the
  // parts' sorts.
  auto before = [records, n](std::int64_t b) {
    const SphereRecord<T>* rec = records + b * n;
    return [rec](std::int32_t a, std::int32_t c) {
      return depth_key(rec[a].closest_depth, a) < depth_key(rec[c].closest_depth, c);
    };
  };
  auto split = [parts](std::int64_t count, int p) { return count * p / parts; };
  std::vector<std::int64_t> visible_count(batch);
  auto* keys = scratch.depth_keys.reserve<DepthKey<T>>(std::size_t(batch) * n, "depth sort keys");
  if (parts == 1) {
    parallel_for(scratch.workers(), batch, [&](std::int64_t b, int) {
      visible_count[b] = sort_visible(records + b * n, 0, n, keys + b * n, order + b * n);
    });
  } else {
    // Each part collects and sorts the visible spheres of its index range into the
    // merge buffer; the sorted runs are then merged pairwise into `order`, each merge
    // split at co-ranks of its output so that every part writes a piece.
    std::int32_t* runs = scratch.merge_runs.reserve<std::int32_t>(std::size_t(batch) * n, "merge runs");
    std::vector<std::int64_t> run_end(std::size_t(batch) * parts);
    parallel_for(scratch.workers(), std::int64_t(batch) * parts, [&](std::int64_t item, int) {
      const std::int64_t b = item / parts;
      const int p = int(item % parts);
      run_end[item] = sort_visible(records + b * n, split(n, p), split(n, p + 1), keys + b * n + split(n, p),
                                   runs + b * n + split(n, p));
    });
    // Compact the runs of each camera to the front of its row: run p starts at the sum
    // of the earlier runs' lengths. Runs move towards the front, in order.
    std::vector<std::int64_t> run_start(std::size_t(batch) * (parts + 1));
    for (int b = 0; b < batch; ++b) {
      std::int64_t* start = run_start.data() + std::size_t(b) * (parts + 1);
      start[0] = 0;
      for (int p = 0; p < parts; ++p) {
        std::int32_t* row = runs + std::int64_t(b) * n;
        // start[p] <= split(n, p): a forward copy towards the front (or none).
        if (start[p] != split(n, p))
          std::copy(row + split(n, p), row + split(n, p) + run_end[b * parts + p], row + start[p]);
        start[p + 1] = start[p] + run_end[b * parts + p];
      }
      visible_count[b] = start[parts];
    }
    // Merge rounds: runs of width w (in runs) merged into runs of width 2w.
    std::int32_t* src_base = runs;
    std::int32_t* dst_base = order;
    for (int width = 1; width < parts; width *= 2) {
      parallel_for(scratch.workers(), std::int64_t(batch) * parts, [&](std::int64_t item, int) {
        const std::int64_t b = item / parts;
        const int piece = int(item % parts);
        const std::int64_t* start = run_start.data() + b * (parts + 1);
        auto less = before(b);
        const std::int32_t* src = src_base + b * n;
        std::int32_t* dst = dst_base + b * n;
        for (int first = 0; first < parts; first += 2 * width) {
          const int mid = std::min(parts, first + width), last = std::min(parts, first + 2 * width);
          const std::int32_t* a = src + start[first];
          const std::int32_t* c = src + start[mid];
          const std::int64_t na = start[mid] - start[first], nc = start[last] - start[mid];
          // This piece writes outputs [k0, k1) of the merge; co_rank(k): how many of the
          // first k outputs come from a.
          auto co_rank = [&](std::int64_t k) {
            std::int64_t lo = std::max<std::int64_t>(0, k - nc), hi = std::min(k, na);
            while (lo < hi) {
              const std::int64_t i = lo + (hi - lo) / 2;
              if (less(a[i], c[k - i - 1]))
                lo = i + 1;
              else
                hi = i;
            }
            return lo;
          };
          const std::int64_t k0 = split(na + nc, piece), k1 = split(na + nc, piece + 1);
          const std::int64_t i0 = co_rank(k0), i1 = co_rank(k1);
          std::merge(a + i0, a + i1, c + (k0 - i0), c + (k1 - i1), dst + start[first] + k0, less);
        }
      });
      std::swap(src_base, dst_base);
    }
    if (src_base != order)
      parallel_for(scratch.workers(), std::int64_t(batch) * parts, [&](std::int64_t item, int) {
        const std::int64_t b = item / parts;
        const int p = int(item % parts);
        std::copy(runs + b * n + split(visible_count[b], p), runs + b * n + split(visible_count[b], p + 1),
                  order + b * n + split(visible_count[b], p));
      });
  }

  // visit(tile, sphere) for every tile of every sphere of part p of camera b's sorted
  // order, in that order: the walk both the count and the fill make.
  const auto each_tile_of_part = [&](std::int64_t b, int p, auto&& visit) {
    const SphereRecord<T>* rec = records + b * n;
    const std::int32_t* ord = order + b * n;
    for (std::int64_t k = split(visible_count[b], p); k < split(visible_count[b], p + 1); ++k) {
      const TileRange r = tiles_of(rec[ord[k]].bounds);
      for (int ty = r.ty0; ty <= r.ty1; ++ty)
        for (int tx = r.tx0; tx <= r.tx1; ++tx) visit(std::int64_t(ty) * tiling.tiles_x + tx, ord[k]);
    }
  };

  // Tile counts per (camera, part) of the sorted order; a tile's entries from part p
  // follow those of parts before p.
  const std::size_t n_part_counts = std::size_t(batch) * parts * n_tiles;
  std::int64_t* part_counts = scratch.part_tile_counts.reserve<std::int64_t>(n_part_counts, "part tile counts");
  std::fill(part_counts, part_counts + n_part_counts, std::int64_t(0));
  parallel_for(scratch.workers(), std::int64_t(batch) * parts, [&](std::int64_t item, int) {
    std::int64_t* tile_count = part_counts + item * n_tiles;
    each_tile_of_part(item / parts, int(item % parts), [&](std::int64_t tile, std::int32_t) { ++tile_count[tile]; });
  });
  offsets[0] = 0;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < n_tiles; ++t) {
      std::int64_t total = 0;
      for (int p = 0; p < parts; ++p) total += part_counts[(b * parts + p) * n_tiles + t];
      offsets[b * n_tiles + t + 1] = total;
    }
  std::partial_sum(offsets, offsets + batch * n_tiles + 1, offsets);
  scratch.n_instances = offsets[batch * n_tiles];
  PULSAR_REQUIRE(scratch.n_instances < (std::int64_t(1) << 40),
                 "too many sphere-tile instances: ", scratch.n_instances);
  auto* entries = scratch.entries.reserve<std::int32_t>(std::size_t(scratch.n_instances), "tile entries");
  // Each part's first slot in a tile's list: the tile's offset plus the earlier parts'
  // counts (part_counts becomes the cursors).
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < n_tiles; ++t) {
      std::int64_t cursor = offsets[b * n_tiles + t];
      for (int p = 0; p < parts; ++p) {
        std::int64_t& slot = part_counts[(b * parts + p) * n_tiles + t];
        const std::int64_t count = slot;
        slot = cursor;
        cursor += count;
      }
    }

  // Fill each tile's list in depth order.
  parallel_for(scratch.workers(), std::int64_t(batch) * parts, [&](std::int64_t item, int) {
    std::int64_t* cursor = part_counts + item * n_tiles;
    each_tile_of_part(item / parts, int(item % parts),
                      [&](std::int64_t tile, std::int32_t sphere) { entries[cursor[tile]++] = sphere; });
  });
}

template void cpu_setup_and_bin<float>(const RendererConfig&, const SceneArgs&, CpuScratch&);
template void cpu_setup_and_bin<double>(const RendererConfig&, const SceneArgs&, CpuScratch&);

}  // namespace pulsar
