/*!
 *  Copyright (c) 2017 - by Contributors
 * \file dlpack.h
 * \brief The common header of DLPack.
 *
 * Licensed under the Apache License, Version 2.0 (the "License"); you may not
 * use this file except in compliance with the License. You may obtain a copy
 * of the License at
 *
 *     http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
 * WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
 * License for the specific language governing permissions and limitations
 * under the License.
 *
 * The data structures of DLPack 1.1 (https://github.com/dmlc/dlpack), the
 * tensor exchange ABI shared by NumPy, CuPy, PyTorch and others, written
 * from its specification. The include guard is upstream's, so a program that
 * also includes the system's dlpack.h gets one set of definitions.
 */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stddef.h>
#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1
#define DLPACK_VERSION 110
#define DLPACK_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the DLPack ABI a managed tensor follows. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

/* Where the memory lives. */
#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,         /* host memory */
  kDLCUDA = 2,        /* CUDA device memory */
  kDLCUDAHost = 3,    /* pinned CUDA host memory */
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13, /* CUDA unified (managed) memory */
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id; /* the device's ordinal (the CUDA ordinal for CUDA) */
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;

/* One element: its kind (DLDataTypeCode), its width in bits and its lanes
 * (1 for scalars). */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/* A strided view of memory. data + byte_offset is the first element; shape
 * and strides (in elements; NULL strides: compact row-major) have ndim
 * entries. */
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;

/* The legacy (unversioned) managed tensor: the consumer calls deleter(self)
 * once when it no longer needs the memory. */
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* The memory may not be written through this tensor. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
/* The producer made a copy: the consumer's writes are not seen by it. */
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
/* Sub-byte elements are padded to a byte each. */
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

/* The versioned managed tensor (DLPack >= 1.0). */
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#ifdef __cplusplus
}
#endif
#endif /* DLPACK_DLPACK_H_ */
