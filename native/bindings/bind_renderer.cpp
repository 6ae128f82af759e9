#include <functional>

#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

void bind_renderer(py::module_& m) {
  // The GIL is released while native work runs, so renderers on other threads proceed.
  py::class_<Renderer>(m, "Renderer")
      .def(py::init<const RendererConfig&>(), py::arg("config"))
      // make_outputs: a Python callable returning ForwardOutputs, called once the binning's
      // device work is enqueued (the caller allocates its outputs while the device bins).
      .def(
          "forward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, py::function make_outputs) {
            const std::function<ForwardOutputs()> make = [&make_outputs] {
              py::gil_scoped_acquire acquire;
              return make_outputs().cast<ForwardOutputs>();
            };
            py::gil_scoped_release release;
            r.forward(scene, options, make);
          },
          py::arg("scene"), py::arg("options"), py::arg("make_outputs"))
      .def(
          "forward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) {
            py::gil_scoped_release release;
            r.forward(scene, options, outputs);
          },
          py::arg("scene"), py::arg("options"), py::arg("outputs"))
      .def("backward", &Renderer::backward, py::arg("scene"), py::arg("options"), py::arg("args"),
           py::arg("grads"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("config", &Renderer::config)
      .def_property_readonly("scratch_bytes", &Renderer::scratch_bytes)
      .def_property_readonly("binned_instances", &Renderer::binned_instances);
}

}  // namespace pulsar::bindings
