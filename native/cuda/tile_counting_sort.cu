// The instance sort of a binning with few tiles and instances, by counting: the same
// sorted lists as a stable radix sort of the tile keys followed by ranges_kernel and
// maps_kernel (setup_bin.cu), in four launches instead of ten (CUB's sort alone is two
// memsets, a histogram, a scan, and a memset and a onesweep kernel per 8-bit pass).
//
// The instances are cut into chunks of kSortChunk positions. chunk_tile_counts_kernel
// counts each chunk's instances per tile into a tile-major matrix [tile][chunk]; its
// exclusive scan (CUB) gives, for every (tile, chunk), where that chunk's instances of that
// tile start in the sorted order: after every instance of a lower tile and of the same
// tile in an earlier chunk. scatter_by_tile_kernel then sorts each chunk by tile in shared
// memory, stably, and places each instance at its tile's start plus its index among the
// chunk's instances of that tile: a stable counting sort, so each tile's run keeps the
// slots' rank order.
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "cuda_scratch.h"

namespace pulsar {

namespace {

constexpr int kHistogramThreads = 256;  // threads per block of chunk_tile_counts_kernel
constexpr int kScatterThreads = 256;  // threads per block of scatter_by_tile_kernel
constexpr int kSortItems = kSortChunk / kScatterThreads;  // positions per scatter thread
static_assert(kSortItems * kScatterThreads == kSortChunk, "a scatter block holds one chunk");

// Block c counts chunk c's stored instances (positions below the stored count) per tile
// in shared memory, then writes its column of the matrix, zeros included.
__global__ void chunk_tile_counts_kernel(std::int64_t count, const std::int64_t* device_count,
                                         const std::uint32_t* keys, InstanceKeys key_layout, int tiles,
                                         std::int32_t* counts) {
  __shared__ std::int32_t histogram[kMaxCountedSortTiles];
  const int chunk = int(blockIdx.x), chunks = int(gridDim.x);
  for (int t = int(threadIdx.x); t < tiles; t += kHistogramThreads) histogram[t] = 0;
  __syncthreads();
  const std::int64_t first = std::int64_t(chunk) * kSortChunk;
  const std::int64_t end = min(first + kSortChunk, stored_count(count, device_count));
  for (std::int64_t p = first + threadIdx.x; p < end; p += kHistogramThreads)
    atomicAdd(&histogram[key_layout.tile(keys[p])], 1);
  __syncthreads();
  for (int t = int(threadIdx.x); t < tiles; t += kHistogramThreads)
    counts[std::int64_t(t) * chunks + chunk] = histogram[t];
}

// One block per chunk, kSortItems positions per thread. The block sorts its chunk's tile
// keys with their positions stably (CUB's BlockRadixSort over the bits of the tile key),
// so each tile's positions form one run of the sorted chunk, in position order; a
// position at sorted index s of a run starting at r goes to starts[tile][chunk] + (s - r).
// Then writes each position's sorted sphere (from its packed key, else slot_sphere) and
// slot (the slots were the positions themselves: duplicate_kernel stores pair u at
// position u). Also writes the ranges of the tiles whose index is the chunk's modulo the
// chunk count, and, with the count on the device (device_count non-null), records a count
// beyond the capacity as ranges_kernel does. Positions past the stored count carry the
// key `tiles`, which sorts last (key_bits = bit_width(tiles)) and is not placed.
__global__ void __launch_bounds__(kScatterThreads)
    scatter_by_tile_kernel(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                           InstanceKeys key_layout, const std::int32_t* slot_sphere, int tiles, int key_bits,
                           const std::int32_t* starts, std::int32_t* entry_sphere, std::int32_t* entry_slot,
                           int2* tile_ranges, std::int64_t* overflow_record) {
  using BlockSort = cub::BlockRadixSort<std::uint32_t, kScatterThreads, kSortItems, std::int32_t>;
  __shared__ typename BlockSort::TempStorage sort_storage;
  __shared__ std::int32_t next[kMaxCountedSortTiles];  // a tile's place for the chunk, less its run start
  __shared__ std::uint32_t last_keys[kScatterThreads];  // each thread's last sorted key
  const int chunk = int(blockIdx.x), chunks = int(gridDim.x);
  const int t0 = int(threadIdx.x);
  if (chunk == 0 && t0 == 0) record_overflow(count, device_count, overflow_record);
  const std::int64_t stored = stored_count(count, device_count);
  const std::int64_t first = std::int64_t(chunk) * kSortChunk;
  const int n = int(max(std::int64_t(0), min(std::int64_t(kSortChunk), stored - first)));
  const std::uint32_t unplaced = std::uint32_t(tiles);
  std::uint32_t key[kSortItems];
  std::int32_t position[kSortItems];
  for (int j = 0; j < kSortItems; ++j) {
    position[j] = t0 * kSortItems + j;
    key[j] = position[j] < n ? key_layout.tile(keys[first + position[j]]) : unplaced;
  }
  for (int t = t0; t < tiles; t += kScatterThreads) next[t] = starts[std::int64_t(t) * chunks + chunk];
  // A tile's run: from its first chunk's start to the next tile's (the last: every stored
  // instance); tiles without instances keep the [0, 0) of zero_binning_kernel.
  for (int t = chunk + t0 * chunks; t < tiles; t += kScatterThreads * chunks) {
    const std::int32_t begin = starts[std::int64_t(t) * chunks];
    const std::int32_t end = t + 1 < tiles ? starts[std::int64_t(t + 1) * chunks] : std::int32_t(stored);
    if (end > begin) tile_ranges[t] = make_int2(begin, end);
  }
  BlockSort(sort_storage).Sort(key, position, 0, key_bits);  // blocked: thread i holds sorted i*kSortItems...
  last_keys[t0] = key[kSortItems - 1];
  __syncthreads();
  for (int j = 0; j < kSortItems; ++j) {
    const int s = t0 * kSortItems + j;
    const std::uint32_t before = j > 0 ? key[j - 1] : (t0 > 0 ? last_keys[t0 - 1] : unplaced);
    if (key[j] != unplaced && key[j] != before) next[key[j]] -= s;  // one run start per tile
  }
  __syncthreads();
  for (int j = 0; j < kSortItems; ++j) {
    if (key[j] == unplaced) continue;
    const std::int32_t place = next[key[j]] + t0 * kSortItems + j;
    const std::int64_t u = first + position[j];
    entry_sphere[place] = key_layout.sphere_of(keys[u], slot_sphere, u);
    entry_slot[place] = std::int32_t(u);
  }
}

}  // namespace

void cuda_sort_instances_by_counting(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                                     InstanceKeys key_layout, const std::int32_t* slot_sphere, int tiles,
                                     cudaStream_t stream, CudaScratch& scratch) {
  const int chunks = counted_sort_chunks(count);
  const std::size_t cells = std::size_t(tiles) * std::size_t(chunks);
  auto* counts = scratch.chunk_tile_counts.reserve<std::int32_t>(cells, "chunk tile counts");
  chunk_tile_counts_kernel<<<chunks, kHistogramThreads, 0, stream>>>(count, device_count, keys, key_layout, tiles,
                                                                     counts);
  PULSAR_CUDA_LAUNCH_CHECK("chunk_tile_counts_kernel");
  // In place: each (tile, chunk) cell becomes the number of stored instances before it.
  std::size_t scan_bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, counts, int(cells), stream));
  void* temp = scratch.cub_temp.reserve<unsigned char>(scan_bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, counts, int(cells), stream));
  const int key_bits = bit_width(std::uint64_t(tiles));  // holds `tiles`, the unplaced key
  scatter_by_tile_kernel<<<chunks, kScatterThreads, 0, stream>>>(
      count, device_count, keys, key_layout, slot_sphere, tiles, key_bits, counts, scratch.entry_sphere(),
      scratch.entry_slot(), scratch.tile_ranges.as<int2>(), scratch.overflow_record);
  PULSAR_CUDA_LAUNCH_CHECK("scatter_by_tile_kernel");
}

}  // namespace pulsar
