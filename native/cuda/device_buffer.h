// A move-only, growable device allocation for scratch that persists across calls. It only
// grows (by at least 1.5x) and never initialises its contents. Growing frees the old
// allocation first, so peak memory is the new size, not the sum.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "cuda_check.h"

namespace pulsar {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename E>
  E* reserve(std::size_t count, const char* what) {
    const std::size_t bytes = count * sizeof(E);
    if (count != 0 && bytes / count != sizeof(E))
      throw std::length_error(std::string("pulsar: device scratch size overflow for ") + what);
    if (bytes > capacity_) {
      const std::size_t grown = capacity_ + capacity_ / 2;
      const std::size_t target = bytes > grown ? bytes : grown;
      release();
      void* p = nullptr;
      const cudaError_t err = cudaMalloc(&p, target);
      if (err != cudaSuccess) {
        cudaGetLastError();
        throw std::runtime_error(std::string("pulsar: cudaMalloc of ") + std::to_string(target) + " bytes for " + what +
                                 " failed: " + cudaGetErrorString(err));
      }
      data_ = p;
      capacity_ = target;
    }
    return static_cast<E*>(data_);
  }

  // As reserve, but a reallocation keeps the first `keep` bytes: it copies them on
  // `stream` into the new allocation and waits for the copy before freeing the old one.
  // Growing therefore synchronises the stream once and holds both sizes for that moment;
  // in the steady state the capacity suffices and nothing happens.
  template <typename E>
  E* reserve_keeping(std::size_t count, std::size_t keep, cudaStream_t stream, const char* what) {
    if (count * sizeof(E) <= capacity_ || keep == 0 || data_ == nullptr) return reserve<E>(count, what);
    DeviceBuffer grown;
    grown.reserve<unsigned char>(std::max(count * sizeof(E), capacity_ + capacity_ / 2), what);
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(grown.data_, data_, keep, cudaMemcpyDeviceToDevice, stream));
    PULSAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    *this = std::move(grown);
    return static_cast<E*>(data_);
  }

  template <typename E>
  E* as() const {
    return static_cast<E*>(data_);
  }
  std::size_t capacity() const { return capacity_; }

 private:
  void release() {
    if (data_) cudaFree(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace pulsar
