// Stage 1 on CUDA: per-sphere setup and binning into per-tile lists ordered by
// (closest depth, sphere index), each cut at its tile's depth bound (tile_depth_bound.cu).
// The items are depth-sorted once (32-bit keys over B * N items), so that the instance
// sort, stable, needs only the tile bits: 32-bit keys over the bits in use, where keys of
// depth and tile together would take 64 bits (few tiles and instances: a counting sort,
// tile_counting_sort.cu; else CUB's radix sort). At most one host synchronisation: the
// instance count is read back once to size the sort, unless the binning is sized by an
// instance capacity (a capture, or a fixed capacity): then the sort runs over the
// capacity with the count on the device, and nothing waits (docs/design.md, "Capture").
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_scratch.h"
#include "warp_reduce.cuh"
#include "pulsar/pixel_ray.h"
#include "pulsar/tile_cover.h"
#include "warp_deal.cuh"

namespace pulsar {

namespace {

// Records the smallest and largest visible zc of camera b (float bits order like the
// values: zc > 0) and whether any visible sphere may cover a tile (the cover kernel's
// early exit when every sphere is too small). The smallest is kept as the maximum of the
// complemented bits, so one zero fill initialises every word. Every thread of the block
// calls it. A block whose threads share a camera (items ascend, so its first and last
// thread tell) reduces first and adds once: atomics from every warp would serialise on
// the camera's two words. Otherwise each warp whose lanes share a camera reduces first.
__device__ void record_camera_words(std::uint32_t* camera_words, int b, bool visible, float zc, bool covers) {
  const unsigned full = 0xffffffffu;
  const std::uint32_t bits = __float_as_uint(zc);
  std::uint32_t lo = visible ? ~bits : 0u, hi = visible ? bits : 0u, cover = covers ? 1u : 0u;
  __shared__ int block_camera[2];
  __shared__ std::uint32_t warp_lo[32], warp_hi[32], warp_cover[32];
  if (threadIdx.x == 0) block_camera[0] = b;
  if (threadIdx.x == blockDim.x - 1) block_camera[1] = b;
  __syncthreads();
  const bool one_camera_block = block_camera[0] == block_camera[1];
  const int first_camera = __shfl_sync(full, b, 0);
  const bool one_camera = one_camera_block || __all_sync(full, first_camera == b);
  if (one_camera) {
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = max(lo, __shfl_down_sync(full, lo, offset));
      hi = max(hi, __shfl_down_sync(full, hi, offset));
    }
    cover = __any_sync(full, cover != 0u) ? 1u : 0u;
  }
  if (one_camera_block) {
    if (threadIdx.x % 32 == 0) {
      warp_lo[threadIdx.x / 32] = lo;
      warp_hi[threadIdx.x / 32] = hi;
      warp_cover[threadIdx.x / 32] = cover;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < int(blockDim.x + 31) / 32; ++w) {
      lo = max(lo, warp_lo[w]);
      hi = max(hi, warp_hi[w]);
      cover |= warp_cover[w];
    }
  } else if (one_camera && threadIdx.x % 32 != 0) {
    return;
  }
  std::uint32_t* words = camera_words + b * CameraWords::kCount;
  if (hi != 0) {
    atomicMax(words + CameraWords::kLowZc, lo);
    atomicMax(words + CameraWords::kHighZc, hi);
  }
  if (cover != 0u) words[CameraWords::kCoverCandidates] = 1u;  // every writer stores the same value
}

// Threads per block of the binning's launches (one thread per item or instance).
constexpr int kThreads = 256;
// The setup kernel in float at four blocks per SM (64 registers, a few bytes spilled),
// where unbounded it takes 72 and three fit: the sphere setup of a million items runs
// about a tenth faster. Double is bounded by the block size alone (1).
template <typename T>
constexpr int kSetupBlocksPerSm = sizeof(T) == 4 ? 4 : 1;

template <typename T>
__global__ void __launch_bounds__(kThreads, kSetupBlocksPerSm<T>)
    setup_spheres_kernel(RendererConfig config, SceneArgs scene, GpuSphere<T>* spheres, std::uint32_t* camera_words,
                         std::uint32_t* depth_keys, std::int32_t* depth_items) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t item = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Lanes past the end stay for the warp reduction of the depth range.
  const bool valid = item < n * scene.batch_size;
  const ItemIndex at = valid ? split_item(item, n) : ItemIndex{scene.batch_size - 1, 0};
  const int b = at.camera;
  SphereSetup<T> s;
  s.visible = false;
  bool covers = false;
  if (valid) {
    const std::int64_t i = at.sphere;
    const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
    const SceneView<T> sv = SceneView<T>::of(scene, b, config.n_channels);
    const Vec3<T> p = load_vec3(sv.positions + 3 * i);
    const T radius = sv.radii[i];
    s = setup_sphere(cam, p, radius, config.width, config.height);
    const Vec3<T> c = p - cam.eye;
    GpuSphere<T> g;
    if (cam.orthographic) {
      g.cx = dot(c, cam.x_unit);
      g.cy = dot(c, cam.y_unit);
      g.cz = dot(c, cam.z_axis);
    } else {
      g.cx = c.x;
      g.cy = c.y;
      g.cz = c.z;
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
    store_sphere(spheres + item, g);
    covers = s.visible && may_cover_tiles(cam, radius, g.dist, g.opacity);
    // Visible zc > 0 (min_depth > 0), so its float bits order like it; invisible items
    // store no tiles and go last.
    depth_keys[item] = s.visible ? __float_as_uint(float(s.closest_depth)) : 0xffffffffu;
    depth_items[item] = std::int32_t(item);
  }
  record_camera_words(camera_words, b, s.visible, s.visible ? float(s.closest_depth) : 0.f, covers);
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
// (WarpDeal): one sphere may touch a hundred tiles while most touch a few, and a loop per
// sphere would keep the warp waiting for its largest. A pair is stored when
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
__device__ void deal_pairs(const RendererConfig& config, const GpuSphere<T>& g, std::int64_t b, const float* bound,
                           Fn fn) {
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

// Tiles stored per item, in depth rank order (rank r holds item order[r]), in a plain
// loop per sphere: counting is too light per tile for WarpDeal's shuffles to pay off. A
// rank whose zc (rank_keys: its float bits) lies beyond its camera's largest tile bound
// stores nothing and reads no record (the ranks ascend in zc, so whole warps leave
// together; the largest bound is often a border tile's, whose pixels see fewer spheres).
// Also adds to *small_box_instances the instances whose box within their tile holds at
// most kSmallBoxPixels pixels (one atomic per block, integers: exact), which picks the
// backward's lane grouping (render_backward.cu) and the forward's kernel.
template <typename T>
__global__ void count_kernel(RendererConfig config, SceneArgs scene, const GpuSphere<T>* spheres, const float* bound,
                             const std::int32_t* order, const std::uint32_t* rank_keys,
                             const std::uint32_t* camera_words, std::int64_t* tile_counts,
                             unsigned long long* small_box_instances) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t rank = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = rank < n * scene.batch_size;
  std::int64_t count = 0, small = 0;
  const std::int32_t item = valid ? order[rank] : 0;
  const int camera = split_item(item, n).camera;
  // zc > every tile's bound of the camera (invisible items' keys are all ones: beyond too).
  const bool beyond = bound != nullptr && valid &&
                      rank_keys[rank] > camera_words[camera * CameraWords::kCount + CameraWords::kMaxBound];
  if (valid && !beyond) {
    const Tiling tiling = Tiling::of(config.width, config.height);
    const GpuSphere<T> g = load_sphere(spheres + item);
    const TileBox box = tile_box(g);
    const float* camera_bound = bound ? bound + std::int64_t(camera) * tiling.n_tiles() : nullptr;
    const float zc = float(g.closest_depth);
    for (int ty = box.ty0; ty < box.ty0 + box.count / box.w; ++ty) {
      const int rows = min(int(g.y1), ty * kTileSize + kTileSize - 1) - max(int(g.y0), ty * kTileSize) + 1;
      for (int tx = box.tx0; tx < box.tx0 + box.w; ++tx) {
        if (camera_bound != nullptr && zc > camera_bound[ty * tiling.tiles_x + tx]) continue;
        ++count;
        // The box within this tile: what the backward's lanes walk for this instance.
        const int columns = min(int(g.x1), tx * kTileSize + kTileSize - 1) - max(int(g.x0), tx * kTileSize) + 1;
        small += rows * columns <= kSmallBoxPixels ? 1 : 0;
      }
    }
  }
  if (valid) tile_counts[rank] = count;
  // One atomic per block, not one per warp (eight times as many): atomics to one address
  // serialise.
  __shared__ std::int64_t warp_small[32];
  small = warp_sum(small);
  if (threadIdx.x % 32 == 0) warp_small[threadIdx.x / 32] = small;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::int64_t block_small = 0;
    for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) block_small += warp_small[w];
    if (block_small > 0) atomicAdd(small_box_instances, static_cast<unsigned long long>(block_small));
  }
}

