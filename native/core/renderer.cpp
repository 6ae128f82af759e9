// The stage sequence, written once for every backend (see backend.h).
#include "pulsar/renderer.h"

#include "backend.h"
#include "camera_convert.h"
#include "errors.h"
#include "scene_view.h"
#include "tiling.h"

#include <stdexcept>

namespace pulsar {

Renderer::Renderer(const RendererConfig& config) : config_(config) {
  PULSAR_REQUIRE(config.width >= 1 && config.width <= kMaxImageSide, "width: expected 1..", kMaxImageSide,
                 " pixels, got ", config.width);
  PULSAR_REQUIRE(config.height >= 1 && config.height <= kMaxImageSide, "height: expected 1..", kMaxImageSide,
                 " pixels, got ", config.height);
  PULSAR_REQUIRE(config.n_channels >= 1, "n_channels: expected >= 1, got ", config.n_channels);
  PULSAR_REQUIRE(config.n_track >= 1 && config.n_track <= kMaxTrack, "n_track: expected 1..", kMaxTrack, ", got ",
                 config.n_track);
  PULSAR_REQUIRE(config.background_normalized_depth > 0 && config.background_normalized_depth < 1,
                 "background_normalized_depth: expected a value in (0, 1), got ", config.background_normalized_depth);
  PULSAR_REQUIRE(config.num_threads >= 0, "num_threads: expected >= 0 (0: every core), got ", config.num_threads);
  PULSAR_REQUIRE(config.backward_row_budget >= 0, "backward_row_budget: expected >= 0 bytes (0: default), got ",
                 config.backward_row_budget);
  if (config.device == DeviceKind::CUDA) {
#ifdef PULSAR_WITH_CUDA
    backend_ = make_cuda_backend(config);
#else
    throw std::invalid_argument(
        "device: CUDA requested, but this build of pulsar_py has no CUDA backend "
        "(see pulsar_py.build_info())");
#endif
  } else {
    backend_ = make_cpu_backend(config);
  }
}

Renderer::~Renderer() = default;

std::size_t Renderer::scratch_bytes() const { return backend_->scratch_bytes(); }
std::int64_t Renderer::binned_instances() const { return backend_->binned_instances(); }

void Renderer::check_call(const SceneArgs& scene, const RenderOptions& options) const {
  PULSAR_REQUIRE(scene.batch_size >= 1, "batch_size: expected >= 1, got ", scene.batch_size);
  // Tiles of all cameras are numbered in 31 bits (the CUDA sort key keeps 32 for them).
  const std::int64_t tiles = Tiling::of(config_.width, config_.height).n_tiles() * scene.batch_size;
  PULSAR_REQUIRE(tiles < (std::int64_t(1) << 31), "batch_size: ", scene.batch_size, " cameras of ", config_.width, "x",
                 config_.height, " pixels exceed 2^31 tiles");
  PULSAR_REQUIRE(scene.n_spheres >= 0 && scene.n_spheres <= (std::int64_t(1) << 31) - 1,
                 "n_spheres: expected 0..2^31-1, got ", scene.n_spheres);
  PULSAR_REQUIRE(scene.n_spheres == 0 || (scene.positions && scene.features && scene.radii),
                 "positions, features, radii: null pointer");
  PULSAR_REQUIRE(scene.background && scene.cameras, "background, cameras: null pointer");
  if (options.values == nullptr) {
    PULSAR_REQUIRE(options.gamma >= 1e-5 && options.gamma <= 1.0, "gamma: expected a value in [1e-5, 1], got ",
                   options.gamma);
    PULSAR_REQUIRE(options.percent_allowed_difference >= 0 && options.percent_allowed_difference < 1,
                   "percent_allowed_difference: expected a value in [0, 1), got ", options.percent_allowed_difference);
  } else if (config_.device == DeviceKind::CPU) {  // CUDA values are checked on the device
    const double* v = options.values;
    PULSAR_REQUIRE(call_values_valid(v),
                   "values: expected gamma in [1e-5, 1], percent_allowed_difference in [0, 1) and 0 <= min_depth < "
                   "max_depth < inf, got ",
                   v[CallValue::kGamma], ", ", v[CallValue::kPercentAllowedDifference], ", ", v[CallValue::kMinDepth],
                   ", ", v[CallValue::kMaxDepth]);
  }
  PULSAR_REQUIRE(options.max_n_hits != 0, "max_n_hits: expected >= 1 (or negative: unlimited), got 0");
  const int length = scene.camera_vectors.length;
  PULSAR_REQUIRE(length == 0 || length == 8 || length == 10 || length == 11 || length == 13,
                 "camera_vectors.length: expected 0 (packed cameras) or 8, 10, 11, 13, got ", length);
}

// Marks the renderer in use for the length of one call: its scratch and binning belong to
// one call at a time, so an overlapping call (another thread) is refused, not raced.
class Renderer::Busy {
 public:
  explicit Busy(std::atomic<bool>& flag) : flag_(flag) {
    if (flag_.exchange(true, std::memory_order_acquire))
      throw std::runtime_error(
          "Renderer: called while another call of the same renderer is running (on another "
          "thread); a renderer serves one call at a time: give each thread its own renderer");
  }
  ~Busy() { flag_.store(false, std::memory_order_release); }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  std::atomic<bool>& flag_;
};

std::int64_t Renderer::instance_capacity() const { return backend_->instance_capacity(); }

void Renderer::set_instance_capacity(std::int64_t capacity) {
  // The CUDA sort takes its item count as an int.
  PULSAR_REQUIRE(capacity >= 0 && capacity < (std::int64_t(1) << 31),
                 "instance_capacity: expected 0 (learnt) or 1..2^31-1 instances, got ", capacity);
  Busy busy(busy_);
  backend_->set_instance_capacity(capacity);
}

std::int64_t Renderer::take_instance_overflow(void* stream) {
  Busy busy(busy_);
  return backend_->take_overflow(stream);
}

namespace {

void check_forward_outputs(const ForwardOutputs& outputs) {
  PULSAR_REQUIRE(outputs.image && outputs.blend_state && outputs.hit_count && outputs.traversal_end,
                 "forward outputs: image, blend_state, hit_count and traversal_end are required");
}

std::size_t element_size(DType dtype) { return dtype == DType::Float64 ? sizeof(double) : sizeof(float); }

CameraParamsArgs conversion_of(const SceneArgs& scene, const RendererConfig& config, const RenderOptions& options) {
  CameraParamsArgs args;
  args.dtype = scene.dtype;
  args.device = config.device;
  args.device_index = config.device_index;
  args.stream = options.stream;
  args.batch_size = scene.batch_size;
  args.length = scene.camera_vectors.length;
  args.width = config.width;
  args.height = config.height;
  args.orthographic = config.orthographic;
  args.right_handed = scene.right_handed;
  args.first_R_then_T = scene.camera_vectors.first_R_then_T;
  args.min_depth = scene.camera_vectors.min_depth;
  args.max_depth = scene.camera_vectors.max_depth;
  args.values = options.values;
  args.params = scene.cameras;
  return args;
}

}  // namespace

SceneArgs Renderer::with_packed_cameras(const SceneArgs& scene, const RenderOptions& options, bool convert) {
  if (scene.camera_vectors.length == 0) return scene;
  const std::size_t bytes = std::size_t(scene.batch_size) * CAMERA_PARAMS * element_size(scene.dtype);
  // Packed cameras in the first half, their gradient (backward) in the second.
  void* packed = backend_->packed_cameras(2 * bytes);
  if (convert) camera_params_to_packed(conversion_of(scene, config_, options), packed);
  SceneArgs converted = scene;
  converted.cameras = packed;
  converted.camera_vectors = CameraVectors{};
  return converted;
}

void Renderer::bin(const SceneArgs& scene, const RenderOptions& options) {
  binned_for_ = nullptr;  // a failure part-way leaves no binning to reuse
  backend_->begin_binning(scene, options);
  complete_binning(scene, options);
}

void Renderer::complete_binning(const SceneArgs& scene, const RenderOptions& options) {
  backend_->finish_binning(scene, options);
  if (!backend_->settle_binning(options)) return;
  // The lists lacked room for this scene's instances: bin again. That binning reads its
  // count back before it builds its lists (Backend::settle_binning), so they hold them
  // all and there is nothing to settle.
  backend_->begin_binning(scene, options);
  backend_->finish_binning(scene, options);
}

void Renderer::forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) {
  check_forward_outputs(outputs);
  forward(scene, options, [&outputs] { return outputs; });
}

