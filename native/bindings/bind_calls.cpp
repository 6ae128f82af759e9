// Call structs. Pointer fields are exchanged with Python as integers (data_ptr()); the
// Python layer (pulsar_py/_checks.py) has validated every tensor behind them.
#include <cstdint>

#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

namespace {

template <typename S, typename P>
void pointer_field(py::class_<S>& cls, const char* name, P* S::*field) {
  cls.def_property(
      name, [field](const S& s) { return reinterpret_cast<std::uintptr_t>(s.*field); },
      [field](S& s, std::uintptr_t v) { s.*field = reinterpret_cast<P*>(v); });
}

}  // namespace

void bind_calls(py::module_& m) {
  py::class_<SceneArgs> scene(m, "SceneArgs");
  scene.def(py::init<>())
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

  py::class_<ForwardOutputs> fwd(m, "ForwardOutputs");
  fwd.def(py::init<>());
  pointer_field(fwd, "image", &ForwardOutputs::image);
  pointer_field(fwd, "blend_state", &ForwardOutputs::blend_state);
  pointer_field(fwd, "hit_count", &ForwardOutputs::hit_count);
  pointer_field(fwd, "traversal_end", &ForwardOutputs::traversal_end);
  pointer_field(fwd, "forward_info", &ForwardOutputs::forward_info);
  pointer_field(fwd, "depth_moments", &ForwardOutputs::depth_moments);

  py::class_<BackwardArgs> bwd(m, "BackwardArgs");
  bwd.def(py::init<>());
  pointer_field(bwd, "grad_image", &BackwardArgs::grad_image);
  pointer_field(bwd, "image", &BackwardArgs::image);
  pointer_field(bwd, "blend_state", &BackwardArgs::blend_state);
  pointer_field(bwd, "traversal_end", &BackwardArgs::traversal_end);
  pointer_field(bwd, "depth_moments", &BackwardArgs::depth_moments);
  pointer_field(bwd, "grad_depth_moments", &BackwardArgs::grad_depth_moments);

  py::class_<GradientOutputs> grads(m, "GradientOutputs");
  grads.def(py::init<>());
  pointer_field(grads, "positions", &GradientOutputs::positions);
  pointer_field(grads, "features", &GradientOutputs::features);
  pointer_field(grads, "radii", &GradientOutputs::radii);
  pointer_field(grads, "opacities", &GradientOutputs::opacities);
  pointer_field(grads, "background", &GradientOutputs::background);
  pointer_field(grads, "cameras", &GradientOutputs::cameras);
}

}  // namespace pulsar::bindings
