// The instance sort of a binning with few tiles and instances, by counting: the same
// sorted lists as a stable radix sort of the tile keys followed by ranges_kernel and
// maps_kernel (setup_bin.cu), in four launches instead of ten (CUB's sort alone is two
// memsets, a histogram, a scan, and a memset and a onesweep kernel per 8-bit pass).
//
// The instances are cut into chunks of kSortChunk positions. chunk_tile_counts_kernel
// counts each chunk's instances per tile into a tile-major matrix [tile][chunk]; its
// exclusive scan (CUB) gives, for every (tile, chunk), where that chunk's instances of that
// tile start in the sorted order: after every instance of a lower tile and of the same
// tile in an earlier chunk. scatter_by_tile_kernel then walks each chunk in position
// order and places each instance after those of its tile already placed: a stable
// counting sort, so each tile's run keeps the slots' rank order.
#include <cub/device/device_scan.cuh>

#include "cuda_scratch.h"

namespace pulsar {

namespace {

constexpr int kHistogramThreads = 256;  // threads per block of both kernels

// Block c counts chunk c's stored instances (positions below the stored count) per tile
// in shared memory, then writes its column of the matrix, zeros included.
__global__ void chunk_tile_counts_kernel(std::int64_t count, const std::int64_t* device_count,
                                         const std::uint32_t* keys, int tiles, std::int32_t* counts) {
  __shared__ std::int32_t histogram[kMaxCountedSortTiles];
  const int chunk = int(blockIdx.x), chunks = int(gridDim.x);
  for (int t = int(threadIdx.x); t < tiles; t += kHistogramThreads) histogram[t] = 0;
  __syncthreads();
  const std::int64_t stored = device_count == nullptr ? count : min(*device_count, count);
  const std::int64_t first = std::int64_t(chunk) * kSortChunk;
  const std::int64_t end = min(first + kSortChunk, stored);
  for (std::int64_t p = first + threadIdx.x; p < end; p += kHistogramThreads) atomicAdd(&histogram[keys[p]], 1);
  __syncthreads();
  for (int t = int(threadIdx.x); t < tiles; t += kHistogramThreads)
    counts[std::int64_t(t) * chunks + chunk] = histogram[t];
}

// One block per chunk. Its threads stage the chunk's keys and each tile's first place
// for the chunk (the scanned matrix: next[t]) in shared memory, all loads in flight at
// once; one warp then walks the chunk in position order, 32 positions per round, from
// shared memory only: lanes with equal keys (__match_any_sync) take consecutive places in
// lane order after the tile's places taken so far. Then every thread writes its
// positions' sorted sphere and slot (the slots were the positions themselves:
// duplicate_kernel stores pair u at position u). Also writes the ranges of the tiles
// whose index is the chunk's modulo the chunk count, and, with the count on the device
// (device_count non-null), records a count beyond the capacity as ranges_kernel does.
__global__ void scatter_by_tile_kernel(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                                       const std::int32_t* slot_sphere, int tiles, const std::int32_t* starts,
                                       std::int32_t* entry_sphere, std::int32_t* entry_slot, int2* tile_ranges,
                                       std::int64_t* overflow_record) {
  __shared__ std::int32_t next[kMaxCountedSortTiles];
  __shared__ std::uint32_t chunk_keys[kSortChunk];
  __shared__ std::int32_t places[kSortChunk];
  const unsigned full = 0xffffffffu;
  const int chunk = int(blockIdx.x), chunks = int(gridDim.x);
  const int t0 = int(threadIdx.x);
  if (device_count != nullptr && chunk == 0 && t0 == 0 && *device_count > count)
    atomicMax(reinterpret_cast<unsigned long long*>(overflow_record), static_cast<unsigned long long>(*device_count));
  const std::int64_t stored = device_count == nullptr ? count : min(*device_count, count);
  const std::int64_t first = std::int64_t(chunk) * kSortChunk;
  const int n = int(max(std::int64_t(0), min(std::int64_t(kSortChunk), stored - first)));
  for (int k = t0; k < n; k += kHistogramThreads) chunk_keys[k] = keys[first + k];
  for (int t = t0; t < tiles; t += kHistogramThreads) next[t] = starts[std::int64_t(t) * chunks + chunk];
  // A tile's run: from its first chunk's start to the next tile's (the last: every stored
  // instance); tiles without instances keep the [0, 0) of zero_binning_kernel.
  for (int t = chunk + t0 * chunks; t < tiles; t += kHistogramThreads * chunks) {
    const std::int32_t begin = starts[std::int64_t(t) * chunks];
    const std::int32_t end = t + 1 < tiles ? starts[std::int64_t(t + 1) * chunks] : std::int32_t(stored);
    if (end > begin) tile_ranges[t] = make_int2(begin, end);
  }
  __syncthreads();
  if (t0 < 32) {
    const int lane = t0;
    const unsigned lanes_below = (1u << lane) - 1u;
    for (int base = 0; base < n; base += 32) {
      const int k = base + lane;
      const std::uint32_t key = k < n ? chunk_keys[k] : 0xffffffffu;  // never a tile
      const unsigned peers = __match_any_sync(full, key);
      const int before = __popc(peers & lanes_below);
      if (k < n) places[k] = next[key] + before;
      __syncwarp();
      if (k < n && before == 0) next[key] += __popc(peers);  // the group's first lane
      __syncwarp();
    }
  }
  __syncthreads();
  for (int k = t0; k < n; k += kHistogramThreads) {
    entry_sphere[places[k]] = slot_sphere[first + k];
    entry_slot[places[k]] = std::int32_t(first + k);
  }
}

}  // namespace

void cuda_sort_instances_by_counting(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                                     const std::int32_t* slot_sphere, int tiles, cudaStream_t stream,
                                     CudaScratch& scratch) {
  const int chunks = counted_sort_chunks(count);
  const std::size_t cells = std::size_t(tiles) * std::size_t(chunks);
  auto* counts = scratch.chunk_tile_counts.reserve<std::int32_t>(cells, "chunk tile counts");
  chunk_tile_counts_kernel<<<chunks, kHistogramThreads, 0, stream>>>(count, device_count, keys, tiles, counts);
  PULSAR_CUDA_LAUNCH_CHECK("chunk_tile_counts_kernel");
  // In place: each (tile, chunk) cell becomes the number of stored instances before it.
  std::size_t scan_bytes = 0;
  PULSAR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, counts, int(cells), stream));
  void* temp = scratch.cub_temp.reserve<unsigned char>(scan_bytes, "CUB workspace");
  PULSAR_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, counts, int(cells), stream));
  scatter_by_tile_kernel<<<chunks, kHistogramThreads, 0, stream>>>(
      count, device_count, keys, slot_sphere, tiles, counts, scratch.entry_sphere(), scratch.entry_slot(),
      scratch.tile_ranges.as<int2>(), scratch.overflow_record);
  PULSAR_CUDA_LAUNCH_CHECK("scatter_by_tile_kernel");
}

}  // namespace pulsar
