// Screen tiling shared by the backends: spheres are binned into square tiles of pixels.
#pragma once

#include <cstdint>

#include "pulsar/hd.h"

namespace pulsar {

constexpr int kTileSize = 16;  // pixels per tile side

struct Tiling {
  int width, height, tiles_x, tiles_y;
  PULSAR_HD static Tiling of(int width, int height) {
    return Tiling{width, height, (width + kTileSize - 1) / kTileSize, (height + kTileSize - 1) / kTileSize};
  }
  PULSAR_HD std::int64_t n_tiles() const { return std::int64_t(tiles_x) * tiles_y; }

  // The camera and first pixel of (camera, tile) item `item` = camera * n_tiles + tile,
  // the tiles row-major.
  struct Item {
    int camera, x0, y0;
  };
  PULSAR_HD Item locate(std::int64_t item) const {
    const std::int64_t tile = item % n_tiles();
    return Item{int(item / n_tiles()), int(tile % tiles_x) * kTileSize, int(tile / tiles_x) * kTileSize};
  }
};

}  // namespace pulsar
