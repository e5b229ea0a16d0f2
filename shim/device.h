/* What bindgen translates of NCCL's device API (nccl_device.h, NCCL 2.28+), as C++: the header is C++ (it
 * defines templates, overloads and `nullptr` initializers), so the build reads it in C++ mode, separately
 * from wrapper.h. cuda.h and nccl.h first, as wrapper.h has them: the device run refers to their items
 * without translating them again. Outside nvcc the header declares the host functions (`__host__`
 * expands to nothing) and defines the types a kernel takes by value. */
#ifndef METRALE_SHIM_DEVICE_H
#define METRALE_SHIM_DEVICE_H
#include <cuda.h>
#include <nccl.h>
#include <nccl_device.h>
#endif
