// Stage 1 on CUDA: per-sphere setup and binning into per-tile lists ordered by
// (closest depth, sphere index), each cut at its tile's depth bound (tile_depth_bound.cu).
// One host synchronisation: the instance count is read back once to size the sort
// (documented in docs/design.md).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_scratch.h"
#include "pulsar/pixel_ray.h"
#include "warp_deal.cuh"

namespace pulsar {

namespace {

// Records the smallest and largest visible zc of camera b (float bits order like the
// values: zc > 0). The smallest is kept as the maximum of the complemented bits, so one
// zero fill initialises both. A warp whose lanes share a camera reduces first.
__device__ void record_depth_range(std::uint32_t* depth_range, int b, bool visible, float zc) {
  const unsigned full = 0xffffffffu;
  const std::uint32_t bits = __float_as_uint(zc);
  std::uint32_t lo = visible ? ~bits : 0u, hi = visible ? bits : 0u;
  const int first_camera = __shfl_sync(full, b, 0);
  const bool one_camera = __all_sync(full, first_camera == b);
  if (one_camera) {
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = max(lo, __shfl_down_sync(full, lo, offset));
      hi = max(hi, __shfl_down_sync(full, hi, offset));
    }
    if (threadIdx.x % 32 != 0) return;
  }
  if (hi != 0) {
    atomicMax(depth_range + 2 * b, lo);
    atomicMax(depth_range + 2 * b + 1, hi);
  }
}

template <typename T>
__global__ void setup_spheres_kernel(RendererConfig config, SceneArgs scene, GpuSphere<T>* spheres,
                                     std::uint32_t* depth_range) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t item = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Lanes past the end stay for the warp reduction of the depth range.
  const bool valid = item < n * scene.batch_size;
  const int b = valid ? int(item / n) : scene.batch_size - 1;
  SphereSetup<T> s;
  s.visible = false;
  if (valid) {
    const std::int64_t i = item % n;
    const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
    const SceneView<T> sv = SceneView<T>::of(scene, b, config.n_channels);
    const Vec3<T> p = load_vec3(sv.positions + 3 * i);
    const T radius = sv.radii[i];
    s = setup_sphere(cam, p, radius, config.width, config.height);
    const Vec3<T> c = p - cam.eye;
    GpuSphere<T> g;
    if (cam.orthographic) {
      g.cx = dot(c, cam.x_unit); g.cy = dot(c, cam.y_unit); g.cz = dot(c, cam.z_axis);
    } else {
      g.cx = c.x; g.cy = c.y; g.cz = c.z;
    }
    g.dist = norm(c);
    g.radius = radius;
    g.opacity = sv.opacity(i);
    g.closest_depth = s.closest_depth;
    g.x0 = std::int16_t(s.visible ? s.bounds.x0 : 1);
    g.x1 = std::int16_t(s.visible ? s.bounds.x1 : 0);
    g.y0 = std::int16_t(s.visible ? s.bounds.y0 : 1);
    g.y1 = std::int16_t(s.visible ? s.bounds.y1 : 0);
    g.terms = pair_terms(cam, g.dist, radius, s.is_tiny);
    spheres[item] = g;
  }
  record_depth_range(depth_range, b, s.visible, s.visible ? float(s.closest_depth) : 0.f);
}

// The tiles a sphere's bounds touch, row-major: tx0 + [0, w) x ty0 + [0, count / w).
struct TileBox {
  int tx0 = 0, ty0 = 0, w = 1, count = 0;
};

template <typename T>
__device__ TileBox tile_box(const GpuSphere<T>& g) {
  TileBox box;
  if (g.x0 > g.x1 || g.y0 > g.y1) return box;
  box.tx0 = g.x0 / kTileSize;
  box.ty0 = g.y0 / kTileSize;
  box.w = g.x1 / kTileSize - box.tx0 + 1;
  box.count = box.w * (g.y1 / kTileSize - box.ty0 + 1);
  return box;
}

// The duplicate kernel deals each warp's (sphere, tile) pairs out over its lanes
// (WarpDeal): a sphere of W2 touches up to about 120 tiles, most only a few, and a loop
// per sphere kept a warp waiting for its largest (W2 1.53 -> 0.28 ms). A pair is stored when
// its tile's depth bound (null: none) is at least the sphere's zc. Stored pairs keep the
// row-major order of their sphere's box: the k-th stored tile of a sphere takes slot
// sphere_slots[sphere] + k, as a serial loop over the box would give it.
struct DealtPair {
  int owner;      // lane whose sphere the pair belongs to
  int tile;       // tile index within the camera
  bool stored;
  unsigned held;  // lanes holding this round's pairs of the owner's sphere
};

