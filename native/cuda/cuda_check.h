// Every CUDA call and launch is checked; a failure becomes std::runtime_error naming
// the call (pybind11 turns it into a Python RuntimeError).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace pulsar {

inline void cuda_check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the Renderer stays usable
    throw std::runtime_error(std::string("pulsar: CUDA call ") + call + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
  }
}

#define PULSAR_CUDA_CHECK(call) ::pulsar::cuda_check((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here.
#define PULSAR_CUDA_LAUNCH_CHECK(name) ::pulsar::cuda_check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

// Switches the calling thread to relaxed stream-capture mode for the scope (and back):
// what it does then (allocations, a private stream's work) is not a stream operation of
// a capture in progress, which the global mode would refuse (as PyTorch's caching
// allocator does for its own cudaMalloc).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { PULSAR_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    PULSAR_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) PULSAR_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace pulsar
