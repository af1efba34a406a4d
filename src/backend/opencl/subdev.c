/* Split OpenCL devices as sub-devices: opencl:N/K.
 *
 * Where device N can be partitioned into K equal parts
 * (CL_DEVICE_PARTITION_EQUALLY, at least K compute units and K
 * sub-devices), each logical device k of the split gets sub-device k of a
 * partition into units of compute_units / K units, and its queues run on
 * that sub-device only. Otherwise the split is the core's: every logical
 * device queues on the whole device with its share of the memory budget.
 *
 * A sub-device belongs to the platform's context through its parent, so its
 * queues use the context's SVM memory and the programs built for the parent
 * (the OpenCL C variant cache of mgpu__ocl_phys), as PoCL and the OpenCL
 * specification allow. Each logical device partitions on its own at open
 * and releases the sub-devices it does not keep.
 */
#include <stdlib.h>

#include "opencl-internal.h"

/* 1 if dev lists CL_DEVICE_PARTITION_EQUALLY among its partition types. */
static int partitions_equally(cl_device_id dev) {
  cl_device_partition_property types[8];
  size_t size = 0;
  if (clGetDeviceInfo(dev, CL_DEVICE_PARTITION_PROPERTIES, sizeof types,
                      types, &size) != CL_SUCCESS)
    return 0;
  for (size_t i = 0; i < size / sizeof types[0]; i++)
    if (types[i] == CL_DEVICE_PARTITION_EQUALLY) return 1;
  return 0;
}

cl_device_id mgpu__ocl_subdevice_get(mgpu__ocl_phys *ph, int id, int index,
                                     int count) {
  cl_uint max_sub = 0;
  if (count < 2 || index < 0 || index >= count ||
      ph->compute_units < (cl_uint)count ||
      clGetDeviceInfo(ph->dev, CL_DEVICE_PARTITION_MAX_SUB_DEVICES,
                      sizeof max_sub, &max_sub, NULL) != CL_SUCCESS ||
      max_sub < (cl_uint)count || !partitions_equally(ph->dev)) {
    mgpu__ocl_env->log(MGPU_LOG_INFO, "opencl: device %d: %s cannot be "
                       "partitioned into %d sub-devices: a share of the "
                       "whole device instead", id, ph->name, count);
    return NULL;
  }
  cl_device_partition_property props[] = {
      CL_DEVICE_PARTITION_EQUALLY,
      (cl_device_partition_property)(ph->compute_units / (cl_uint)count), 0};
  cl_uint n = 0;
  cl_int err = clCreateSubDevices(ph->dev, props, 0, NULL, &n);
  cl_device_id *subs = err == CL_SUCCESS && n >= (cl_uint)count
                           ? mgpu__calloc(n, sizeof *subs)
                           : NULL;
  if (subs != NULL) err = clCreateSubDevices(ph->dev, props, n, subs, NULL);
  if (subs == NULL || err != CL_SUCCESS) {
    mgpu__ocl_env->log(MGPU_LOG_INFO, "opencl: device %d: partitioning %s "
                       "failed (%s): a share of the whole device instead", id,
                       ph->name, mgpu__ocl_err_name(err));
    mgpu__free(subs);
    return NULL;
  }
  cl_device_id mine = subs[index];
  for (cl_uint i = 0; i < n; i++)
    if (i != (cl_uint)index) clReleaseDevice(subs[i]);
  mgpu__free(subs);
  mgpu__ocl_env->log(MGPU_LOG_INFO, "opencl: device %d is sub-device %d of "
                     "%d of %s (%u compute units)", id, index, count,
                     ph->name, ph->compute_units / (cl_uint)count);
  return mine;
}

void mgpu__ocl_subdevice_release(cl_device_id sub) {
  if (sub != NULL) clReleaseDevice(sub);
}
