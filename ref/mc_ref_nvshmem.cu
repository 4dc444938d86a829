/* mc_ref_nvshmem.cu - the test side of "attach": an application that
 * starts NVSHMEM itself before it creates a communicator. Host calls only
 * (no device code), compiled by nvcc because NVSHMEM's headers need it. */
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

extern "C" int mc_ref_nvshmem_init_alone(int device) {
  if (cudaSetDevice(device) != cudaSuccess) return 1;
  nvshmemx_uniqueid_t id;
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (nvshmemx_get_uniqueid(&id) != 0 || nvshmemx_set_attr_uniqueid_args(0, 1, &id, &attr) != 0) return 1;
  return nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0;
}

extern "C" int mc_ref_nvshmem_initialized(void) { return nvshmemx_init_status() >= NVSHMEM_STATUS_IS_INITIALIZED; }

extern "C" void mc_ref_nvshmem_finalize(void) { nvshmem_finalize(); }
