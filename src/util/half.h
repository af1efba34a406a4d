/* IEEE half (float16) and bfloat16 to and from float, the one copy of these
 * conversions: the host backend's kernels and the collectives' host
 * reductions (src/util/elementwise.c), the built-in kernels' fill value
 * (src/core/kernels.c) and the MPI module's reduction operators
 * (src/mpi/init.c) all use them. Header-only (static inline), so the MPI
 * module, a library of its own that sees none of libmgpu's hidden symbols,
 * compiles the same code.
 *
 * To 16 bits rounds to nearest, ties to even; a value too large for half
 * becomes infinity, one too small a signed zero or a subnormal; NaN stays
 * NaN (quiet). From 16 bits is exact. */
#ifndef MGPU_UTIL_HALF_H
#define MGPU_UTIL_HALF_H

#include <stdint.h>
#include <string.h>

static inline float mgpu__half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
           man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ffu;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t mgpu__float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000u, man = x & 0x7fffffu;
  int exp = (int)((x >> 23) & 0xffu);
  if (exp == 255) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  exp = exp - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    int shift = 14 - exp;
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1),
             mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  /* A carry out of the mantissa moves into the exponent: the right
   * result, up to infinity. */
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
  return (uint16_t)half;
}

static inline float mgpu__bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint16_t mgpu__float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#endif /* MGPU_UTIL_HALF_H */