// Each item's slot range, by item (the gradient reduction's index). A kernel of its own:
// its scatter of 8-byte stores would hold up duplicate_kernel's warps, and here it runs
// while the host waits for the instance count (cuda_begin_binning). With a capacity
// (sort_keys non-null) it also fills the instance sort's keys past the count (the scan's
// total, sphere_slots[items]) with all ones, so that they sort last: only the padding,
// which is empty for a capacity the count fills.
__global__ void item_slots_kernel(std::int64_t items, const std::int32_t* order, const std::int64_t* sphere_slots,
                                  int2* item_slots, std::uint32_t* sort_keys, std::int64_t capacity) {
  const std::int64_t rank = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (sort_keys != nullptr) {
    const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
    for (std::int64_t p = sphere_slots[items] + rank; p < capacity; p += stride) sort_keys[p] = 0xffffffffu;
  }
  if (rank >= items) return;
  item_slots[order[rank]] = make_int2(int(sphere_slots[rank]), int(sphere_slots[rank + 1]));
}

// Writes each rank's stored (tile, sphere) pairs at its slots below `capacity`: the sort
// key (InstanceKeys: the tile key b * n_tiles + tile, and the sphere index when packed),
// value the slot (the radix sort then carries slots, whose order is the rank order; null
// for the sort by counting, which reads a pair's slot from its position), and unless the
// keys are packed the slot's sphere index.
template <typename T>
__global__ void duplicate_kernel(RendererConfig config, SceneArgs scene, const GpuSphere<T>* spheres,
                                 const float* bound, const std::int32_t* order, const std::int64_t* sphere_slots,
                                 std::int64_t capacity, InstanceKeys key_layout, std::uint32_t* keys,
                                 std::int32_t* slots, std::int32_t* slot_sphere) {
  const std::int64_t n = scene.n_spheres;
  const std::int64_t rank = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = rank < n * scene.batch_size;
  const std::int64_t item = valid ? order[rank] : 0;
  const std::int64_t first_slot = valid ? sphere_slots[rank] : 0;
  // Items with no stored tile (with early termination often most of them: their tiles'
  // pixels stop long before) take empty bounds (x0 > x1) as lanes past the end do: no
  // pairs, and no record read.
  const bool stores = valid && sphere_slots[rank + 1] > first_slot;
  if (!__any_sync(WarpDeal::kFullMask, stores)) return;  // whole warps leave together
  const GpuSphere<T> g = stores ? load_sphere(spheres + item) : GpuSphere<T>{T(0), 1, 1, 0, 0};
  const Tiling tiling = Tiling::of(config.width, config.height);
  std::int64_t stored_before = 0;  // this lane's sphere: stored pairs of earlier rounds
  const int lane = int(threadIdx.x % 32);
  deal_pairs(config, g, split_item(item, n).camera, bound, [&](const DealtPair& pair, unsigned stored_lanes, int mine) {
    const std::int64_t o_item = __shfl_sync(WarpDeal::kFullMask, item, pair.owner);
    const std::int64_t o_slot = __shfl_sync(WarpDeal::kFullMask, first_slot + stored_before, pair.owner);
    const std::int64_t u = o_slot + __popc(stored_lanes & pair.held & ((1u << lane) - 1u));
    if (pair.stored && u < capacity) {  // past the capacity: the sort records the overflow
      const ItemIndex at = split_item(o_item, n);
      keys[u] = key_layout.key(std::uint32_t(at.camera) * std::uint32_t(tiling.n_tiles()) + std::uint32_t(pair.tile),
                               std::int32_t(at.sphere));
      if (slots != nullptr) slots[u] = std::int32_t(u);
      if (!key_layout.packed) slot_sphere[u] = std::int32_t(at.sphere);
    }
    stored_before += mine;
  });
}

