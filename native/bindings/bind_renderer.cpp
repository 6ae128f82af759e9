#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

namespace {
CameraParamsArgs with_params(const CameraParamsArgs& args, std::uintptr_t params) {
  CameraParamsArgs copy = args;
  copy.params = reinterpret_cast<const void*>(params);
  return copy;
}
}  // namespace

void bind_renderer(py::module_& m) {
  // The GIL is released while native work runs, so renderers on other threads proceed.
  py::class_<Renderer>(m, "Renderer")
      .def(py::init<const RendererConfig&>(), py::arg("config"))
      .def("forward", &Renderer::forward, py::arg("scene"), py::arg("options"), py::arg("outputs"),
           py::call_guard<py::gil_scoped_release>())
      .def("begin_forward", &Renderer::begin_forward, py::arg("scene"), py::arg("options"),
           py::call_guard<py::gil_scoped_release>())
      // The vectors' pointer is an argument: the caller's CameraParamsArgs describes a
      // layout reused across calls and stays as it is.
      .def(
          "begin_forward_from_vectors",
          [](Renderer& r, SceneArgs& scene, const RenderOptions& options, const CameraParamsArgs& camera_vectors,
             std::uintptr_t params) {
            r.begin_forward_from_vectors(scene, options, with_params(camera_vectors, params));
          },
          py::arg("scene"), py::arg("options"), py::arg("camera_vectors"), py::arg("params"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "use_camera_vectors",
          [](Renderer& r, SceneArgs& scene, const RenderOptions& options, const CameraParamsArgs& camera_vectors,
             std::uintptr_t params) { r.use_camera_vectors(scene, options, with_params(camera_vectors, params)); },
          py::arg("scene"), py::arg("options"), py::arg("camera_vectors"), py::arg("params"),
          py::call_guard<py::gil_scoped_release>())
      .def("finish_forward", &Renderer::finish_forward, py::arg("scene"), py::arg("options"), py::arg("outputs"),
           py::call_guard<py::gil_scoped_release>())
      .def("backward", &Renderer::backward, py::arg("scene"), py::arg("options"), py::arg("args"),
           py::arg("grads"), py::arg("forward_token"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("config", &Renderer::config)
      .def_property_readonly("scratch_bytes", &Renderer::scratch_bytes)
      .def_property_readonly("binned_instances", &Renderer::binned_instances);
}

}  // namespace pulsar::bindings
