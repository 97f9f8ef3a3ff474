/* For the GPU tools (dev/ssm_bench, dev/linrec_variants): a CUDA call
 * that fails ends the run, naming the file, the line, the call and CUDA's
 * message. */
#ifndef FX_TOOLS_CUDA_CHECK_H
#define FX_TOOLS_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#endif
