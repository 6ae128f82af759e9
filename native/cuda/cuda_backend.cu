// The CUDA backend: owns the device scratch of one GPU and runs the CUDA stages on the
// caller's stream.
#include "../core/backend.h"
#include "cuda_scratch.h"

namespace pulsar {

namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const RendererConfig& config) : config_(config) {
    int count = 0;
    PULSAR_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (config.device_index < 0 || config.device_index >= count)
      throw std::invalid_argument("device: CUDA device " + std::to_string(config.device_index) + " requested, but " +
                                  std::to_string(count) + " are present");
    DeviceGuard guard(config.device_index);
    scratch_.device = config.device_index;
    scratch_.backward_row_budget = config.backward_row_budget;
    PULSAR_CUDA_CHECK(cudaDeviceGetAttribute(&scratch_.sm_count, cudaDevAttrMultiProcessorCount, config.device_index));
    // A renderer may be made inside a capture (its first call captured): nothing here is
    // a stream operation of the capture, and the record is zeroed on a private stream.
    RelaxedCaptureMode relaxed;
    PULSAR_CUDA_CHECK(cudaMallocHost(&scratch_.host_count, 3 * sizeof(std::int64_t)));
    PULSAR_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_.count_ready, cudaEventDisableTiming));
    PULSAR_CUDA_CHECK(cudaMallocHost(&scratch_.host_overflow, sizeof(std::int64_t)));
    PULSAR_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_.overflow_ready, cudaEventDisableTiming));
    PULSAR_CUDA_CHECK(cudaMalloc(&scratch_.overflow_record, sizeof(std::int64_t)));
    cudaStream_t zeroing = nullptr;
    PULSAR_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
    const cudaError_t zeroed = cudaMemsetAsync(scratch_.overflow_record, 0, sizeof(std::int64_t), zeroing);
    const cudaError_t waited = cudaStreamSynchronize(zeroing);
    cudaStreamDestroy(zeroing);
    PULSAR_CUDA_CHECK(zeroed);
    PULSAR_CUDA_CHECK(waited);
  }
  ~CudaBackend() override {
    if (scratch_.count_ready) cudaEventDestroy(scratch_.count_ready);
    if (scratch_.host_count) cudaFreeHost(scratch_.host_count);
    if (scratch_.overflow_ready) cudaEventDestroy(scratch_.overflow_ready);
    if (scratch_.host_overflow) cudaFreeHost(scratch_.host_overflow);
    // Captured graphs write the record: it stays reserved with the scratch (DeviceBuffer).
    if (scratch_.overflow_record && !scratch_.allocations_kept) cudaFree(scratch_.overflow_record);
  }

  void begin_binning(const SceneArgs& scene, const RenderOptions& options) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_begin_binning<decltype(tag)>(config_, scene, options, stream(options), scratch_);
    });
  }
  void finish_binning(const SceneArgs& scene, const RenderOptions& options) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype,
                   [&](auto tag) { cuda_finish_binning<decltype(tag)>(config_, scene, stream(options), scratch_); });
  }

  bool settle_binning(const RenderOptions& options) override {
    DeviceGuard guard(config_.device_index);
    return cuda_settle_binning(scratch_, stream(options));
  }

  void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_render_forward<decltype(tag)>(config_, scene, options, outputs, stream(options), scratch_);
    });
  }

  void partial_state(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_partial_state<decltype(tag)>(config_, options, scene.batch_size, outputs, stream(options));
    });
  }

  void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                       const GradientOutputs& grads) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_render_backward<decltype(tag)>(config_, scene, options, args, grads, stream(options), scratch_);
    });
  }

  void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads) override {
    DeviceGuard guard(config_.device_index);
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cuda_reduce_gradients<decltype(tag)>(config_, scene, grads, stream(options), scratch_);
      cuda_gradients_nan_on_failure<decltype(tag)>(config_, scene, options, grads, stream(options), scratch_);
    });
  }

  void* packed_cameras(std::size_t bytes) override {
    DeviceGuard guard(config_.device_index);
    return scratch_.packed_cameras.reserve<unsigned char>(bytes, "packed cameras");
  }
  const void* zero_features(std::size_t bytes, const RenderOptions& options) override {
    DeviceGuard guard(config_.device_index);
    auto* zeros = scratch_.zero_features.reserve<unsigned char>(bytes, "zero features");
    PULSAR_CUDA_CHECK(cudaMemsetAsync(zeros, 0, bytes, stream(options)));
    return zeros;
  }
  std::size_t scratch_bytes() const override { return scratch_.bytes(); }
  std::int64_t binned_instances() const override { return scratch_.n_instances; }

  void set_instance_capacity(std::int64_t capacity) override { scratch_.fixed_capacity = capacity; }
  std::int64_t instance_capacity() const override {
    return scratch_.fixed_capacity > 0 ? scratch_.fixed_capacity : scratch_.learnt_capacity;
  }
  std::int64_t take_overflow(void* stream_handle) override {
    DeviceGuard guard(config_.device_index);
    const auto stream = static_cast<cudaStream_t>(stream_handle);
    std::int64_t needed = 0;
    PULSAR_CUDA_CHECK(
        cudaMemcpyAsync(&needed, scratch_.overflow_record, sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream));
    PULSAR_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (needed > 0) clear_overflow_record(scratch_, needed, stream);
    scratch_.overflow_pending = false;  // this read supersedes a copy in flight
    return needed;
  }

 private:
  static cudaStream_t stream(const RenderOptions& options) { return static_cast<cudaStream_t>(options.stream); }
  RendererConfig config_;
  CudaScratch scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const RendererConfig& config) {
  return std::make_unique<CudaBackend>(config);
}

}  // namespace pulsar
