// The stage sequence, written once for every backend (see backend.h).
#include "pulsar/renderer.h"

#include "backend.h"
#include "camera_convert.h"
#include "errors.h"
#include "tiling.h"

namespace pulsar {

Renderer::Renderer(const RendererConfig& config) : config_(config) {
  PULSAR_REQUIRE(config.width >= 1 && config.width <= kMaxImageSide, "width: expected 1..",
                 kMaxImageSide, " pixels, got ", config.width);
  PULSAR_REQUIRE(config.height >= 1 && config.height <= kMaxImageSide, "height: expected 1..",
                 kMaxImageSide, " pixels, got ", config.height);
  PULSAR_REQUIRE(config.n_channels >= 1, "n_channels: expected >= 1, got ", config.n_channels);
  PULSAR_REQUIRE(config.n_track >= 1 && config.n_track <= kMaxTrack, "n_track: expected 1..",
                 kMaxTrack, ", got ", config.n_track);
  PULSAR_REQUIRE(config.background_normalized_depth > 0 && config.background_normalized_depth < 1,
                 "background_normalized_depth: expected a value in (0, 1), got ",
                 config.background_normalized_depth);
  PULSAR_REQUIRE(config.num_threads >= 0, "num_threads: expected >= 0 (0: every core), got ",
                 config.num_threads);
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
  PULSAR_REQUIRE(tiles < (std::int64_t(1) << 31), "batch_size: ", scene.batch_size,
                 " cameras of ", config_.width, "x", config_.height, " pixels exceed 2^31 tiles");
  PULSAR_REQUIRE(scene.n_spheres >= 0 && scene.n_spheres <= (std::int64_t(1) << 31) - 1,
                 "n_spheres: expected 0..2^31-1, got ", scene.n_spheres);
  PULSAR_REQUIRE(scene.n_spheres == 0 || (scene.positions && scene.features && scene.radii),
                 "positions, features, radii: null pointer");
  PULSAR_REQUIRE(scene.background && scene.cameras, "background, cameras: null pointer");
  PULSAR_REQUIRE(options.gamma >= 1e-5 && options.gamma <= 1.0,
                 "gamma: expected a value in [1e-5, 1], got ", options.gamma);
  PULSAR_REQUIRE(options.percent_allowed_difference >= 0 && options.percent_allowed_difference < 1,
                 "percent_allowed_difference: expected a value in [0, 1), got ",
                 options.percent_allowed_difference);
  PULSAR_REQUIRE(options.max_n_hits != 0, "max_n_hits: expected >= 1 (or negative: unlimited), got 0");
}

void Renderer::start_binning(const SceneArgs& scene, const RenderOptions& options) {
  binned_token_ = 0;  // a failure part-way leaves no binning to reuse
  forward_begun_ = false;
  backend_->begin_binning(scene, options);
}

void Renderer::complete_binning(const SceneArgs& scene, const RenderOptions& options) {
  backend_->finish_binning(scene, options);
  binned_token_ = next_token_++;
}

void Renderer::prepare(const SceneArgs& scene, const RenderOptions& options) {
  start_binning(scene, options);
  complete_binning(scene, options);
}

namespace {
void check_forward_outputs(const ForwardOutputs& outputs) {
  PULSAR_REQUIRE(outputs.image && outputs.blend_state && outputs.hit_count && outputs.traversal_end,
                 "forward outputs: image, blend_state, hit_count and traversal_end are required");
}
}  // namespace

std::uint64_t Renderer::forward(const SceneArgs& scene, const RenderOptions& options,
                                const ForwardOutputs& outputs) {
  check_forward_outputs(outputs);
  begin_forward(scene, options);
  return finish_forward(scene, options, outputs);
}

void Renderer::begin_forward(const SceneArgs& scene, const RenderOptions& options) {
  check_call(scene, options);
  start_binning(scene, options);
  forward_begun_ = true;
}

void Renderer::begin_forward_from_vectors(SceneArgs& scene, const RenderOptions& options,
                                          const CameraParamsArgs& camera_vectors) {
  use_camera_vectors(scene, options, camera_vectors);
  begin_forward(scene, options);
}

void Renderer::use_camera_vectors(SceneArgs& scene, const RenderOptions& options,
                                  const CameraParamsArgs& camera_vectors) {
  const bool same_device = camera_vectors.device == config_.device &&
                           (config_.device == DeviceKind::CPU || camera_vectors.device_index == config_.device_index);
  PULSAR_REQUIRE(same_device, "camera_vectors: expected camera vectors on the renderer's device (kind ",
                 static_cast<int>(config_.device), ", index ", config_.device_index, "), got kind ",
                 static_cast<int>(camera_vectors.device), ", index ", camera_vectors.device_index);
  PULSAR_REQUIRE(camera_vectors.dtype == scene.dtype, "camera_vectors: expected the scene's dtype (",
                 static_cast<int>(scene.dtype), "), got ", static_cast<int>(camera_vectors.dtype));
  PULSAR_REQUIRE(camera_vectors.batch_size == scene.batch_size, "camera_vectors: expected the scene's ",
                 scene.batch_size, " cameras, got ", camera_vectors.batch_size);
  PULSAR_REQUIRE(camera_vectors.width == config_.width && camera_vectors.height == config_.height,
                 "camera_vectors: expected the renderer's image size ", config_.width, "x", config_.height,
                 ", got ", camera_vectors.width, "x", camera_vectors.height);
  PULSAR_REQUIRE(camera_vectors.orthographic == config_.orthographic && camera_vectors.right_handed == scene.right_handed,
                 "camera_vectors: expected the renderer's projection (orthographic ", config_.orthographic,
                 ") and the scene's handedness (right_handed ", scene.right_handed, "), got ",
                 camera_vectors.orthographic, " and ", camera_vectors.right_handed);
  const std::size_t element = scene.dtype == DType::Float64 ? sizeof(double) : sizeof(float);
  void* packed = backend_->packed_cameras(std::size_t(scene.batch_size) * CAMERA_PARAMS * element);
  CameraParamsArgs on_stream = camera_vectors;
  on_stream.stream = options.stream;
  camera_params_to_packed(on_stream, packed);
  scene.cameras = packed;
}

std::uint64_t Renderer::finish_forward(const SceneArgs& scene, const RenderOptions& options,
                                       const ForwardOutputs& outputs) {
  PULSAR_REQUIRE(forward_begun_, "finish_forward: expected a begin_forward of the same scene just before, "
                 "with no other call of this renderer in between");
  forward_begun_ = false;
  check_forward_outputs(outputs);
  complete_binning(scene, options);
  backend_->render_forward(scene, options, outputs);
  return binned_token_;
}

void Renderer::backward(const SceneArgs& scene, const RenderOptions& options,
                        const BackwardArgs& args, const GradientOutputs& grads,
                        std::uint64_t forward_token) {
  check_call(scene, options);
  PULSAR_REQUIRE(args.grad_image && args.image && args.blend_state && args.traversal_end,
                 "backward inputs: grad_image, image, blend_state and traversal_end are required");
  PULSAR_REQUIRE((args.depth_moments == nullptr) == (args.grad_depth_moments == nullptr),
                 "backward inputs: depth_moments and grad_depth_moments go together");
  // The binning of the forward is reused when nothing was rendered in between;
  // otherwise it is rebuilt from the same inputs (deterministic, so identical).
  if (forward_token == 0 || forward_token != binned_token_) prepare(scene, options);
  backend_->render_backward(scene, options, args, grads);
  backend_->reduce_gradients(scene, options, grads);
}

}  // namespace pulsar