// [begin, end) of each tile's run of sorted keys: the keys are sorted by their tile bits,
// so a tile's instances are one run; a tile without any keeps the [0, 0) of
// zero_binning_kernel.
// count: the instances (device_count null) or the capacity. With the count on the device,
// the first thread records a count beyond the capacity in *overflow_record.
__global__ void ranges_kernel(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                              InstanceKeys key_layout, int2* tile_ranges, std::int64_t* overflow_record) {
  const std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p == 0) record_overflow(count, device_count, overflow_record);
  count = stored_count(count, device_count);
  if (p >= count) return;
  const std::uint32_t tile = key_layout.tile(keys[p]);
  if (p == 0 || key_layout.tile(keys[p - 1]) != tile) tile_ranges[tile].x = std::int32_t(p);
  if (p == count - 1 || key_layout.tile(keys[p + 1]) != tile) tile_ranges[tile].y = std::int32_t(p + 1);
}

// Zeroes what a binning adds into or leaves unwritten: the tile ranges (ranges_kernel
// writes only tiles with entries), the per-camera words and the cover histogram
// (CoverHistogram), n of each, and the two counters: the scan's leading 0 and the
// small-box count (null: no items), behind which it copies the overflow record, so that
// one read-back takes all three. One launch instead of several memsets: each API call
// takes host time while the device waits for the first kernel that matters.
__global__ void zero_binning_kernel(int2* ranges, std::int64_t n_ranges, std::uint32_t* words, int n_words,
                                    CoverHistogram histogram, std::int64_t* slot_zero,
                                    unsigned long long* small_box_instances, const std::int64_t* overflow_record) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_ranges) ranges[i] = make_int2(0, 0);
  if (i < n_words) words[i] = 0u;
  if (i < std::int64_t(histogram.count)) histogram.words[i] = 0ull;
  if (i == 0) {
    *slot_zero = 0;
    if (small_box_instances) {
      small_box_instances[0] = 0ull;
      small_box_instances[1] = static_cast<unsigned long long>(*overflow_record);
    }
  }
}

