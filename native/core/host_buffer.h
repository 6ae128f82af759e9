// A move-only, growable host allocation for scratch that persists across calls. It only
// grows (by at least 1.5x, so sizes that creep upwards do not reallocate every call) and
// never initialises its contents.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "errors.h"

namespace pulsar {

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&&) = default;
  HostBuffer& operator=(HostBuffer&&) = default;

  // Ensures room for `count` elements of E and returns them.
  template <typename E>
  E* reserve(std::size_t count, const char* what) {
    const std::size_t bytes = count * sizeof(E);
    if (count != 0 && bytes / count != sizeof(E))
      throw std::length_error(concat("pulsar: scratch size overflow for ", what));
    if (bytes > capacity_) {
      const std::size_t grown = capacity_ + capacity_ / 2;
      const std::size_t target = bytes > grown ? bytes : grown;
      data_.reset();
      capacity_ = 0;
      try {
        data_.reset(new unsigned char[target]);
      } catch (const std::bad_alloc&) {
        throw std::runtime_error(
            concat("pulsar: allocating ", target, " bytes of host scratch for ", what, " failed (out of memory)"));
      }
      capacity_ = target;
    }
    return reinterpret_cast<E*>(data_.get());
  }

  template <typename E>
  E* as() const {
    return reinterpret_cast<E*>(data_.get());
  }
  std::size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<unsigned char[]> data_;
  std::size_t capacity_ = 0;
};

}  // namespace pulsar
