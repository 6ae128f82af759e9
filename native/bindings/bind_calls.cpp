// Call structs, and the camera conversion calls. Pointer fields are exchanged with Python
// as integers (data_ptr()); the Python layer (pulsar_py/_checks.py, pulsar_py/ops.py) has
// validated every tensor behind them.
#include <cstdint>

#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

namespace {

template <typename S, typename P>
void pointer_field(py::class_<S>& cls, const char* name, P* S::* field) {
  cls.def_property(
      name, [field](const S& s) { return reinterpret_cast<std::uintptr_t>(s.*field); },
      [field](S& s, std::uintptr_t v) { s.*field = reinterpret_cast<P*>(v); });
}

}  // namespace

void bind_calls(py::module_& m) {
  py::class_<SceneArgs> scene(m, "SceneArgs");
  // Every field in one call: one is made per render and backward call.
  scene.def(py::init<>())
      .def(py::init([](DType dtype, int batch_size, std::int64_t n_spheres, bool shared_spheres,
                       std::uintptr_t positions, std::uintptr_t features, std::uintptr_t radii,
                       std::uintptr_t opacities, std::uintptr_t background, std::uintptr_t cameras, bool right_handed,
                       int camera_length, bool first_R_then_T, double min_depth, double max_depth) {
             SceneArgs s;
             s.dtype = dtype;
             s.batch_size = batch_size;
             s.n_spheres = n_spheres;
             s.shared_spheres = shared_spheres;
             s.positions = reinterpret_cast<const void*>(positions);
             s.features = reinterpret_cast<const void*>(features);
             s.radii = reinterpret_cast<const void*>(radii);
             s.opacities = reinterpret_cast<const void*>(opacities);
             s.background = reinterpret_cast<const void*>(background);
             s.cameras = reinterpret_cast<const void*>(cameras);
             s.right_handed = right_handed;
             s.camera_vectors.length = camera_length;
             s.camera_vectors.first_R_then_T = first_R_then_T;
             s.camera_vectors.min_depth = min_depth;
             s.camera_vectors.max_depth = max_depth;
             return s;
           }),
           py::arg("dtype"), py::arg("batch_size"), py::arg("n_spheres"), py::arg("shared_spheres"),
           py::arg("positions"), py::arg("features"), py::arg("radii"), py::arg("opacities"), py::arg("background"),
           py::arg("cameras"), py::arg("right_handed"), py::arg("camera_length"), py::arg("first_R_then_T"),
           py::arg("min_depth"), py::arg("max_depth"))
      .def_readwrite("dtype", &SceneArgs::dtype)
      .def_readwrite("batch_size", &SceneArgs::batch_size)
      .def_readwrite("n_spheres", &SceneArgs::n_spheres)
      .def_readwrite("shared_spheres", &SceneArgs::shared_spheres)
      .def_readwrite("right_handed", &SceneArgs::right_handed);
  pointer_field(scene, "positions", &SceneArgs::positions);
  pointer_field(scene, "features", &SceneArgs::features);
  pointer_field(scene, "radii", &SceneArgs::radii);
  pointer_field(scene, "opacities", &SceneArgs::opacities);
  pointer_field(scene, "background", &SceneArgs::background);
  pointer_field(scene, "cameras", &SceneArgs::cameras);

  py::class_<RenderOptions> options(m, "RenderOptions");
  options.def(py::init<>())
      .def(
          py::init([](double gamma, double percent_allowed_difference, std::int64_t max_n_hits, std::uintptr_t stream) {
            RenderOptions o;
            o.gamma = gamma;
            o.percent_allowed_difference = percent_allowed_difference;
            o.max_n_hits = max_n_hits;
            o.stream = reinterpret_cast<void*>(stream);
            return o;
          }),
          py::arg("gamma"), py::arg("percent_allowed_difference"), py::arg("max_n_hits"), py::arg("stream"))
      .def_readwrite("gamma", &RenderOptions::gamma)
      .def_readwrite("percent_allowed_difference", &RenderOptions::percent_allowed_difference)
      .def_readwrite("max_n_hits", &RenderOptions::max_n_hits)
      .def_readwrite("partial", &RenderOptions::partial);
  pointer_field(options, "stream", &RenderOptions::stream);
  pointer_field(options, "values", &RenderOptions::values);

  py::class_<ForwardOutputs> fwd(m, "ForwardOutputs");
  fwd.def(py::init<>())
      .def(py::init([](std::uintptr_t image, std::uintptr_t blend_state, std::uintptr_t hit_count,
                       std::uintptr_t traversal_end, std::uintptr_t forward_info, std::uintptr_t depth_moments) {
             ForwardOutputs o;
             o.image = reinterpret_cast<void*>(image);
             o.blend_state = reinterpret_cast<void*>(blend_state);
             o.hit_count = reinterpret_cast<std::int32_t*>(hit_count);
             o.traversal_end = reinterpret_cast<std::int32_t*>(traversal_end);
             o.forward_info = reinterpret_cast<void*>(forward_info);
             o.depth_moments = reinterpret_cast<void*>(depth_moments);
             return o;
           }),
           py::arg("image"), py::arg("blend_state"), py::arg("hit_count"), py::arg("traversal_end"),
           py::arg("forward_info"), py::arg("depth_moments"));
  pointer_field(fwd, "image", &ForwardOutputs::image);
  pointer_field(fwd, "blend_state", &ForwardOutputs::blend_state);
  pointer_field(fwd, "hit_count", &ForwardOutputs::hit_count);
  pointer_field(fwd, "traversal_end", &ForwardOutputs::traversal_end);
  pointer_field(fwd, "forward_info", &ForwardOutputs::forward_info);
  pointer_field(fwd, "depth_moments", &ForwardOutputs::depth_moments);

  py::class_<BackwardArgs> bwd(m, "BackwardArgs");
  bwd.def(py::init<>())
      .def(py::init([](std::uintptr_t grad_image, std::uintptr_t image, std::uintptr_t blend_state,
                       std::uintptr_t traversal_end, std::uintptr_t depth_moments, std::uintptr_t grad_depth_moments) {
             BackwardArgs a;
             a.grad_image = reinterpret_cast<const void*>(grad_image);
             a.image = reinterpret_cast<const void*>(image);
             a.blend_state = reinterpret_cast<const void*>(blend_state);
             a.traversal_end = reinterpret_cast<const std::int32_t*>(traversal_end);
             a.depth_moments = reinterpret_cast<const void*>(depth_moments);
             a.grad_depth_moments = reinterpret_cast<const void*>(grad_depth_moments);
             return a;
           }),
           py::arg("grad_image"), py::arg("image"), py::arg("blend_state"), py::arg("traversal_end"),
           py::arg("depth_moments"), py::arg("grad_depth_moments"));
  pointer_field(bwd, "grad_image", &BackwardArgs::grad_image);
  pointer_field(bwd, "image", &BackwardArgs::image);
  pointer_field(bwd, "blend_state", &BackwardArgs::blend_state);
  pointer_field(bwd, "traversal_end", &BackwardArgs::traversal_end);
  pointer_field(bwd, "depth_moments", &BackwardArgs::depth_moments);
  pointer_field(bwd, "grad_depth_moments", &BackwardArgs::grad_depth_moments);

  py::class_<GradientOutputs> grads(m, "GradientOutputs");
  grads.def(py::init<>())
      .def(py::init([](std::uintptr_t positions, std::uintptr_t features, std::uintptr_t radii,
                       std::uintptr_t opacities, std::uintptr_t background, std::uintptr_t cameras) {
             GradientOutputs g;
             g.positions = reinterpret_cast<void*>(positions);
             g.features = reinterpret_cast<void*>(features);
             g.radii = reinterpret_cast<void*>(radii);
             g.opacities = reinterpret_cast<void*>(opacities);
             g.background = reinterpret_cast<void*>(background);
             g.cameras = reinterpret_cast<void*>(cameras);
             return g;
           }),
           py::arg("positions"), py::arg("features"), py::arg("radii"), py::arg("opacities"), py::arg("background"),
           py::arg("cameras"));
  pointer_field(grads, "positions", &GradientOutputs::positions);
  pointer_field(grads, "features", &GradientOutputs::features);
  pointer_field(grads, "radii", &GradientOutputs::radii);
  pointer_field(grads, "opacities", &GradientOutputs::opacities);
  pointer_field(grads, "background", &GradientOutputs::background);
  pointer_field(grads, "cameras", &GradientOutputs::cameras);

  py::class_<CameraParamsArgs> cam(m, "CameraParamsArgs");
  cam.def(py::init<>())
      .def_readwrite("dtype", &CameraParamsArgs::dtype)
      .def_readwrite("device", &CameraParamsArgs::device)
      .def_readwrite("device_index", &CameraParamsArgs::device_index)
      .def_readwrite("batch_size", &CameraParamsArgs::batch_size)
      .def_readwrite("length", &CameraParamsArgs::length)
      .def_readwrite("width", &CameraParamsArgs::width)
      .def_readwrite("height", &CameraParamsArgs::height)
      .def_readwrite("orthographic", &CameraParamsArgs::orthographic)
      .def_readwrite("right_handed", &CameraParamsArgs::right_handed)
      .def_readwrite("first_R_then_T", &CameraParamsArgs::first_R_then_T)
      .def_readwrite("min_depth", &CameraParamsArgs::min_depth)
      .def_readwrite("max_depth", &CameraParamsArgs::max_depth);
  pointer_field(cam, "stream", &CameraParamsArgs::stream);
  pointer_field(cam, "params", &CameraParamsArgs::params);
  pointer_field(cam, "values", &CameraParamsArgs::values);

  // One native op each way for the camera conversion (the GIL is kept: both are a few
  // hundred flops per camera on the CPU and a kernel launch on CUDA).
  m.def(
      "camera_params_to_packed",
      [](const CameraParamsArgs& args, std::uintptr_t packed) {
        camera_params_to_packed(args, reinterpret_cast<void*>(packed));
      },
      py::arg("args"), py::arg("packed"));
  m.def(
      "camera_params_backward",
      [](const CameraParamsArgs& args, std::uintptr_t grad_packed, std::uintptr_t grad_params) {
        camera_params_backward(args, reinterpret_cast<const void*>(grad_packed), reinterpret_cast<void*>(grad_params));
      },
      py::arg("args"), py::arg("grad_packed"), py::arg("grad_params"));
}

}  // namespace pulsar::bindings