void Renderer::forward(const SceneArgs& scene_in, const RenderOptions& options,
                       const std::function<ForwardOutputs()>& make_outputs) {
  Busy busy(busy_);
  check_call(scene_in, options);
  // Converting the cameras overwrites those a kept binning came with: none is kept from
  // here on, whatever fails.
  binned_for_ = nullptr;
  SceneArgs scene = with_packed_cameras(scene_in, options);
  if (options.partial)
    scene.background = backend_->zero_features(std::size_t(config_.n_channels) * element_size(scene.dtype), options);
  backend_->begin_binning(scene, options);
  const ForwardOutputs outputs = make_outputs();
  check_forward_outputs(outputs);
  complete_binning(scene, options);
  backend_->render_forward(scene, options, outputs);
  if (options.partial) backend_->partial_state(scene, options, outputs);
  binned_for_ = outputs.traversal_end;
}

void Renderer::backward(const SceneArgs& scene_in, const RenderOptions& options, const BackwardArgs& args,
                        const GradientOutputs& grads_in) {
  Busy busy(busy_);
  check_call(scene_in, options);
  PULSAR_REQUIRE(args.grad_image && args.image && args.blend_state && args.traversal_end,
                 "backward inputs: grad_image, image, blend_state and traversal_end are required");
  PULSAR_REQUIRE((args.depth_moments == nullptr) == (args.grad_depth_moments == nullptr),
                 "backward inputs: depth_moments and grad_depth_moments go together");
  // The binning of the forward is reused when that forward was the last one; otherwise
  // it is rebuilt from the same inputs (deterministic, so identical). A reused binning
  // comes with the cameras that forward packed (still in the first half of the camera
  // scratch: every call that packs others bins after), so they are not converted again.
  const bool reuse = binned_for_ != nullptr && binned_for_ == args.traversal_end;
  if (!reuse) binned_for_ = nullptr;  // as in forward: the conversion overwrites the kept cameras
  const SceneArgs scene = with_packed_cameras(scene_in, options, !reuse);
  // Camera vectors: the stages write dL/d(packed cameras) into the second half of the
  // camera scratch, and the conversion's derivative takes it to dL/d(vectors).
  GradientOutputs grads = grads_in;
  void* packed_grads = nullptr;
  if (scene_in.camera_vectors.length != 0 && grads_in.cameras != nullptr) {
    const std::size_t bytes = std::size_t(scene.batch_size) * CAMERA_PARAMS * element_size(scene.dtype);
    packed_grads = static_cast<unsigned char*>(const_cast<void*>(scene.cameras)) + bytes;
    grads.cameras = packed_grads;
  }
  if (!reuse) {
    bin(scene, options);
    binned_for_ = args.traversal_end;
  }
  backend_->render_backward(scene, options, args, grads);
  backend_->reduce_gradients(scene, options, grads);
  if (packed_grads != nullptr)
    camera_params_backward(conversion_of(scene_in, config_, options), packed_grads, grads_in.cameras);
}

}  // namespace pulsar
