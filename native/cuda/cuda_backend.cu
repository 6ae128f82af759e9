// The CUDA backend: runs the CUDA stages on the caller's stream in the caller's memory
// (CallMemory, carved by cuda_memory.h), and keeps the renderer's status on the device
// (DeviceStatus) and the slots the device reports binnings in (BinningReportWords, pinned
// host memory the device writes).
#include <algorithm>
#include <cstring>
#include <limits>

#include "../core/backend.h"
#include "cuda_memory.h"

namespace pulsar {

namespace {

CallSizes call_sizes(const RendererConfig& config, DType dtype, int batch_size, std::int64_t n_spheres,
                     std::int64_t capacity) {
  CallSizes z;
  z.batch = batch_size;
  z.items = n_spheres * batch_size;
  z.total_tiles = Tiling::of(config.width, config.height).n_tiles() * batch_size;
  z.capacity = capacity;
  z.sphere_bytes = dtype == DType::Float64 ? sizeof(GpuSphere<double>) : sizeof(GpuSphere<float>);
  z.value_bytes = dtype == DType::Float64 ? sizeof(double) : sizeof(float);
  z.channels = config.n_channels;
  return z;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const RendererConfig& config) : config_(config) {
    int count = 0;
    PULSAR_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (config.device_index < 0 || config.device_index >= count)
      throw std::invalid_argument("device: CUDA device " + std::to_string(config.device_index) +
                                  " requested, but " + std::to_string(count) + " are present");
    DeviceGuard guard(config.device_index);
    PULSAR_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, config.device_index));
    PULSAR_CUDA_CHECK(cudaMalloc(&status_, sizeof(DeviceStatus)));
    PULSAR_CUDA_CHECK(cudaMemset(status_, 0, sizeof(DeviceStatus)));
    void* reports = nullptr;
    PULSAR_CUDA_CHECK(cudaHostAlloc(&reports, sizeof(BinningReportWords) * kReportSlots, cudaHostAllocMapped));
    reports_ = static_cast<BinningReportWords*>(reports);
    std::memset(reports_, 0, sizeof(BinningReportWords) * kReportSlots);
    PULSAR_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_reports_), reports, 0));
    PULSAR_CUDA_CHECK(cudaEventCreateWithFlags(&report_ready_, cudaEventDisableTiming));
  }
  ~CudaBackend() override {
    if (report_ready_) cudaEventDestroy(report_ready_);
    if (reports_) cudaFreeHost(reports_);
    if (status_) cudaFree(status_);
  }

  MemoryNeeds memory_needs(DType dtype, int batch_size, std::int64_t n_spheres,
                           std::int64_t capacity) const override {
    DeviceGuard guard(config_.device_index);
    const CallSizes z = call_sizes(config_, dtype, batch_size, n_spheres, capacity);
    Carver binning;
    BinningView::carve(binning, z, nullptr);
    Carver forward, backward;
    ForwardWorkspace::carve(forward, z, tile_depth_bound_words(config_, batch_size), cub_bytes(z));
    BackwardWorkspace::carve(backward, z, windows_of(z), backward_splits_of(z.total_tiles, sm_count_));
    MemoryNeeds needs;
    needs.binning_bytes = binning.bytes();
    needs.workspace_bytes = std::max(forward.bytes(), backward.bytes());
    return needs;
  }

  void bin(const SceneArgs& scene, const RenderOptions& options, const CallMemory& memory, bool count_only,
           bool report) override {
    DeviceGuard guard(config_.device_index);
    CudaCall call = forward_call(scene, memory);
    if (report) {
      // A slot of its own: other calls of this renderer (other streams) may report meanwhile.
      slot_ = (slot_ + 1) % kReportSlots;
      reports_[slot_].written = 0u;
      call.report = device_reports_ + slot_;
    }
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_bin_count<decltype(tag)>(config_, scene, options, stream(options), call, count_only);
    });
    forward_variant_ = -1;
    if (!report) {
      // Nothing waits: the lists are sorted over the whole capacity.
      dispatch_dtype(scene.dtype, [&](auto tag) {
        cuda_bin_lists<decltype(tag)>(config_, scene, stream(options), call, memory.capacity);
      });
      return;
    }
    PULSAR_CUDA_CHECK(cudaEventRecord(report_ready_, stream(options)));
    report_ = read_report(count_only ? std::numeric_limits<std::int64_t>::max() : memory.capacity);
    if (count_only) return;
    // A verified call has waited for its count already: its lists are sorted at their size
    // (past the capacity, the lists hold what fits and the call's outputs are NaN), and its
    // forward launches the one kernel the counts choose.
    if (!report_.overflowed)
      forward_variant_ = 2 * report_.small_box_instances >= report_.instances ? kSmallBoxVariant : kLargeBoxVariant;
    const std::int64_t sort_items = report_.overflowed ? memory.capacity : report_.instances;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_bin_lists<decltype(tag)>(config_, scene, stream(options), call, sort_items);
    });
  }

  BinningReport take_report(const RenderOptions&) override {
    BinningReport report = report_;
    report_ = BinningReport{};
    return report;
  }

  bool holds_binning(const CallMemory&) const override { return true; }

  void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs,
                      const CallMemory& memory) override {
    DeviceGuard guard(config_.device_index);
    CudaCall call = forward_call(scene, memory);
    call.forward_variant = forward_variant_;
    forward_variant_ = -1;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_render_forward<decltype(tag)>(config_, scene, options, outputs, stream(options), call);
    });
  }

  void partial_state(const SceneArgs& scene, const RenderOptions& options,
                     const ForwardOutputs& outputs) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_partial_state<decltype(tag)>(config_, options, scene.batch_size, outputs, stream(options));
    });
  }

  void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                       const GradientOutputs& grads, const CallMemory& memory) override {
    DeviceGuard guard(config_.device_index);
    CudaCall call = backward_call(scene, memory);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_render_backward<decltype(tag)>(config_, scene, options, args, grads, stream(options), call);
    });
  }

  void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads,
                        const CallMemory& memory) override {
    DeviceGuard guard(config_.device_index);
    const CudaCall call = backward_call(scene, memory);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_reduce_gradients<decltype(tag)>(config_, scene, grads, stream(options), call);
    });
  }

  void* packed_cameras(const CallMemory& memory, std::size_t bytes) override {
    // carve_packed_cameras puts them first in either stage's workspace.
    if (bytes > memory.workspace_bytes) throw std::logic_error("pulsar: packed cameras exceed the workspace");
    return memory.workspace;
  }
  const void* zero_features(const SceneArgs& scene, const CallMemory& memory, std::size_t bytes,
                            const RenderOptions& options) override {
    DeviceGuard guard(config_.device_index);
    unsigned char* zeros = forward_call(scene, memory).forward.zero_features;
    PULSAR_CUDA_CHECK(cudaMemsetAsync(zeros, 0, bytes, stream(options)));
    return zeros;
  }

  RendererStatus take_status(void* stream_handle, bool wait) override {
    DeviceGuard guard(config_.device_index);
    const auto s = static_cast<cudaStream_t>(stream_handle);
    if (wait) PULSAR_CUDA_CHECK(cudaStreamSynchronize(s));
    DeviceStatus now{};
    PULSAR_CUDA_CHECK(cudaMemcpyAsync(&now, status_, sizeof(now), cudaMemcpyDeviceToHost, s));
    PULSAR_CUDA_CHECK(cudaStreamSynchronize(s));
    RendererStatus status;
    status.max_instances = std::int64_t(now.max_instances);
    status.overflowed = now.overflows != seen_.overflows;
    status.invalid_values = now.invalid_values != seen_.invalid_values;
    seen_ = now;
    return status;
  }

  std::size_t scratch_bytes() const override { return sizeof(DeviceStatus); }

  // Waits for the report of the binning just enqueued (on the event behind it, not the
  // stream: the work enqueued after it keeps running) and reads it.
  BinningReport read_report(std::int64_t capacity) {
    PULSAR_CUDA_CHECK(cudaEventSynchronize(report_ready_));
    const BinningReportWords& words = reports_[slot_];
    if (words.written == 0u) throw std::logic_error("pulsar: a binning's report was not written");
    BinningReport report;
    report.verified = true;
    report.instances = words.instances;
    report.small_box_instances = words.small_box_instances;
    report.overflowed = report.instances > capacity;
    report.max_instances = std::int64_t(words.status.max_instances);
    report.overflows = int(words.status.overflows - seen_.overflows);
    report.invalid_values = int(words.status.invalid_values - seen_.invalid_values);
    seen_ = words.status;
    last_instances_ = report.instances;
    return report;
  }
  std::int64_t binned_instances() const override { return last_instances_; }

 private:
  static cudaStream_t stream(const RenderOptions& options) { return static_cast<cudaStream_t>(options.stream); }

  std::size_t cub_bytes(const CallSizes& z) const {
    if (z.items != cub_items_ || z.capacity != cub_capacity_ || z.total_tiles != cub_tiles_) {
      cub_bytes_ = cub_binning_bytes(z.items, z.capacity, z.total_tiles);
      cub_items_ = z.items;
      cub_capacity_ = z.capacity;
      cub_tiles_ = z.total_tiles;
    }
    return cub_bytes_;
  }
  RowWindows windows_of(const CallSizes& z) const {
    return RowWindows::of(z.capacity, std::int64_t(z.value_bytes) * (kGpuInstFeatures + z.channels),
                          config_.backward_row_budget);
  }
  CudaCall call_of(const SceneArgs& scene, const CallMemory& memory) const {
    CudaCall call;
    call.sizes = call_sizes(config_, scene.dtype, scene.batch_size, scene.n_spheres, memory.capacity);
    Carver binning(memory.binning);
    call.binning = BinningView::carve(binning, call.sizes, memory.entries);
    call.sm_count = sm_count_;
    call.backward_splits = backward_splits_of(call.sizes.total_tiles, sm_count_);
    call.backward_row_budget = config_.backward_row_budget;
    call.status = status_;
    return call;
  }
  CudaCall forward_call(const SceneArgs& scene, const CallMemory& memory) const {
    CudaCall call = call_of(scene, memory);
    Carver ws(memory.workspace);
    call.forward = ForwardWorkspace::carve(ws, call.sizes, tile_depth_bound_words(config_, scene.batch_size),
                                           cub_bytes(call.sizes));
    return call;
  }
  CudaCall backward_call(const SceneArgs& scene, const CallMemory& memory) const {
    CudaCall call = call_of(scene, memory);
    Carver ws(memory.workspace);
    call.backward = BackwardWorkspace::carve(ws, call.sizes, windows_of(call.sizes), call.backward_splits);
    return call;
  }

  RendererConfig config_;
  int sm_count_ = 1;
  DeviceStatus* status_ = nullptr;
  BinningReportWords* reports_ = nullptr;         // host view of the report slots
  BinningReportWords* device_reports_ = nullptr;  // the device's view of them
  int slot_ = 0;                                  // the slot of the last report asked for
  BinningReport report_;                          // the last verified binning's, until taken
  int forward_variant_ = -1;                      // CudaCall::forward_variant for the next render_forward
  cudaEvent_t report_ready_ = nullptr;            // recorded behind the last reported binning
  DeviceStatus seen_{};                           // the status as the host last read it
  std::int64_t last_instances_ = 0;
  mutable std::size_t cub_bytes_ = 0;
  mutable std::int64_t cub_items_ = -1, cub_capacity_ = -1, cub_tiles_ = -1;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const RendererConfig& config) {
  return std::make_unique<CudaBackend>(config);
}

std::size_t cuda_binning_bytes(int width, int height, DType dtype, int batch_size, std::int64_t n_spheres) {
  RendererConfig config;
  config.width = width;
  config.height = height;
  const CallSizes z = call_sizes(config, dtype, batch_size, n_spheres, 0);
  Carver binning;
  BinningView::carve(binning, z, nullptr);
  return binning.bytes();
}

}  // namespace pulsar
