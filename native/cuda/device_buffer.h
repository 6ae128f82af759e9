// A move-only, growable device allocation for scratch that persists across calls. It only
// grows (by at least 1.5x) and never initialises its contents. Growing frees the old
// allocation first, so peak memory is the new size, not the sum.
//
// Captured CUDA graphs hold the addresses their launches were recorded with, so once a
// buffer has served a capture (keep_allocations) it never frees an allocation: growing
// retires the old one, and destruction leaves them all reserved. An allocation made while the
// calling thread's stream is being captured switches the thread to relaxed capture mode
// for the cudaMalloc (as PyTorch's caching allocator does): an allocation is not a
// stream operation, and the global mode forbids it during any capture
// (RelaxedCaptureMode).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.h"

namespace pulsar {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // A buffer that has served a capture frees nothing, even here: a captured graph may
  // outlive the renderer that recorded it, and its replays must not write into memory
  // handed to someone else (docs/design.md, "Capture": the memory stays reserved until
  // the process ends).
  ~DeviceBuffer() {
    if (keep_) return;
    release();
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        capacity_(std::exchange(o.capacity_, 0)),
        keep_(o.keep_),
        retired_(std::move(o.retired_)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
      keep_ = keep_ || o.keep_;
      for (void* p : o.retired_) retired_.push_back(p);
      o.retired_.clear();
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
      data_ = allocate(target, what);
      capacity_ = target;
    }
    return static_cast<E*>(data_);
  }

  // As reserve, but a reallocation keeps the first `keep` bytes: it copies them on
  // `stream` into the new allocation. A buffer that frees its old allocation waits for
  // the copy first (growing synchronises the stream once and holds both sizes for that
  // moment); one that keeps its allocations retires it without waiting. In the steady
  // state the capacity suffices and nothing happens.
  template <typename E>
  E* reserve_keeping(std::size_t count, std::size_t keep, cudaStream_t stream, const char* what) {
    if (count * sizeof(E) <= capacity_ || keep == 0 || data_ == nullptr) return reserve<E>(count, what);
    DeviceBuffer grown;
    grown.keep_ = keep_;
    grown.reserve<unsigned char>(std::max(count * sizeof(E), capacity_ + capacity_ / 2), what);
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(grown.data_, data_, keep, cudaMemcpyDeviceToDevice, stream));
    if (!keep_) PULSAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    *this = std::move(grown);
    return static_cast<E*>(data_);
  }

  // From now on, allocations are retired, not freed, until the buffer is destroyed.
  void keep_allocations() { keep_ = true; }

  template <typename E>
  E* as() const {
    return static_cast<E*>(data_);
  }
  std::size_t capacity() const { return capacity_; }

 private:
  static void* allocate(std::size_t bytes, const char* what) {
    void* p = nullptr;
    cudaError_t err = cudaSuccess;
    {
      RelaxedCaptureMode relaxed;
      err = cudaMalloc(&p, bytes);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("pulsar: cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what +
                               " failed: " + cudaGetErrorString(err));
    }
    return p;
  }
  void release() {
    if (data_ && keep_)
      retired_.push_back(data_);
    else if (data_)
      cudaFree(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  bool keep_ = false;
  std::vector<void*> retired_;  // allocations a captured graph may still address (never freed)
};

}  // namespace pulsar