// The maps the later stages read: the sphere (from the packed sorted key, else by slot
// from slot_sphere) and the slot of each sorted position (count and device_count as for
// ranges_kernel). The maps overwrite the keys' two buffers, position for position: a
// thread reads its key before it writes its position's maps.
__global__ void maps_kernel(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* sorted_keys,
                            InstanceKeys key_layout, const std::int32_t* sorted_slots, const std::int32_t* slot_sphere,
                            std::int32_t* entry_sphere, std::int32_t* entry_slot) {
  const std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= stored_count(count, device_count)) return;
  const std::int32_t u = sorted_slots[p];
  entry_sphere[p] = key_layout.sphere_of(sorted_keys[p], slot_sphere, u);
  entry_slot[p] = u;
}

// Two buffers of E at byte offsets a and b of base, for CUB's double-buffer sorts.
template <typename E>
cub::DoubleBuffer<E> double_buffer(unsigned char* base, std::size_t a, std::size_t b) {
  return cub::DoubleBuffer<E>(reinterpret_cast<E*>(base + a), reinterpret_cast<E*>(base + b));
}

// Stable radix sort of count (key, value) pairs over key bits [0, end_bit); the result is
// in keys.Current() and values.Current().
void sort_pairs(cub::DoubleBuffer<std::uint32_t>& keys, cub::DoubleBuffer<std::int32_t>& values, std::int64_t count,
                int end_bit, cudaStream_t stream, CudaScratch& scratch) {
  std::size_t bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, int(count), 0, end_bit, stream));
  void* temp = scratch.cub_temp.reserve<unsigned char>(bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, keys, values, int(count), 0, end_bit, stream));
}

// The depth order of few items in one launch instead of a radix sort's twelve (two
// memsets, a histogram, a scan, and per 8-bit pass a memset and a onesweep kernel, each a
// few microseconds of latency on few items): item i's rank is the number of items before it
// in (key, index) order, counted against every other key. Items^2 comparisons, so only up
// to kMaxCountedItems (2.7e8 comparisons there, spread over the whole GPU). The (key,
// index) order is the stable radix sort's order: both give the same ranks.
constexpr std::int64_t kMaxCountedItems = 16384;

// Each block ranks kRankedPerBlock items; its threads form kRankSlices groups of
// kRankedPerBlock, each group comparing against one slice of every tile of keys staged in
// shared memory, and the groups' counts are summed at the end. Few items per block make
// many blocks (625 for 10,000 items), which the multiprocessors share evenly.
constexpr int kRankedPerBlock = 16;
constexpr int kRankSlices = kThreads / kRankedPerBlock;
constexpr int kRankTile = 8 * kThreads;  // keys staged per round (8 per thread)

__global__ void rank_by_counting_kernel(std::int64_t items, const std::uint32_t* keys, std::uint32_t* sorted_keys,
                                        std::int32_t* order) {
  static_assert(kRankTile % (4 * kRankSlices) == 0, "each slice takes whole uint4 words");
  __shared__ uint4 staged[kRankTile / 4];
  __shared__ int slice_counts[kRankSlices][kRankedPerBlock];
  const int local = int(threadIdx.x) % kRankedPerBlock, slice = int(threadIdx.x) / kRankedPerBlock;
  const std::int64_t first = std::int64_t(blockIdx.x) * kRankedPerBlock;
  const std::int64_t i = first + local;
  const std::uint32_t key = i < items ? keys[i] : 0u;
  constexpr int kSliceWords = kRankTile / 4 / kRankSlices;
  int before = 0;
  for (std::int64_t base = 0; base < items; base += kRankTile) {
    // Past the end: all-ones keys with indices above every item, before no item.
    for (int k = int(threadIdx.x); k < kRankTile; k += kThreads)
      reinterpret_cast<std::uint32_t*>(staged)[k] = base + k < items ? keys[base + k] : 0xffffffffu;
    __syncthreads();
    const uint4* words = staged + slice * kSliceWords;
    const std::int64_t slice_first = base + std::int64_t(slice) * kSliceWords * 4;
    if (slice_first + kSliceWords * 4 <= first) {
      // Every staged index lies below the block's: equal keys come first.
      for (int w = 0; w < kSliceWords; ++w) {
        const uint4 k = words[w];
        before += int(k.x <= key) + int(k.y <= key) + int(k.z <= key) + int(k.w <= key);
      }
    } else if (slice_first >= first + kRankedPerBlock || slice_first >= items) {
      // Every staged index lies above the block's (padding among them): equal keys come later.
      for (int w = 0; w < kSliceWords; ++w) {
        const uint4 k = words[w];
        before += int(k.x < key) + int(k.y < key) + int(k.z < key) + int(k.w < key);
      }
    } else {
      for (int w = 0; w < kSliceWords; ++w) {
        const uint4 k = words[w];
        const std::uint32_t ks[4] = {k.x, k.y, k.z, k.w};
        for (int e = 0; e < 4; ++e) {
          const std::int64_t j = slice_first + 4 * w + e;
          before += int(ks[e] < key || (ks[e] == key && j < i));
        }
      }
    }
    __syncthreads();
  }
  slice_counts[slice][local] = before;
  __syncthreads();
  if (slice != 0 || i >= items) return;
  int rank = 0;
  for (int s = 0; s < kRankSlices; ++s) rank += slice_counts[s][local];
  sorted_keys[rank] = key;
  order[rank] = std::int32_t(i);
}

