// The pybind11 module pulsar_py._native, one file per topic.
#pragma once

#include <pybind11/pybind11.h>

namespace pulsar::bindings {

void bind_config(pybind11::module_& m);    // enums, RendererConfig, options
void bind_calls(pybind11::module_& m);     // SceneArgs, the forward/backward structs, camera conversion
void bind_renderer(pybind11::module_& m);  // Renderer
void bind_build_info(pybind11::module_& m);

}  // namespace pulsar::bindings
