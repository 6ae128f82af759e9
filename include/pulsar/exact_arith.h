// Arithmetic that every backend rounds the same way: each operation rounded once as
// written (a product and a sum apart, or one fused multiply-add where it says so), never
// contracted otherwise and never approximated, on the GPU too. The CPU build has no
// contraction, so these give the CPU's bits wherever they are used.
//
// Why: the CUDA forward may contract and use the fast division and square root, but the
// chord |c - t d| of a pixel and a sphere subtracts two vectors of length t (tens of
// world units in a typical scene) to get a length under r. One rounding step more or
// less in t d, or in the unit ray d itself, moves the chord by ulp(t) and a small
// sphere's closeness by ulp(t) / r: at a silhouette that moves an image by more than the
// 1e-5 that the backends agree to. So the camera frame,
// the pixel rays and the product t d are computed with these; the rest of a pair is
// well conditioned and may round as each backend likes. (The chord itself is fused:
// fused_difference, fused_square and chord_sqrt.)
#pragma once

#include <cmath>
#include <type_traits>

#include "pulsar/hd.h"
#include "pulsar/vec3.h"

namespace pulsar {

// a * b, a + b, a / b, sqrt(a), and a * b + c rounded once, for float and double.
template <typename T>
PULSAR_HD T mul_rn(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
template <typename T>
PULSAR_HD T add_rn(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value)
    return __fadd_rn(a, b);
  else
    return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
// The fused multiply-add: one rounding, so every backend gets the same bits (the GPU's
// instruction; on the CPU the FMA instruction where the build enables it, else libm's
// correctly rounded emulation). Where a pair cancels (the chord) it is also the more
// accurate: t d enters the difference unrounded.
template <typename T>
PULSAR_HD T fma_rn(T a, T b, T c) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value)
    return __fmaf_rn(a, b, c);
  else
    return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
template <typename T>
PULSAR_HD T div_rn(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value)
    return __fdiv_rn(a, b);
  else
    return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
template <typename T>
PULSAR_HD T sqrt_rn(T a) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<T, float>::value)
    return __fsqrt_rn(a);
  else
    return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// The vector functions of vec3.h, in the same order of operations, rounded step by step.
template <typename T>
PULSAR_HD T dot_rn(Vec3<T> a, Vec3<T> b) {
  return add_rn(add_rn(mul_rn(a.x, b.x), mul_rn(a.y, b.y)), mul_rn(a.z, b.z));
}
template <typename T>
PULSAR_HD Vec3<T> scale_rn(T s, Vec3<T> a) {
  return {mul_rn(s, a.x), mul_rn(s, a.y), mul_rn(s, a.z)};
}
template <typename T>
PULSAR_HD Vec3<T> add_rn(Vec3<T> a, Vec3<T> b) {
  return {add_rn(a.x, b.x), add_rn(a.y, b.y), add_rn(a.z, b.z)};
}
template <typename T>
PULSAR_HD Vec3<T> cross_rn(Vec3<T> a, Vec3<T> b) {
  return {add_rn(mul_rn(a.y, b.z), -mul_rn(a.z, b.y)), add_rn(mul_rn(a.z, b.x), -mul_rn(a.x, b.z)),
          add_rn(mul_rn(a.x, b.y), -mul_rn(a.y, b.x))};
}
template <typename T>
PULSAR_HD T norm_rn(Vec3<T> a) {
  return sqrt_rn(dot_rn(a, a));
}

// fmax(a, b) and fmin(a, b) for a b that is not NaN: b when a is NaN, as the C functions
// give. On the device each is one instruction. On the host GCC keeps them calls into the
// C library (the NaN rule is not that of the SSE min and max instructions), a call per
// pair in the CPU's pixel loops; a comparison and a select give the same values.
template <typename T>
PULSAR_HD T max_or(T a, T b) {
#ifdef __CUDA_ARCH__
  return std::fmax(a, b);
#else
  return a > b ? a : b;
#endif
}

template <typename T>
PULSAR_HD T min_or(T a, T b) {
#ifdef __CUDA_ARCH__
  return std::fmin(a, b);
#else
  return a < b ? a : b;
#endif
}

// The square root of a chord's square a >= 0: in float sqrt(max(a, 2^-100)), correctly
// rounded, the same bits on every backend. The floor (a chord of 2^-50, about 9e-16
// world units: under a float ulp of any closeness 1 - chord / r with r above 1e-8, and of
// any depth) keeps the argument where the GPU's correctly rounded root is the reciprocal
// square root and one Newton step, __fsqrt_rn's own path without the range test and call
// around it (5 instructions in every pair of both render kernels). Its correction term
// may flush to zero only when it is under 1/16 ulp of the root, which then stands. A NaN
// argument would give the floor's root on both backends (fmax) and an infinite one
// infinity on the CPU, NaN on the GPU; neither arises: with value checks off, the setup
// culls spheres with NaN or infinite geometry, and a NaN camera leaves no sphere a box
// (docs/reliability.md).
// Double: the plain correctly rounded root.
template <typename T>
PULSAR_HD T chord_sqrt(T a) {
  if constexpr (std::is_same<T, float>::value) {
#ifdef __CUDA_ARCH__
    const float x = fmaxf(a, 0x1p-100f);
    const float y = rsqrtf(x);
    const float root = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-root, root, x), __fmul_rn(y, 0.5f), root);
#else
    return std::sqrt(max_or(a, 0x1p-100f));
#endif
  } else {
    return sqrt_rn(a);
  }
}

// a - s b with fused operations, and its squared length |a - s b|^2 (three more; its
// root by chord_sqrt): the chord of a pixel and a sphere.
template <typename T>
PULSAR_HD Vec3<T> fused_difference(Vec3<T> a, T s, Vec3<T> b) {
  return {fma_rn(-s, b.x, a.x), fma_rn(-s, b.y, a.y), fma_rn(-s, b.z, a.z)};
}
template <typename T>
PULSAR_HD T fused_square(Vec3<T> u) {
  return fma_rn(u.x, u.x, fma_rn(u.y, u.y, mul_rn(u.z, u.z)));
}
template <typename T>
PULSAR_HD Vec3<T> normalize_rn(Vec3<T> v) {
  return scale_rn(div_rn(T(1), norm_rn(v)), v);
}

}  // namespace pulsar
