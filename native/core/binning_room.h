// The room an eager CUDA binning builds its lists in (docs/design.md, "Where the host
// waits"), learnt from the (tile, sphere) instance counts of the calls before it. Host
// code only, without CUDA, so that tests/native/binning_room/check.cpp runs the rule on
// any machine.
//
// A binning given room builds its lists without waiting for its count and checks the
// count afterwards; a count beyond the room costs a second binning, room far beyond the
// count costs sorting padding. So room is given only where the last two counts agree to
// a factor 2 (a scene that keeps its size, or changes it slowly); a scene that alternates
// between sizes, or has just jumped, reads its count back before it builds its lists,
// which costs neither.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pulsar {

class BinningRoom {
 public:
  // The largest room given (list positions are int32).
  static constexpr std::int64_t kMaxRoom = (std::int64_t(1) << 31) - 1;

  // Instances the next binning's lists are built for, 0 for a binning that reads its
  // count back first: no count learnt yet, an empty scene last, or the last two counts
  // more than a factor 2 apart. Otherwise the larger of the two, and an eighth more after
  // a count that grew (a scene that keeps its size gets exactly its count: the memory and
  // the sort of a binning sized by the count).
  std::int64_t next() const {
    if (last_ <= 0) return 0;
    if (before_ < 0) return last_;
    const std::int64_t high = std::max(last_, before_), low = std::min(last_, before_);
    if (2 * low < high) return 0;
    return std::min(last_ > before_ ? last_ + last_ / 8 : high, kMaxRoom);
  }

  // The count of a call's binning, read back (once per call: a call that bins again
  // after outgrowing its room tells only the second binning's count).
  void learn(std::int64_t count) {
    before_ = last_;
    last_ = count;
  }

 private:
  std::int64_t last_ = -1;  // the last count learnt (-1: none)
  std::int64_t before_ = -1;  // the one before it
};

}  // namespace pulsar