// Stable order of the items by their depth keys: keys.Current() and values.Current()
// sorted (values: the item indices 0, 1, ... before).
void sort_depth_order(cub::DoubleBuffer<std::uint32_t>& keys, cub::DoubleBuffer<std::int32_t>& items_of,
                      std::int64_t items, cudaStream_t stream, CudaScratch& scratch) {
  if (items > kMaxCountedItems) {
    sort_pairs(keys, items_of, items, 32, stream, scratch);
    return;
  }
  rank_by_counting_kernel<<<blocks_for(items, kRankedPerBlock), kThreads, 0, stream>>>(
      items, keys.Current(), keys.Alternate(), items_of.Alternate());
  PULSAR_CUDA_LAUNCH_CHECK("rank_by_counting_kernel");
  keys.selector ^= 1;
  items_of.selector ^= 1;
}

}  // namespace

namespace {

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PULSAR_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

// The radix path of the instance sort: a stable sort of the (tile key, slot) pairs, then
// the tile ranges and the sorted maps. count and device_count as for ranges_kernel.
void sort_and_map_instances(std::int64_t count, const std::int64_t* device_count, InstanceKeys key_layout,
                            cub::DoubleBuffer<std::uint32_t>& keys, cub::DoubleBuffer<std::int32_t>& slots,
                            const std::int32_t* slot_sphere, cudaStream_t stream, CudaScratch& scratch) {
  // Slots are in rank order, and the stable sort keeps it within each tile: only the
  // bits of the largest tile key take passes (a packed key's sphere bits ride along).
  // The double-buffer sort needs no workspace of the keys' size. Sized by a capacity, it
  // sorts the whole capacity: the positions past the count hold all-ones keys, which sort
  // after every stored one (a stored key equal in the sorted bits stays before them: the
  // sort is stable).
  sort_pairs(keys, slots, count, key_layout.tile_bits, stream, scratch);
  ranges_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
      count, device_count, keys.Current(), key_layout, scratch.tile_ranges.as<int2>(), scratch.overflow_record);
  PULSAR_CUDA_LAUNCH_CHECK("ranges_kernel");
  // The keys are done with: the maps overwrite their buffers (InstanceArena).
  maps_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(count, device_count, keys.Current(), key_layout,
                                                                    slots.Current(), slot_sphere,
                                                                    scratch.entry_sphere(), scratch.entry_slot());
  PULSAR_CUDA_LAUNCH_CHECK("maps_kernel");
}

// The instance capacity that sizes this binning, 0 for a binning that reads its count
// back before it builds its lists: a fixed capacity always; in a capture the learnt one
// (a capture cannot wait for the count); otherwise the eager room (BinningRoom), none for
// the repeat of a binning that outgrew it.
std::int64_t binning_capacity(bool captured, const CudaScratch& scratch) {
  if (scratch.fixed_capacity > 0) return scratch.fixed_capacity;
  if (!captured) return scratch.rebin_pending ? 0 : scratch.eager_room.next();
  if (scratch.learnt_capacity == 0)
    throw std::runtime_error(
        "pulsar: instance_capacity: a captured call needs an instance capacity, and this renderer has neither "
        "learnt one nor been given one; run the call once before capturing it (as the warm-up of "
        "torch.cuda.graph and of torch.compile's cudagraphs does) or set Renderer.instance_capacity");
  return scratch.learnt_capacity;
}

// The error of an overflow record read back (`needed` instances, 0: none).
void raise_overflow(std::int64_t needed, std::int64_t capacity) {
  throw std::runtime_error(
      "pulsar: instance_capacity: an earlier call sized by an instance capacity of " + std::to_string(capacity) +
      " needed " + std::to_string(needed) +
      " (tile, sphere) instances; its outputs were NaN. Set Renderer.instance_capacity to at least " +
      std::to_string(needed) + " (or leave it unset so that calls outside a capture size their own lists)");
}

// Waits for the counts a binning copies back behind its tile counts' scan (host_count,
// count_ready) and returns its instance count, checked against the lists' limit.
std::int64_t wait_for_count(CudaScratch& scratch) {
  PULSAR_CUDA_CHECK(cudaEventSynchronize(scratch.count_ready));
  const std::int64_t count = scratch.host_count[0];
  if (count >= (std::int64_t(1) << 31))
    throw std::runtime_error("pulsar: " + std::to_string(count) +
                             " sphere-tile instances exceed the CUDA backend's limit of 2^31 - 1; "
                             "render fewer or smaller spheres per call");
  return count;
}

