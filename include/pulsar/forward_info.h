// Forward info (docs/model.md section 7, Pulsar's layout), per pixel [3 + 2K]:
//   m, D, the largest zc among the pixel's hits (-1 if none), then K pairs
//   (sphere id, intersection depth z) of the K hits with the smallest z, closest first;
//   an empty slot is (id -1, depth -1). Ids are stored as the bits of an int32 in a
//   float32 slot (Pulsar's layout) and as the exact integer value in a float64 slot.
#pragma once

#include <cstdint>
#include <cstring>

#include "pulsar/hd.h"

namespace pulsar {

// The K processed hits with the smallest depth, closest first (insertion sort).
template <typename T>
struct TrackedHits {
  T* depth;
  std::int32_t* id;
  int k, size;

  PULSAR_HD void insert(T z, std::int32_t sphere) {
    if (size == k && !(z < depth[k - 1])) return;
    int pos = size < k ? size++ : k - 1;
    while (pos > 0 && z < depth[pos - 1]) {
      depth[pos] = depth[pos - 1];
      id[pos] = id[pos - 1];
      --pos;
    }
    depth[pos] = z;
    id[pos] = sphere;
  }
};

template <typename T>
PULSAR_HD T encode_id(std::int32_t id) {
  if constexpr (sizeof(T) == 4) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(id);
#else
    T out;
    std::memcpy(&out, &id, sizeof(out));
    return out;
#endif
  } else {
    return T(id);
  }
}

template <typename T>
PULSAR_HD void write_forward_info(T* fi, T m, T norm_d, T max_closest, const TrackedHits<T>& tracked) {
  fi[0] = m;
  fi[1] = norm_d;
  fi[2] = max_closest;
  for (int k = 0; k < tracked.k; ++k) {
    const bool used = k < tracked.size;
    fi[3 + 2 * k] = encode_id<T>(used ? tracked.id[k] : -1);
    fi[4 + 2 * k] = used ? tracked.depth[k] : T(-1);
  }
}

}  // namespace pulsar
