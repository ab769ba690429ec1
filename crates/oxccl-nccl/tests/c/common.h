/* Shared by oxccl's C ABI tests: element encoding of small non-negative
 * integers (exact in every type, fp8 included), checks, and helpers. */
#ifndef OXCCL_TEST_COMMON_H
#define OXCCL_TEST_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

#define CHECK(cmd)                                                                      \
  do {                                                                                  \
    ncclResult_t r_ = (cmd);                                                            \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "%s:%d: %s -> %d (%s): %s\n", __FILE__, __LINE__, #cmd, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                          \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)

#define EXPECT(cond, ...)                                           \
  do {                                                              \
    if (!(cond)) {                                                  \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                 \
      fprintf(stderr, "\n");                                        \
      exit(3);                                                      \
    }                                                               \
  } while (0)

__attribute__((unused)) static const size_t type_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
__attribute__((unused)) static const char* type_name[ncclNumTypes] = {"int8",  "uint8", "int32",    "uint32", "int64",  "uint64",
                                              "half",  "float", "double",   "bfloat16", "f8e4m3", "f8e5m2"};

/* Encodes small float-format integers: exponent bias and mantissa bits. */
__attribute__((unused)) static uint32_t enc_float(unsigned k, int bias, int mbits) {
  if (k == 0) return 0;
  int e = 0;
  while ((1u << (e + 1)) <= k) e++;
  uint32_t m = (uint32_t)(((double)k / (double)(1u << e) - 1.0) * (double)(1u << mbits));
  return ((uint32_t)(e + bias) << mbits) | m;
}

__attribute__((unused)) static double dec_float(uint32_t bits, int bias, int mbits, int ebits) {
  uint32_t m = bits & ((1u << mbits) - 1), e = (bits >> mbits) & ((1u << ebits) - 1);
  double sign = (bits >> (mbits + ebits)) & 1 ? -1.0 : 1.0;
  if (e == 0) return sign * ldexp((double)m, 1 - bias - mbits);
  return sign * ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias);
}

/* Stores the non-negative integer k as element i of type t. */
__attribute__((unused)) static void put(void* buf, ncclDataType_t t, size_t i, unsigned k) {
  char* p = (char*)buf + i * type_size[t];
  switch (t) {
    case ncclInt8: *(int8_t*)p = (int8_t)k; break;
    case ncclUint8: *(uint8_t*)p = (uint8_t)k; break;
    case ncclInt32: *(int32_t*)p = (int32_t)k; break;
    case ncclUint32: *(uint32_t*)p = k; break;
    case ncclInt64: *(int64_t*)p = k; break;
    case ncclUint64: *(uint64_t*)p = k; break;
    case ncclFloat16: *(uint16_t*)p = (uint16_t)enc_float(k, 15, 10); break;
    case ncclFloat32: *(float*)p = (float)k; break;
    case ncclFloat64: *(double*)p = k; break;
    case ncclBfloat16: *(uint16_t*)p = (uint16_t)enc_float(k, 127, 7); break;
    case ncclFloat8e4m3: *(uint8_t*)p = (uint8_t)enc_float(k, 7, 3); break;
    case ncclFloat8e5m2: *(uint8_t*)p = (uint8_t)enc_float(k, 15, 2); break;
    default: abort();
  }
}

/* Element i of type t as a double. */
__attribute__((unused)) static double get(const void* buf, ncclDataType_t t, size_t i) {
  const char* p = (const char*)buf + i * type_size[t];
  switch (t) {
    case ncclInt8: return *(const int8_t*)p;
    case ncclUint8: return *(const uint8_t*)p;
    case ncclInt32: return *(const int32_t*)p;
    case ncclUint32: return *(const uint32_t*)p;
    case ncclInt64: return (double)*(const int64_t*)p;
    case ncclUint64: return (double)*(const uint64_t*)p;
    case ncclFloat16: return dec_float(*(const uint16_t*)p, 15, 10, 5);
    case ncclFloat32: return *(const float*)p;
    case ncclFloat64: return *(const double*)p;
    case ncclBfloat16: return dec_float(*(const uint16_t*)p, 127, 7, 8);
    case ncclFloat8e4m3: return dec_float(*(const uint8_t*)p, 7, 3, 4);
    case ncclFloat8e5m2: return dec_float(*(const uint8_t*)p, 15, 2, 5);
    default: abort();
  }
}
#endif
