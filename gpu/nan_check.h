/* The NaN check of collective inputs (C10D_NCCL_NAN_CHECK): a CUDA kernel,
 * compiled by nvcc into a fatbin that the library embeds and loads at run
 * time with the CUDA runtime it loaded (cudaLibraryLoadData), so libc10d
 * still links no CUDA library. The kernel runs on a communicator's stream
 * before the op's NCCL calls; where it finds a NaN it writes the op's tag
 * into a flag in mapped host memory, which the loop reads when the op's end
 * event fires. A NaN thus fails the op (and the group) with a message; it
 * does not stop the collective, and nothing traps the device or kills the
 * process. The kernel's ABI is in nan_check_kernel.h. */
#ifndef C10D_GPU_NAN_CHECK_H
#define C10D_GPU_NAN_CHECK_H

#include "gpu/gpu_api.h"
#include "gpu/nan_check_kernel.h"
#include "c10d.h"

#include <stdint.h>

/* Does the check apply to dtype? (the float types) */
int c10d__nan_check_applies(c10d_dtype dt);
/* 1 if this build embeds the kernel (nvcc was usable); no CUDA call. */
int c10d__nan_check_built(void);
/* Any thread, once per process: loads the kernel through the CUDA runtime
 * libc10d loaded (c10d__cuda_load). 0, or
 * C10D_EUNSUPPORTED naming why (this build has no kernel, or the runtime
 * refused it: no image for the device). */
int c10d__nan_check_load(void);
/* Enqueues the check of count elements at buf on `stream` (the current
 * device's); where one is NaN the kernel sets *flag = tag. 0 or C10D_EIO. */
int c10d__nan_check_launch(const struct c10d__cudart_api *api, const void *buf, size_t count,
                           c10d_dtype dt, uint64_t *flag, uint64_t tag, cudaStream_t stream);

#endif
