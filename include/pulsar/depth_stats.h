// Slots of a pixel's depth statistics (docs/model.md section 7): the layout of
// ForwardOutputs::depth_moments (renderer.h) and of what blend.h computes and stores.
#pragma once

namespace pulsar {

constexpr int kDepthStats = 4;
enum DepthStatSlot : int { kCoverage = 0, kDepthMean = 1, kDepthVariance = 2, kDepthMeanLow = 3 };

}  // namespace pulsar
