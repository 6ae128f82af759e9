// Stage 4 on CUDA: the partials summed into the caller's gradient arrays, each sum in a
// fixed order (no atomics), so gradients are bitwise reproducible.
//   spheres (once per backward window, cuda_reduce_sphere_rows): the rows the backward
//     stored contiguously by slot (a (camera, sphere) item's tiles row-major, the items in
//     depth rank order) are summed per rank within the window, then per sphere over its
//     cameras (ascending);
//   cameras: one block per camera sums its tiles' partials, then folds the frame
//     derivative (frame_backward);
//   background: one block sums all tiles.
#include <type_traits>

#include "cuda_scratch.h"
#include "warp_reduce.cuh"

namespace pulsar {

namespace {

constexpr int kThreads = 256;

// The widest word that divides a row of BYTES bytes: 16 or 8 bytes, else one value T.
template <int BYTES, typename T>
using RowWord = std::conditional_t<BYTES % 16 == 0, int4, std::conditional_t<BYTES % 8 == 0, int2, T>>;

// Loads row[0..N) into v in the widest aligned loads the row allows: the rows are
// scattered (each thread's own), so a warp's load touches 32 lines, and the L1 takes
// about one line per cycle: 16-byte loads take a quarter of the cycles of 4-byte ones
// (float with 3 channels: 8 values, 2 loads instead of 8). Rows of N values start at
// multiples of N * sizeof(T) from a 256-byte aligned base (InstanceArena).
template <typename T, int N>
__device__ void load_row(const T* row, T (&v)[N]) {
  using Word = RowWord<N* int(sizeof(T)), T>;
  Word words[sizeof(v) / sizeof(Word)];
#pragma unroll
  for (int k = 0; k < int(sizeof(v) / sizeof(Word)); ++k) words[k] = reinterpret_cast<const Word*>(row)[k];
  memcpy(v, words, sizeof(v));  // register moves
}

// Stores v to row[0..N), the widest aligned stores the row allows (as load_row).
template <typename T, int N>
__device__ void store_row(T* row, const T (&v)[N]) {
  using Word = RowWord<N* int(sizeof(T)), T>;
  Word words[sizeof(v) / sizeof(Word)];
  memcpy(words, v, sizeof(v));
#pragma unroll
  for (int k = 0; k < int(sizeof(v) / sizeof(Word)); ++k) reinterpret_cast<Word*>(row)[k] = words[k];
}

// Ranks a warp of sum_rank_rows_kernel takes (lanes past them hold none). Where the rows
// sit in few of the ranks, dozens each, a warp walks them one 32 of rows after another,
// waiting on its own loads and shuffles; half a warp's worth of ranks per warp puts twice
// the warps on the same rows.
constexpr int kRanksPerWarp = 16;

// First pass (static channel count, items of 3 rows or more on average): the sum of each
// depth rank's rows within the window [lo, hi), written over the first of them. A warp
// takes kRanksPerWarp consecutive ranks, whose rows are one contiguous run, 32 rows at a
// time, one row per lane (coalesced): a segmented scan over the lanes sums each rank's
// rows within the 32, and a rank's sum carries from one 32 to the next. Each sum has a
// fixed order (the scan's tree, then the 32s in order): bitwise reproducible. By rank, not
// by item: consecutive ranks' rows are adjacent, so the loads coalesce, where consecutive
// items' rows lie anywhere in the window.
template <typename T, int C_STATIC>
__global__ void sum_rank_rows_kernel(std::int64_t ranks, const std::int64_t* rank_slots, T* rows, std::int64_t lo,
                                     std::int64_t hi, LaunchGate gate) {
  if (!gate.open()) return;  // the one-pass reduction runs (LaunchGate)
  constexpr int kRow = kGpuInstFeatures + C_STATIC;
  constexpr unsigned kFullMask = 0xffffffffu;
  const int lane = int(threadIdx.x % 32);
  const std::int64_t warp_first = ((std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32) * kRanksPerWarp;
  const std::int64_t rank = lane < kRanksPerWarp ? warp_first + lane : ranks;  // ranks: none
  if (warp_first >= ranks) return;  // whole warps leave together
  const std::int64_t begin = max(rank_slots[warp_first], lo);
  const std::int64_t end = min(rank_slots[min(warp_first + kRanksPerWarp, ranks)], hi);
  if (end - begin < 2) return;  // no rank of the warp has two rows in the window
  // This lane's rank's rows in the window: [u0, u1) (empty: u1 <= u0).
  std::int64_t u0 = 0, u1 = 0;
  if (rank < ranks) {
    u0 = max(rank_slots[rank], lo);
    u1 = min(rank_slots[rank + 1], hi);
  }
  T carry[kRow] = {};  // the sum, over earlier 32s, of the rank whose rows run into this 32
  // Each 32's rows are loaded during the previous 32's scan: a warp's 32s follow one
  // another, and its load would otherwise wait out a memory latency per 32. (A sum is
  // stored over its rank's first row, in this 32 or an earlier one: never the next.)
  T next[kRow] = {};
  if (begin + lane < end) load_row(rows + (begin + lane - lo) * kRow, next);
  for (std::int64_t c = begin; c < end; c += 32) {
    T v[kRow];
#pragma unroll
    for (int f = 0; f < kRow; ++f) {
      v[f] = next[f];
      next[f] = T(0);
    }
    if (c + 32 + lane < end) load_row(rows + (c + 32 + lane - lo) * kRow, next);
    // Bit k: row c + k is a rank's first.
    const unsigned heads = warp_or(u1 > u0 && u0 >= c && u0 < c + 32 ? 1u << unsigned(u0 - c) : 0u);
    // Segmented inclusive scan: v becomes the sum of its rank's rows from the later of its
    // first row and c up to this lane's. Step d adds the value d lanes down when no rank
    // starts in (lane - d, lane] (bits lane - d + 1 .. lane; 2u << 31 wraps to 0).
    for (int d = 1; d < 32; d *= 2) {
      const unsigned between = (2u << lane) - (1u << (lane - d + 1 > 0 ? lane - d + 1 : 0));
      const bool add = lane >= d && (heads & between) == 0u;
#pragma unroll
      for (int f = 0; f < kRow; ++f) {
        const T other = __shfl_up_sync(kFullMask, v[f], d);
        if (add) v[f] = other + v[f];
      }
    }
    // A rank whose last row lies in this 32 takes the scan there, plus the carry when its
    // rows began in an earlier 32, and stores its sum over its first row.
    const std::int64_t last = u1 - 1;
    const bool ends_here = u1 - u0 >= 2 && last >= c && last < c + 32;
    const int at = ends_here ? int(last - c) : lane;
#pragma unroll
    for (int f = 0; f < kRow; ++f) {
      const T scanned = __shfl_sync(kFullMask, v[f], at);
      const T tail = __shfl_sync(kFullMask, v[f], 31);
      if (ends_here) v[f] = u0 < c ? carry[f] + scanned : scanned;
      // The rank open at lane 31 began in this 32 if any did.
      carry[f] = heads != 0u ? tail : carry[f] + tail;
    }
    if (ends_here) store_row(rows + (u0 - lo) * kRow, v);
  }
}

// C_STATIC > 0: the channel count, features summed in registers; 0: any count, summed in
// the output array. SUMMED: the first row of each item's slots within the window holds
// the sum of them all (sum_rank_rows_kernel ran; static channel count only).
template <typename T, int C_STATIC, bool SUMMED>
__global__ void reduce_sphere_rows_kernel(SceneArgs scene, int channels, GradientOutputs grads, const int2* item_slots,
                                          const T* rows, std::int64_t lo, std::int64_t hi, bool first,
                                          LaunchGate gate) {
  if (!gate.open()) return;  // the reduction of the other pass count runs (LaunchGate)
  const std::int64_t n = scene.n_spheres;
  const int sets = scene.shared_spheres ? 1 : scene.batch_size;
  const std::int64_t item = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= n * sets) return;
  const ItemIndex at = split_item(item, n);
  const std::int64_t set = at.camera, i = at.sphere;
  const int b_first = scene.shared_spheres ? 0 : int(set);
  const int b_last = scene.shared_spheres ? scene.batch_size : int(set) + 1;
  if (C_STATIC > 0) channels = C_STATIC;
  const int stride = kGpuInstFeatures + channels;
  constexpr int kSummed = kGpuInstFeatures + (C_STATIC > 0 ? C_STATIC : 0);  // values summed in registers
  T sums[kSummed] = {};
  auto* col = static_cast<T*>(grads.features);
  if (col && C_STATIC == 0 && first)
    for (int k = 0; k < channels; ++k) col[item * channels + k] = T(0);
  bool any = false;
  for (int b = b_first; b < b_last; ++b) {
    const int2 slots = item_slots[std::int64_t(b) * n + i];  // [first, end)
    const std::int64_t u_begin = max(std::int64_t(slots.x), lo), u_end = min(std::int64_t(slots.y), hi);
    any = any || u_begin < u_end;
    for (std::int64_t u = u_begin; u < (SUMMED ? min(u_end, u_begin + 1) : u_end); ++u) {
      const T* g = rows + (u - lo) * stride;
      T row[kSummed];
      if (C_STATIC > 0) {
        load_row(g, row);  // the whole row (stride == kSummed)
      } else {
#pragma unroll
        for (int f = 0; f < kSummed; ++f) row[f] = g[f];
      }
#pragma unroll
      for (int f = 0; f < kSummed; ++f) sums[f] += row[f];
      if (col && C_STATIC == 0)
        for (int k = 0; k < channels; ++k) col[item * channels + k] += g[kGpuInstFeatures + k];
    }
  }
  if (!first && !any) return;
  auto put = [first](void* out, std::int64_t index, T value) {
    T* o = static_cast<T*>(out) + index;
    *o = first ? value : *o + value;
  };
  if (grads.positions)
    for (int d = 0; d < 3; ++d) put(grads.positions, 3 * item + d, sums[kGpuInstPos + d]);
  if (grads.radii) put(grads.radii, item, sums[kGpuInstRadius]);
  if (grads.opacities) put(grads.opacities, item, sums[kGpuInstOpacity]);
  if (col && C_STATIC > 0)
    for (int k = 0; k < C_STATIC; ++k) put(col, item * C_STATIC + k, sums[kGpuInstFeatures + k]);
}

template <typename T, int C_STATIC>
void launch_reduce_sphere_rows(std::int64_t items, const SceneArgs& scene, int channels, const GradientOutputs& grads,
                               cudaStream_t stream, const CudaScratch& scratch, T* rows, std::int64_t lo,
                               std::int64_t hi, bool first) {
  // Two passes where items hold at least 3 rows on average: the first combines each
  // rank's rows in coalesced loads, so that the second reads one row per (item, camera).
  // With fewer rows per item the first pass combines little and only adds a pass over the
  // rows.
  const std::int64_t ranks = scene.n_spheres * scene.batch_size;  // (camera, sphere) items, by depth rank
  auto reduce = [&](auto summed, LaunchGate gate) {
    reduce_sphere_rows_kernel<T, C_STATIC, decltype(summed)::value>
        <<<blocks_for(items, kThreads), kThreads, 0, stream>>>(scene, channels, grads, scratch.item_slots(), rows, lo,
                                                               hi, first, gate);
    PULSAR_CUDA_LAUNCH_CHECK("reduce_sphere_rows_kernel");
  };
  // With the counts on the device only (a binning sized by its capacity), both ways are
  // launched, each gated by the same rule.
  const bool on_device = scratch.device_counts != nullptr;
  if constexpr (C_STATIC > 0) {
    if (on_device || LaunchGate::many_rows(scratch.n_instances, ranks)) {
      const LaunchGate gate = on_device ? LaunchGate::of(scratch, LaunchGate::kManyRows, ranks) : LaunchGate{};
      const std::int64_t warps = (ranks + kRanksPerWarp - 1) / kRanksPerWarp;
      sum_rank_rows_kernel<T, C_STATIC><<<blocks_for(warps * 32, kThreads), kThreads, 0, stream>>>(
          ranks, scratch.sphere_slots.as<std::int64_t>(), rows, lo, hi, gate);
      PULSAR_CUDA_LAUNCH_CHECK("sum_rank_rows_kernel");
      reduce(std::true_type{}, gate);
      if (!on_device) return;
    }
  }
  reduce(std::false_type{},
         on_device && C_STATIC > 0 ? LaunchGate::of(scratch, LaunchGate::kFewRows, ranks) : LaunchGate{});
}

// Fixed-order block sum: thread t sums rows t, t + 256, ...; then a shared-memory tree.
template <typename T>
__device__ T block_rows_sum(const T* rows, std::int64_t n_rows, int row_stride, int column, T* shared) {
  T s = 0;
  for (std::int64_t r = threadIdx.x; r < n_rows; r += kThreads) s += rows[r * row_stride + column];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

// The camera reduction's first step splits a camera's tile rows into at most this many
// chunks of equal size (the last one shorter), one block per chunk; its threads that
// take part are a whole number of rows' worth of columns, so that each thread's values
// lie in one column while a warp reads 32 consecutive values.
constexpr int kCameraChunks = 32;
constexpr int kChunkGroups = kThreads / kCameraGradValues;       // 11 rows' worth
constexpr int kChunkThreads = kChunkGroups * kCameraGradValues;  // 253 threads

// Block (s, b) sums camera b's tile rows [s * rows_per_chunk, (s + 1) * rows_per_chunk)
// per column, in a fixed order, into chunk_sums[b][s][.]. The chunks spread the rows over
// many SMs, and each is read as one flat run of values, a warp's loads consecutive: with
// one thread per tile row on one SM, each of a row's kCameraGradValues loads would touch
// 32 rows' lines per warp. The last of camera b's blocks to finish (counted in its
// CameraWords::kChunksSummed, which that block sets back to 0 for the next reduction)
// then sums the chunks and applies the frame derivative: thread t sums chunks t, t + 256,
// ... of all kCameraGradValues columns in registers, then shuffle trees per warp and the
// warps in index order. Every addition's order is fixed, whichever block comes last.
// One launch for both steps.
template <typename T>
__global__ void reduce_camera_kernel(RendererConfig config, SceneArgs scene, std::int64_t n_tiles,
                                     std::int64_t rows_per_chunk, const T* tile_camera, T* chunk_sums,
                                     std::uint32_t* camera_words, T* out) {
  constexpr int kWarps = kThreads / 32;
  __shared__ T group_sums[kChunkThreads];
  __shared__ T warp_totals[kWarps][kCameraGradValues];
  __shared__ T total[kCameraGradValues];
  __shared__ bool last_block;
  const int s = blockIdx.x, b = blockIdx.y, t = threadIdx.x;
  const int chunks = int(gridDim.x);
  const std::int64_t first = std::int64_t(s) * rows_per_chunk * kCameraGradValues;
  const std::int64_t end = min(std::int64_t(s + 1) * rows_per_chunk, n_tiles) * kCameraGradValues;
  const T* values = tile_camera + std::int64_t(b) * n_tiles * kCameraGradValues;
  T* camera_chunks = chunk_sums + std::int64_t(b) * chunks * kCameraGradValues;
  if (t < kChunkThreads) {
    T sum = T(0);  // of column t % kCameraGradValues: the step is whole rows
#pragma unroll 4
    for (std::int64_t i = first + t; i < end; i += kChunkThreads) sum += values[i];
    group_sums[t] = sum;
  }
  __syncthreads();
  if (t < kCameraGradValues) {
    T x = T(0);
    for (int g = 0; g < kChunkGroups; ++g) x += group_sums[g * kCameraGradValues + t];
    camera_chunks[std::int64_t(s) * kCameraGradValues + t] = x;
    __threadfence();  // the sum is visible to every block before the count says so
  }
  __syncthreads();
  std::uint32_t* summed = camera_words + b * CameraWords::kCount + CameraWords::kChunksSummed;
  if (t == 0) last_block = atomicAdd(summed, 1u) == std::uint32_t(chunks - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const int warp = t / 32, lane = t % 32;
  T sums[kCameraGradValues];
  for (int v = 0; v < kCameraGradValues; ++v) sums[v] = T(0);
  // Other blocks' sums: read from L2 (__ldcg), past this SM's L1.
  for (int r = t; r < chunks; r += kThreads)
    for (int v = 0; v < kCameraGradValues; ++v) sums[v] += __ldcg(camera_chunks + r * kCameraGradValues + v);
  for (int v = 0; v < kCameraGradValues; ++v) {
    const T x = warp_sum(sums[v]);
    if (lane == 0) warp_totals[warp][v] = x;
  }
  __syncthreads();
  if (t < kCameraGradValues) {
    T x = 0;
    for (int w = 0; w < kWarps; ++w) x += warp_totals[w][t];
    total[t] = x;
  }
  __syncthreads();
  if (t != 0) return;
  *summed = 0u;
  const CameraGrad<T> g = CameraGrad<T>::from_array(total);
  const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
  frame_backward(cam, g, out + std::int64_t(b) * CAMERA_PARAMS);
}

template <typename T>
__global__ void reduce_background_kernel(std::int64_t tiles, int channels, const T* tile_bg, T* out) {
  __shared__ T shared[kThreads];
  for (int k = 0; k < channels; ++k) {
    const T s = block_rows_sum(tile_bg, tiles, channels, k, shared);
    if (threadIdx.x == 0) out[k] = s;
  }
}

}  // namespace

template <typename T>
void cuda_reduce_sphere_rows(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                             cudaStream_t stream, const CudaScratch& scratch, T* rows, std::int64_t lo, std::int64_t hi,
                             bool first) {
  const int sets = scene.shared_spheres ? 1 : scene.batch_size;
  const std::int64_t items = scene.n_spheres * sets;
  if (items == 0) return;
  switch (config.n_channels) {
    case 1:
      launch_reduce_sphere_rows<T, 1>(items, scene, config.n_channels, grads, stream, scratch, rows, lo, hi, first);
      break;
    case 3:
      launch_reduce_sphere_rows<T, 3>(items, scene, config.n_channels, grads, stream, scratch, rows, lo, hi, first);
      break;
    case 4:
      launch_reduce_sphere_rows<T, 4>(items, scene, config.n_channels, grads, stream, scratch, rows, lo, hi, first);
      break;
    default:
      launch_reduce_sphere_rows<T, 0>(items, scene, config.n_channels, grads, stream, scratch, rows, lo, hi, first);
      break;
  }
}

template <typename T>
void cuda_reduce_gradients(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                           cudaStream_t stream, CudaScratch& scratch) {
  // Partial rows per camera: one per tile and backward block (render_backward.cu).
  const std::int64_t n_tiles = Tiling::of(config.width, config.height).n_tiles() * scratch.backward_splits;
  if (grads.cameras) {
    const std::int64_t rows_per_chunk = (n_tiles + kCameraChunks - 1) / kCameraChunks;
    const int chunks = int((n_tiles + rows_per_chunk - 1) / rows_per_chunk);
    T* chunk_sums = scratch.camera_chunk_sums.reserve<T>(
        std::size_t(scene.batch_size) * std::size_t(chunks) * kCameraGradValues, "camera gradient chunks");
    reduce_camera_kernel<T><<<dim3(unsigned(chunks), unsigned(scene.batch_size)), kThreads, 0, stream>>>(
        config, scene, n_tiles, rows_per_chunk, scratch.tile_camera_grads.as<T>(), chunk_sums,
        scratch.camera_words.as<std::uint32_t>(), static_cast<T*>(grads.cameras));
    PULSAR_CUDA_LAUNCH_CHECK("reduce_camera_kernel");
  }
  if (grads.background) {
    reduce_background_kernel<T><<<1, kThreads, 0, stream>>>(n_tiles * scene.batch_size, config.n_channels,
                                                            scratch.tile_background_grads.as<T>(),
                                                            static_cast<T*>(grads.background));
    PULSAR_CUDA_LAUNCH_CHECK("reduce_background_kernel");
  }
}

template void cuda_reduce_sphere_rows<float>(const RendererConfig&, const SceneArgs&, const GradientOutputs&,
                                             cudaStream_t, const CudaScratch&, float*, std::int64_t, std::int64_t,
                                             bool);
template void cuda_reduce_sphere_rows<double>(const RendererConfig&, const SceneArgs&, const GradientOutputs&,
                                              cudaStream_t, const CudaScratch&, double*, std::int64_t, std::int64_t,
                                              bool);
template void cuda_reduce_gradients<float>(const RendererConfig&, const SceneArgs&, const GradientOutputs&,
                                           cudaStream_t, CudaScratch&);
template void cuda_reduce_gradients<double>(const RendererConfig&, const SceneArgs&, const GradientOutputs&,
                                            cudaStream_t, CudaScratch&);

}  // namespace pulsar
