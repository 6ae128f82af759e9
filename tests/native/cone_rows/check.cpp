// Checks ConeRows (include/pulsar/cone_rows.h) against the pair test it stands in front
// of: for random perspective cameras and spheres, every pixel of the sphere's box that
// evaluate_pair hits must lie in its row's columns and in the rectangle bounds_within
// gives for its 16x16 tile's part of the box, in float and in double.
// tests/native/test_cone_rows.py builds and runs it.
//
//   check [--seed N] [--spheres N] [--shrink PX]
//
// --shrink narrows every row's interval and every rectangle by PX pixels on each side, so
// that a test can show the check catches intervals that are too narrow. Output, one line
// per dtype:
//   dtype spheres active box_pixels kept_pixels hits misses_outside rect_pixels misses_outside_rect
// (active: spheres whose cone was used; kept_pixels: box pixels within the rows'
// columns, over the active spheres; misses_outside: hits outside them, which must be 0;
// rect_pixels and misses_outside_rect: the same for the tiles' rectangles.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "pulsar/camera.h"
#include "pulsar/cone_rows.h"
#include "pulsar/pixel_ray.h"
#include "pulsar/sphere_setup.h"

namespace {

using namespace pulsar;

struct Counts {
  long spheres = 0, active = 0, box_pixels = 0, kept_pixels = 0, hits = 0, misses_outside = 0;
  long rect_pixels = 0, misses_outside_rect = 0;  // the same for bounds_within's rectangles
};

// A random perspective camera: a random orientation, a focal length of 0.5 to 4 sensor
// widths, the principal point up to a fifth of the image off centre.
template <typename T>
CameraFrame<T> random_camera(std::mt19937_64& rng, int width, int height) {
  std::uniform_real_distribution<double> u(-1.0, 1.0), unit(0.0, 1.0);
  std::normal_distribution<double> n(0.0, 1.0);
  // Orthonormal x, y, z from a random rotation (Gram-Schmidt of two normal vectors).
  double z[3] = {n(rng), n(rng), n(rng)}, x[3] = {n(rng), n(rng), n(rng)};
  const double zn = std::sqrt(z[0] * z[0] + z[1] * z[1] + z[2] * z[2]);
  for (double& v : z) v /= zn;
  const double xz = x[0] * z[0] + x[1] * z[1] + x[2] * z[2];
  for (int k = 0; k < 3; ++k) x[k] -= xz * z[k];
  const double xn = std::sqrt(x[0] * x[0] + x[1] * x[1] + x[2] * x[2]);
  for (double& v : x) v /= xn;
  const double y[3] = {z[1] * x[2] - z[2] * x[1], z[2] * x[0] - z[0] * x[2], z[0] * x[1] - z[1] * x[0]};
  const double pixel = 1e-3 * std::exp(3.0 * u(rng));  // world units per pixel
  const double focal = pixel * width * (0.5 + 3.5 * unit(rng));
  const double cx = width * (0.5 + 0.2 * u(rng)), cy = height * (0.5 + 0.2 * u(rng));
  T packed[CAMERA_PARAMS];
  const double eye[3] = {5 * u(rng), 5 * u(rng), 5 * u(rng)};
  for (int k = 0; k < 3; ++k) {
    packed[kEye + k] = T(eye[k]);
    packed[kPdx + k] = T(pixel * x[k]);
    packed[kPdy + k] = T(pixel * y[k]);
    packed[kP00 + k] = T(focal * z[k] - (cx - 0.5) * pixel * x[k] - (cy - 0.5) * pixel * y[k]);
  }
  packed[kFocal] = T(focal);
  packed[kMinDepth] = T(focal * 0.1);
  packed[kMaxDepth] = T(1e6);
  // z_axis = -+normalize(pdy x pdx); y x x = -z, so right-handed makes it +z.
  return load_camera(packed, false, true);
}

template <typename T>
void check(std::uint64_t seed, long n_spheres, double shrink, Counts& out) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (long i = 0; i < n_spheres; ++i) {
    const int width = 64 + int(u(rng) * 1024), height = 64 + int(u(rng) * 1024);
    const CameraFrame<T> cam = random_camera<T>(rng, width, height);
    // The centre on the ray of a film point up to a fifth of the image outside it, its
    // projected radius log-uniform in [0.2, 200] pixels.
    const double fx = -0.2 * width + 1.4 * width * u(rng), fy = -0.2 * height + 1.4 * height * u(rng);
    const Vec3<T> ray = normalize(cam.sensor_offset(T(fx), T(fy)));
    const double depth = double(cam.focal) * (0.5 + 50.0 * u(rng));
    const double radius_px = 0.2 * std::exp(std::log(1000.0) * u(rng));
    const double radius = radius_px * depth * double(cam.pixel_size) / double(cam.focal);
    const Vec3<T> centre = cam.eye + T(depth) * ray;
    const SphereSetup<T> s = setup_sphere(cam, centre, T(radius), width, height);
    if (!s.visible) continue;
    ++out.spheres;
    const Vec3<T> c = centre - cam.eye;
    const T t = norm(c);
    const PairTerms<T> k = pair_terms(cam, t, T(radius), s.is_tiny);
    const ConeRows<T> cone = ConeRows<T>::of(cam.p00_rel, cam.pdx, cam.pdy, c, t, k.hit_chord(T(radius)), s.bounds);
    if (!cone.active) continue;
    ++out.active;
    // Tile by tile (16x16, as the CUDA kernels take them), each pixel of the box tested
    // once against its row's columns and against the rectangle of its tile's part of the
    // box (bounds_within).
    const int sh = int(std::ceil(shrink));
    for (int ty = s.bounds.y0 / 16; ty <= s.bounds.y1 / 16; ++ty) {
      for (int tx = s.bounds.x0 / 16; tx <= s.bounds.x1 / 16; ++tx) {
        const PixelBounds part{std::max(s.bounds.x0, 16 * tx), std::max(s.bounds.y0, 16 * ty),
                               std::min(s.bounds.x1, 16 * tx + 15), std::min(s.bounds.y1, 16 * ty + 15)};
        PixelBounds rect = cone.bounds_within(part);
        rect = PixelBounds{rect.x0 + sh, rect.y0 + sh, rect.x1 - sh, rect.y1 - sh};
        for (int y = part.y0; y <= part.y1; ++y) {
          int lo, hi;
          cone.columns(y, lo, hi);
          lo += sh;
          hi -= sh;
          for (int x = part.x0; x <= part.x1; ++x) {
            const bool kept = x >= lo && x <= hi, in_rect = rect.contains(x, y);
            ++out.box_pixels;
            out.kept_pixels += kept;
            out.rect_pixels += in_rect;
            const PairHit<T> h = evaluate_pair(cam, c, t, T(radius), k, pixel_ray(cam, x, y));
            if (!h.hit) continue;
            ++out.hits;
            if (!kept) {
              if (out.misses_outside < 5)
                std::fprintf(stderr, "sphere %ld: hit (%d, %d) outside row %d's columns [%d, %d]\n", i, x, y, y, lo,
                             hi);
              ++out.misses_outside;
            }
            if (!in_rect) {
              if (out.misses_outside_rect < 5)
                std::fprintf(stderr, "sphere %ld: hit (%d, %d) outside its tile's rectangle [%d, %d] x [%d, %d]\n", i,
                             x, y, rect.x0, rect.x1, rect.y0, rect.y1);
              ++out.misses_outside_rect;
            }
          }
        }
      }
    }
  }
}

void print(const char* dtype, const Counts& c) {
  std::printf("%s %ld %ld %ld %ld %ld %ld %ld %ld\n", dtype, c.spheres, c.active, c.box_pixels, c.kept_pixels, c.hits,
              c.misses_outside, c.rect_pixels, c.misses_outside_rect);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seed = 1;
  long spheres = 400;
  double shrink = 0.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seed")) {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--spheres")) {
      spheres = std::strtol(argv[i + 1], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--shrink")) {
      shrink = std::strtod(argv[i + 1], nullptr);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  Counts f, d;
  check<float>(seed, spheres, shrink, f);
  check<double>(seed, spheres, shrink, d);
  print("float32", f);
  print("float64", d);
  return 0;
}
