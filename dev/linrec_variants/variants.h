// dev/linrec_variants: the linrec forward kernels launched directly
// (below the op layer), several variants of each, for kernel work on a GPU.
// What the kernel files (k_*.cu) and the driver (main.cu) share: plain
// types only, so that a kernel file may be compiled with the kernels'
// namespaces renamed (k_plain.cu: the same kernels with default stores).
#ifndef LV_VARIANTS_H
#define LV_VARIANTS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include <string>
#include <vector>

struct lv_args {
    int64_t B, L, H;
    const void *seq[3];
    const void *tau, *lam; // liquid
    float dt_value;
    void *h;
    float *state;     // NULL: not wanted
    char *scratch;    // look-back statuses (zeroed once)
    uint32_t epoch;   // new for every launch
    int sm_count;
    cudaStream_t stream;
};

// What a launch used, for the report.
struct lv_info {
    int regs, local_bytes, static_smem, per_sm;
    size_t dyn_smem;
    unsigned grid, threads;
    long long tiles, ttiles;
};

typedef cudaError_t (*lv_launch)(const lv_args &, lv_info *);

struct lv_variant {
    std::string name;
    int kind; // FX_LINREC_*
    int bf16; // inputs bf16 (else f32)
    lv_launch launch;
};

void lv_register_mingru(std::vector<lv_variant> &out);
void lv_register_scan(std::vector<lv_variant> &out);
void lv_register_other(std::vector<lv_variant> &out);
void lv_register_plain(std::vector<lv_variant> &out);

#endif
