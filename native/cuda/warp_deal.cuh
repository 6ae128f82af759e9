// Work spread evenly over a warp. Every lane brings `count` items (the tiles of its own
// sphere, say); the warp deals the concatenation of all lanes' items out to its lanes,
// 32 per round, so that one lane with many items does not keep the other 31 waiting.
// All 32 lanes must call every member together (they shuffle).
#pragma once

namespace pulsar {

struct WarpDeal {
  static constexpr unsigned kFullMask = 0xffffffffu;
  int first;  // this lane's first item in the warp's concatenation
  int count;  // this lane's item count
  int total;  // the warp's item count

  __device__ static WarpDeal of(int count) {
    const int lane = int(threadIdx.x % 32);
    int end = count;  // inclusive scan over the lanes
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(kFullMask, end, offset);
      if (lane >= offset) end += other;
    }
    return WarpDeal{end - count, count, __shfl_sync(kFullMask, end, 31)};
  }

  // The lane whose items include item j (for j < total): the number of lanes whose
  // items all come before j, by binary search over the lanes' ends.
  __device__ int owner_of(int j) const {
    int owner = 0;
    for (int step = 16; step > 0; step /= 2) {
      const int end = __shfl_sync(kFullMask, first + count, owner + step - 1);
      if (end <= j) owner += step;
    }
    return owner < 31 ? owner : 31;
  }

  // Bits of the lanes that hold, in the round dealing items [base, base + 32), the items
  // [begin, end) of one lane.
  __device__ static unsigned lanes_holding(int begin, int end, int base) {
    const int lo = begin - base < 0 ? 0 : (begin - base > 32 ? 32 : begin - base);
    const int hi = end - base < 0 ? 0 : (end - base > 32 ? 32 : end - base);
    const unsigned below_hi = hi >= 32 ? kFullMask : ((1u << hi) - 1u);
    const unsigned below_lo = lo >= 32 ? kFullMask : ((1u << lo) - 1u);
    return below_hi & ~below_lo;
  }
};

}  // namespace pulsar