// The counts read back, `count` instances, for a binning whose lists hold them all: the
// host's from here on (the stages pick their kernels by them), and what later binnings
// learn from: a capture's capacity is the largest count and a quarter more (at least
// 1024); the eager room follows BinningRoom.
void take_counts(CudaScratch& scratch, std::int64_t count) {
  scratch.n_instances = count;
  scratch.small_box_instances = scratch.host_count[1];
  if (count > scratch.learnt_capacity) scratch.learnt_capacity = std::max<std::int64_t>(count + count / 4, 1024);
  scratch.eager_room.learn(count);
  scratch.rebin_pending = false;
}

// Throws for the overflow record that came back with the counts (host_count[2]): an
// earlier binning sized by a capacity needed more instances.
void raise_earlier_overflow(CudaScratch& scratch, cudaStream_t stream) {
  const std::int64_t needed = scratch.host_count[2];
  if (needed > 0) raise_overflow(needed, clear_overflow_record(scratch, needed, stream));
}

}  // namespace

std::int64_t clear_overflow_record(CudaScratch& scratch, std::int64_t needed, cudaStream_t stream) {
  PULSAR_CUDA_CHECK(cudaMemsetAsync(scratch.overflow_record, 0, sizeof(std::int64_t), stream));
  if (scratch.fixed_capacity > 0) return scratch.fixed_capacity;
  const std::int64_t capacity = scratch.learnt_capacity;
  scratch.learnt_capacity = std::max(capacity, needed + needed / 4);
  return capacity;
}

bool cuda_settle_binning(CudaScratch& scratch, cudaStream_t stream) {
  if (!scratch.counts_settle) return false;
  scratch.counts_settle = false;
  const std::int64_t count = wait_for_count(scratch);
  const bool outgrown = count > scratch.list_room;
  if (outgrown) {
    // This call's record (ranges_kernel's), not an overflow to report: the call bins
    // again, reading its count back first, and learns the count then.
    PULSAR_CUDA_CHECK(cudaMemsetAsync(scratch.overflow_record, 0, sizeof(std::int64_t), stream));
    scratch.rebin_pending = true;
  } else {
    take_counts(scratch, count);
    scratch.device_counts = nullptr;
  }
  raise_earlier_overflow(scratch, stream);
  return outgrown;
}

void cuda_check_overflow_copy(CudaScratch& scratch, cudaStream_t stream) {
  if (!scratch.overflow_pending || cudaEventQuery(scratch.overflow_ready) != cudaSuccess) {
    cudaGetLastError();  // cudaErrorNotReady is not an error here
    return;
  }
  scratch.overflow_pending = false;
  const std::int64_t needed = *scratch.host_overflow;
  if (needed > 0) raise_overflow(needed, clear_overflow_record(scratch, needed, stream));
}

