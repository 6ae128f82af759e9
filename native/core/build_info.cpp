#include "pulsar/renderer.h"

#ifndef PULSAR_VERSION
#define PULSAR_VERSION "0.0.0"
#endif
#ifndef PULSAR_CXX_COMPILER
#define PULSAR_CXX_COMPILER "unknown"
#endif

namespace pulsar {

BuildInfo build_info() {
  BuildInfo info;
  info.version = PULSAR_VERSION;
  info.compiler = PULSAR_CXX_COMPILER;
#ifdef PULSAR_WITH_CUDA
  info.cuda = true;
  info.cuda_version = PULSAR_CUDA_VERSION;
  info.cuda_architectures = PULSAR_CUDA_ARCHITECTURES;
#endif
  return info;
}

}  // namespace pulsar