template <typename T, typename Fn>
__device__ void deal_pairs(const RendererConfig& config, const GpuSphere<T>& g, std::int64_t b,
                           const float* bound, Fn fn) {
  const Tiling tiling = Tiling::of(config.width, config.height);
  const TileBox box = tile_box(g);
  const WarpDeal deal = WarpDeal::of(box.count);
  const float zc = float(g.closest_depth);
  const int lane = int(threadIdx.x % 32);
  for (int base = 0; base < deal.total; base += 32) {
    const int j = base + lane;
    DealtPair pair;
    pair.owner = deal.owner_of(j);
    const int o_first = __shfl_sync(WarpDeal::kFullMask, deal.first, pair.owner);
    const int o_count = __shfl_sync(WarpDeal::kFullMask, deal.count, pair.owner);
    const int o_tx0 = __shfl_sync(WarpDeal::kFullMask, box.tx0, pair.owner);
    const int o_ty0 = __shfl_sync(WarpDeal::kFullMask, box.ty0, pair.owner);
    const int o_w = __shfl_sync(WarpDeal::kFullMask, box.w, pair.owner);
    const float o_zc = __shfl_sync(WarpDeal::kFullMask, zc, pair.owner);
    const std::int64_t o_b = __shfl_sync(WarpDeal::kFullMask, b, pair.owner);
    pair.tile = (o_ty0 + (j - o_first) / o_w) * tiling.tiles_x + o_tx0 + (j - o_first) % o_w;
    pair.stored = j < deal.total && (bound == nullptr || o_zc <= bound[o_b * tiling.n_tiles() + pair.tile]);
    pair.held = WarpDeal::lanes_holding(o_first, o_first + o_count, base);
    const unsigned stored_lanes = __ballot_sync(WarpDeal::kFullMask, pair.stored);
    // mine: this round's stored pairs of this lane's own sphere.
    fn(pair, stored_lanes, __popc(stored_lanes & WarpDeal::lanes_holding(deal.first, deal.first + deal.count, base)));
  }
}

// Tiles stored per sphere, in a plain loop per sphere: counting is too light per tile for
// WarpDeal's shuffles to pay (H100: W2 0.11 ms against 0.19 dealt). Also adds to
// *small_box_instances the instances of spheres whose box holds at most kSmallBoxPixels
// pixels (one atomic per block, integers: exact), which picks the backward's lane
// grouping (render_backward.cu).
template <typename T>
__global__ void count_kernel(RendererConfig config, SceneArgs scene, const GpuSphere<T>* spheres,
                             const float* bound, std::int64_t* tile_counts,
                             unsigned long long* small_box_instances) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t item = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = item < n * scene.batch_size;
  std::int64_t count = 0, small = 0;
  if (valid) {
    const Tiling tiling = Tiling::of(config.width, config.height);
    const GpuSphere<T> g = spheres[item];
    const TileBox box = tile_box(g);
    const float* camera_bound = bound ? bound + (item / n) * tiling.n_tiles() : nullptr;
    const float zc = float(g.closest_depth);
    for (int ty = box.ty0; ty < box.ty0 + box.count / box.w; ++ty)
      for (int tx = box.tx0; tx < box.tx0 + box.w; ++tx)
        if (camera_bound == nullptr || zc <= camera_bound[ty * tiling.tiles_x + tx]) ++count;
    tile_counts[item] = count;
    const int box_pixels = (int(g.x1) - int(g.x0) + 1) * (int(g.y1) - int(g.y0) + 1);
    small = box_pixels <= kSmallBoxPixels ? count : 0;
  }
  // One atomic per block: per warp they serialised on the one address (W4 count kernel
  // 20 -> 36 us).
  __shared__ std::int64_t warp_small[32];
  for (int offset = 16; offset > 0; offset /= 2) small += __shfl_down_sync(0xffffffffu, small, offset);
  if (threadIdx.x % 32 == 0) warp_small[threadIdx.x / 32] = small;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::int64_t block_small = 0;
    for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) block_small += warp_small[w];
    if (block_small > 0) atomicAdd(small_box_instances, static_cast<unsigned long long>(block_small));
  }
}