template <typename T>
void cuda_begin_binning(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        cudaStream_t stream, CudaScratch& scratch) {
  scratch.pending_order = nullptr;
  scratch.device_counts = nullptr;
  scratch.counts_settle = false;
  const std::int64_t items = scene.n_spheres * scene.batch_size;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t total_tiles = tiling.n_tiles() * scene.batch_size;
  if (items >= (std::int64_t(1) << 31))
    throw std::runtime_error("pulsar: " + std::to_string(scene.batch_size) + " cameras x " +
                             std::to_string(scene.n_spheres) +
                             " spheres exceed the CUDA backend's limit of "
                             "2^31 - 1 (camera, sphere) items; render fewer per call");
  if (total_tiles >= (std::int64_t(1) << 32))  // tile keys are uint32
    throw std::runtime_error("pulsar: " + std::to_string(total_tiles) +
                             " tiles exceed the CUDA backend's limit of 2^32 - 1; render fewer cameras per call");
  const bool captured = stream_capturing(stream);
  scratch.binning_captured = captured;
  const std::int64_t capacity = binning_capacity(captured, scratch);
  if (captured && !scratch.allocations_kept) {
    scratch.for_each_buffer([](DeviceBuffer& b) { b.keep_allocations(); });
    scratch.allocations_kept = true;
  }
  if (capacity > 0 && !captured) cuda_check_overflow_copy(scratch, stream);
  auto* spheres = scratch.spheres.reserve<GpuSphere<T>>(std::size_t(items), "sphere records");
  const std::size_t word_count = std::size_t(CameraWords::kCount) * std::size_t(scene.batch_size);
  auto* words = scratch.camera_words.reserve<std::uint32_t>(word_count, "per-camera words");
  auto* counts = scratch.tile_counts.reserve<std::int64_t>(std::size_t(items), "tile counts");
  // [0, items]: the scan; [items + 1]: the small-box count; [items + 2]: the overflow
  // record's copy (zero_binning_kernel).
  auto* slots_of = scratch.sphere_slots.reserve<std::int64_t>(std::size_t(items) + 3, "sphere slots");
  auto* ranges = scratch.tile_ranges.reserve<int2>(std::size_t(total_tiles), "tile ranges");
  auto* small_box_instances = items > 0 ? reinterpret_cast<unsigned long long*>(slots_of + items + 1) : nullptr;
  // With a capacity the instance arena is sized now (no count to wait for) and its sort
  // keys past the count filled by item_slots_kernel.
  std::uint32_t* sort_keys = nullptr;
  if (capacity > 0 && items > 0) {
    const InstanceArena layout = InstanceArena::of(std::size_t(capacity), config, scene);
    unsigned char* arena =
        scratch.instance_arena.reserve<unsigned char>(layout.binning_bytes(), "sphere-tile instances");
    // The sort by counting reads only the positions below the count on the device.
    if (!sorts_instances_by_counting(total_tiles, capacity))
      sort_keys = reinterpret_cast<std::uint32_t*>(arena + layout.keys_a());
  }
  const CoverHistogram histogram = cuda_reserve_cover_histogram(config, scene, options, scratch);
  const std::int64_t zeroed = std::max({total_tiles, std::int64_t(word_count), std::int64_t(histogram.count)});
  zero_binning_kernel<<<blocks_for(zeroed, kThreads), kThreads, 0, stream>>>(
      ranges, total_tiles, words, int(word_count), histogram, slots_of, small_box_instances, scratch.overflow_record);
  PULSAR_CUDA_LAUNCH_CHECK("zero_binning_kernel");
  scratch.n_instances = 0;
  scratch.small_box_instances = 0;
  scratch.list_room = capacity;
  if (items == 0) return;
  const DepthOrder depth{std::size_t(items)};
  unsigned char* order_bytes = scratch.depth_order.reserve<unsigned char>(depth.bytes(), "depth order");
  auto depth_keys = double_buffer<std::uint32_t>(order_bytes, depth.keys_a(), depth.keys_b());
  auto depth_items = double_buffer<std::int32_t>(order_bytes, depth.values_a(), depth.values_b());
  setup_spheres_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
      config, scene, spheres, words, depth_keys.Current(), depth_items.Current());
  PULSAR_CUDA_LAUNCH_CHECK("setup_spheres_kernel");
  // Rank order: items by zc, ties by item index, which within one camera is the sphere
  // index.
  sort_depth_order(depth_keys, depth_items, items, stream, scratch);
  const std::int32_t* order = depth_items.Current();

  const float* bound =
      cuda_tile_depth_bound<T>(config, scene, options, stream, scratch, histogram, order, depth_keys.Current());
  count_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
      config, scene, spheres, bound, order, depth_keys.Current(), words, counts, small_box_instances);
  PULSAR_CUDA_LAUNCH_CHECK("count_kernel");

  // Inclusive scan into slots_of[1..]: slots_of[r] = instances of the ranks before r.
  std::size_t scan_bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, counts, slots_of + 1, items, stream));
  void* temp = scratch.cub_temp.reserve<unsigned char>(scan_bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, scan_bytes, counts, slots_of + 1, items, stream));
  if (capacity > 0) scratch.device_counts = slots_of + items;
  const bool settles = capacity > 0 && !captured && scratch.fixed_capacity == 0;
  if (capacity == 0 || settles) {
    // The counts are read back with the overflow record behind them: waited for (on the
    // event, not the stream) in cuda_finish_binning, where the count sizes the sort, or,
    // for a binning sized by the eager room, in cuda_settle_binning once the lists'
    // launches are enqueued.
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(scratch.host_count, slots_of + items, 3 * sizeof(std::int64_t),
                                      cudaMemcpyDeviceToHost, stream));
    PULSAR_CUDA_CHECK(cudaEventRecord(scratch.count_ready, stream));
    scratch.counts_settle = settles;
  }
  // Each item's slots need only the scan: the device computes them while the host waits
  // for the count and launches what follows, so the one host synchronisation leaves the
  // device busy. The scan has read the tile counts, whose buffer item_slots overwrites.
  item_slots_kernel<<<blocks_for(items, kThreads), kThreads, 0, stream>>>(items, order, slots_of, scratch.item_slots(),
                                                                          sort_keys, capacity);
  PULSAR_CUDA_LAUNCH_CHECK("item_slots_kernel");
  scratch.pending_order = order;
  scratch.pending_bound = bound;
}