template <typename T>
__global__ void duplicate_kernel(RendererConfig config, SceneArgs scene, const GpuSphere<T>* spheres,
                                 const float* bound, const std::int64_t* sphere_slots, std::uint64_t* keys,
                                 std::int32_t* slots, std::int32_t* slot_sphere) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t item = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = item < n * scene.batch_size;
  const GpuSphere<T> g = valid ? spheres[item] : GpuSphere<T>{T(0), 1, 1, 0, 0};
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t first_slot = valid ? sphere_slots[item] : 0;
  const std::uint32_t depth_bits = __float_as_uint(float(g.closest_depth));
  std::int64_t stored_before = 0;  // this lane's sphere: stored pairs of earlier rounds
  const int lane = int(threadIdx.x % 32);
  deal_pairs(config, g, valid ? item / n : 0, bound, [&](const DealtPair& pair, unsigned stored_lanes, int mine) {
    const std::int64_t o_item = __shfl_sync(WarpDeal::kFullMask, item, pair.owner);
    const std::int64_t o_slot = __shfl_sync(WarpDeal::kFullMask, first_slot + stored_before, pair.owner);
    const std::uint32_t o_bits = __shfl_sync(WarpDeal::kFullMask, depth_bits, pair.owner);
    if (pair.stored) {
      const std::int64_t u = o_slot + __popc(stored_lanes & pair.held & ((1u << lane) - 1u));
      const std::uint64_t camera_tile = std::uint64_t(o_item / n) * std::uint64_t(tiling.n_tiles()) + std::uint64_t(pair.tile);
      keys[u] = (camera_tile << 32) | o_bits;
      slots[u] = std::int32_t(u);
      slot_sphere[u] = std::int32_t(o_item % n);
    }
    stored_before += mine;
  });
}

__global__ void entries_kernel(std::int64_t count, const std::uint64_t* keys, const std::int32_t* slots,
                               const std::int32_t* slot_sphere, std::int32_t* entry_sphere,
                               std::int32_t* entry_slot, int2* tile_ranges) {
  const std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= count) return;
  const std::int32_t u = slots[p];
  entry_sphere[p] = slot_sphere[u];
  entry_slot[p] = u;
  const std::uint64_t tile = keys[p] >> 32;
  if (p == 0 || (keys[p - 1] >> 32) != tile) tile_ranges[tile].x = std::int32_t(p);
  if (p == count - 1 || (keys[p + 1] >> 32) != tile) tile_ranges[tile].y = std::int32_t(p + 1);
}

int bit_width(std::uint64_t v) {
  int bits = 0;
  while (v) { ++bits; v >>= 1; }
  return bits;
}

}  // namespace