template <typename T>
void cuda_finish_binning(const RendererConfig& config, const SceneArgs& scene, cudaStream_t stream,
                         CudaScratch& scratch) {
  const std::int32_t* order = scratch.pending_order;
  if (order == nullptr) return;  // no items: cuda_begin_binning left empty lists
  scratch.pending_order = nullptr;
  const std::int64_t items = scene.n_spheres * scene.batch_size;
  const std::int64_t* device_count = scratch.device_counts;
  std::int64_t count = scratch.list_room;  // the capacity, or below the count read back
  if (device_count == nullptr) {
    // The one host synchronisation of a binning: the count's copy, not item_slots_kernel
    // behind it.
    count = wait_for_count(scratch);
    take_counts(scratch, count);
    scratch.list_room = count;
    raise_earlier_overflow(scratch, stream);
    // With no instances item_slots_kernel gave every item the slots [0, 0).
    if (count == 0) return;
  } else {
    scratch.n_instances = -1;  // on the device only
    scratch.small_box_instances = -1;
  }
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t total_tiles = tiling.n_tiles() * scene.batch_size;
  const auto* spheres = scratch.spheres.as<GpuSphere<T>>();
  const float* bound = scratch.pending_bound;
  auto* slots_of = scratch.sphere_slots.as<std::int64_t>();

  const InstanceArena layout = InstanceArena::of(std::size_t(count), config, scene);
  const InstanceKeys key_layout = layout.keys;
  unsigned char* arena = scratch.instance_arena.reserve<unsigned char>(layout.binning_bytes(), "sphere-tile instances");
  auto keys = double_buffer<std::uint32_t>(arena, layout.keys_a(), layout.keys_b());
  auto slots = double_buffer<std::int32_t>(arena, layout.slots_a(), layout.slots_b());
  auto* slot_sphere = key_layout.packed ? nullptr : reinterpret_cast<std::int32_t*>(arena + layout.slot_sphere());
  // The sort by counting keeps the keys at slots_a (it needs no slots): the sorted maps
  // overwrite [0, 8 * count) while other chunks' keys are still being read.
  const bool counted = sorts_instances_by_counting(total_tiles, count);
  std::uint32_t* pair_keys = counted ? reinterpret_cast<std::uint32_t*>(arena + layout.slots_a()) : keys.Current();
  duplicate_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
      config, scene, spheres, bound, order, slots_of, count, key_layout, pair_keys, counted ? nullptr : slots.Current(),
      slot_sphere);
  PULSAR_CUDA_LAUNCH_CHECK("duplicate_kernel");
  if (counted)
    cuda_sort_instances_by_counting(count, device_count, pair_keys, key_layout, slot_sphere, int(total_tiles), stream,
                                    scratch);
  else
    sort_and_map_instances(count, device_count, key_layout, keys, slots, slot_sphere, stream, scratch);
  if (device_count != nullptr && !scratch.binning_captured && !scratch.counts_settle) {
    // With a fixed capacity outside a capture: the overflow record comes back without
    // waiting, read by the next call (cuda_check_overflow_copy).
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(scratch.host_overflow, scratch.overflow_record, sizeof(std::int64_t),
                                      cudaMemcpyDeviceToHost, stream));
    PULSAR_CUDA_CHECK(cudaEventRecord(scratch.overflow_ready, stream));
    scratch.overflow_pending = true;
  }
}

namespace {

// NaN over every target's values when the binning's count on the device exceeds its
// capacity (device_count non-null) or the call's values are out of range (values
// non-null).
template <typename T>
__global__ void nan_on_failure_kernel(const std::int64_t* device_count, std::int64_t capacity, const double* values,
                                      OverflowTargets targets) {
  const bool overflow = device_count != nullptr && *device_count > capacity;
  if (!overflow && (values == nullptr || call_values_valid(values))) return;
  for (int t = 0; t < targets.count; ++t) {
    T* out = static_cast<T*>(targets.values[t]);
    for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < targets.sizes[t];
         i += std::int64_t(gridDim.x) * blockDim.x)
      out[i] = T(NAN);
  }
}

}  // namespace

template <typename T>
void cuda_nan_on_failure(const CudaScratch& scratch, const RenderOptions& options, const OverflowTargets& targets,
                         cudaStream_t stream) {
  if ((scratch.device_counts == nullptr && options.values == nullptr) || targets.count == 0) return;
  std::int64_t largest = 0;
  for (int t = 0; t < targets.count; ++t) largest = std::max(largest, targets.sizes[t]);
  const unsigned blocks =
      unsigned(std::min<std::int64_t>(blocks_for(largest, kThreads), 4 * std::int64_t(scratch.sm_count)));
  nan_on_failure_kernel<T>
      <<<blocks, kThreads, 0, stream>>>(scratch.device_counts, scratch.list_room, options.values, targets);
  PULSAR_CUDA_LAUNCH_CHECK("nan_on_failure_kernel");
}

template void cuda_nan_on_failure<float>(const CudaScratch&, const RenderOptions&, const OverflowTargets&,
                                         cudaStream_t);
template void cuda_nan_on_failure<double>(const CudaScratch&, const RenderOptions&, const OverflowTargets&,
                                          cudaStream_t);

template void cuda_begin_binning<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&, cudaStream_t,
                                        CudaScratch&);
template void cuda_begin_binning<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&, cudaStream_t,
                                         CudaScratch&);
template void cuda_finish_binning<float>(const RendererConfig&, const SceneArgs&, cudaStream_t, CudaScratch&);
template void cuda_finish_binning<double>(const RendererConfig&, const SceneArgs&, cudaStream_t, CudaScratch&);

}  // namespace pulsar