template <typename T>
void cuda_setup_and_bin(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        cudaStream_t stream, CudaScratch& scratch) {
  const std::int64_t items = scene.n_spheres * scene.batch_size;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t total_tiles = tiling.n_tiles() * scene.batch_size;
  auto* spheres = scratch.spheres.reserve<GpuSphere<T>>(std::size_t(items), "sphere records");
  auto* depth_range = scratch.depth_range.reserve<std::uint32_t>(2 * std::size_t(scene.batch_size), "depth range");
  auto* counts = scratch.tile_counts.reserve<std::int64_t>(std::size_t(items), "tile counts");
  auto* slots_of = scratch.sphere_slots.reserve<std::int64_t>(std::size_t(items) + 2, "sphere slots");
  auto* ranges = scratch.tile_ranges.reserve<int2>(std::size_t(total_tiles), "tile ranges");
  PULSAR_CUDA_CHECK(cudaMemsetAsync(ranges, 0, sizeof(int2) * std::size_t(total_tiles), stream));
  PULSAR_CUDA_CHECK(cudaMemsetAsync(slots_of, 0, sizeof(std::int64_t), stream));
  scratch.n_instances = 0;
  scratch.small_box_instances = 0;
  if (items == 0) return;
  auto* small_box_instances = reinterpret_cast<unsigned long long*>(slots_of + items + 1);
  PULSAR_CUDA_CHECK(cudaMemsetAsync(small_box_instances, 0, sizeof(std::int64_t), stream));
  constexpr int kThreads = 256;
  PULSAR_CUDA_CHECK(cudaMemsetAsync(depth_range, 0, 2 * sizeof(std::uint32_t) * std::size_t(scene.batch_size), stream));
  setup_spheres_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(config, scene, spheres, depth_range);
  PULSAR_CUDA_LAUNCH_CHECK("setup_spheres_kernel");
  const float* bound = cuda_tile_depth_bound<T>(config, scene, options, stream, scratch);
  count_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(config, scene, spheres, bound, counts,
                                                                            small_box_instances);
  PULSAR_CUDA_LAUNCH_CHECK("count_kernel");

  // Inclusive scan into slots_of[1..]: slots_of[k] = instances of items before k.
  std::size_t scan_bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts, slots_of + 1, items, stream));
  void* temp = scratch.cub_temp.reserve<unsigned char>(scan_bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, scan_bytes, counts, slots_of + 1, items, stream));
  // The one host sync of the forward: the instance count sizes the sort (read back with
  // the small-box count behind it).
  PULSAR_CUDA_CHECK(cudaMemcpyAsync(scratch.host_count, slots_of + items, 2 * sizeof(std::int64_t),
                                    cudaMemcpyDeviceToHost, stream));
  PULSAR_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::int64_t count = *scratch.host_count;
  if (count >= (std::int64_t(1) << 31))
    throw std::runtime_error("pulsar: " + std::to_string(count) +
                             " sphere-tile instances exceed the CUDA backend's limit of 2^31 - 1; "
                             "render fewer or smaller spheres per call");
  scratch.n_instances = count;
  scratch.small_box_instances = scratch.host_count[1];
  if (count == 0) return;

  const InstanceArena layout{std::size_t(count)};
  unsigned char* arena = scratch.instance_arena.reserve<unsigned char>(layout.binning_bytes(), "sphere-tile instances");
  auto* keys_a = reinterpret_cast<std::uint64_t*>(arena);
  auto* keys_b = reinterpret_cast<std::uint64_t*>(arena + layout.keys_b());
  // The sort's result lands in one of the two key buffers, the same one for the same
  // number of passes: start where the last call's result left the arena's start free,
  // so that the maps need no move (sort_keys_start_in_b).
  cub::DoubleBuffer<std::uint64_t> keys(scratch.sort_keys_start_in_b ? keys_b : keys_a,
                                        scratch.sort_keys_start_in_b ? keys_a : keys_b);
  cub::DoubleBuffer<std::int32_t> slots(reinterpret_cast<std::int32_t*>(arena + layout.slots_a()),
                                        reinterpret_cast<std::int32_t*>(arena + layout.slots_b()));
  auto* slot_sphere = reinterpret_cast<std::int32_t*>(arena + layout.slot_sphere());
  duplicate_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
      config, scene, spheres, bound, slots_of, keys.Current(), slots.Current(), slot_sphere);
  PULSAR_CUDA_LAUNCH_CHECK("duplicate_kernel");

  // The double-buffer sort needs no workspace of the keys' size; the result is in
  // Current(), and the other key buffer (8 bytes per instance) is free afterwards: it
  // takes the two int32 maps the later stages read, which then move to the arena's start
  // if they are not there (InstanceArena).
  const int end_bit = 32 + bit_width(std::uint64_t(total_tiles));
  std::size_t sort_bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, slots, int(count), 0, end_bit, stream));
  temp = scratch.cub_temp.reserve<unsigned char>(sort_bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, slots, int(count), 0, end_bit, stream));
  auto* maps = reinterpret_cast<std::int32_t*>(keys.Alternate());
  entries_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
      count, keys.Current(), slots.Current(), slot_sphere, maps, maps + count, ranges);
  PULSAR_CUDA_LAUNCH_CHECK("entries_kernel");
  if (keys.Alternate() != keys_a) {
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(arena, maps, layout.maps_bytes(), cudaMemcpyDeviceToDevice, stream));
    scratch.sort_keys_start_in_b = !scratch.sort_keys_start_in_b;
  }
  scratch.entry_sphere = reinterpret_cast<std::int32_t*>(arena);
  scratch.entry_slot = scratch.entry_sphere + count;
}

template void cuda_setup_and_bin<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                        cudaStream_t, CudaScratch&);
template void cuda_setup_and_bin<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         cudaStream_t, CudaScratch&);

}  // namespace pulsar
