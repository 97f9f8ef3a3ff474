// Vector loads and stores of VEC consecutive elements (one access of up to
// 16 bytes, two for 32), converted to and from f32, for element types
// known at compile time (T) or only at run time (a companion tensor whose
// type the caller picks: fx_dtype f32, bf16 or f16). The address must be
// aligned to the pack (VEC elements, at most 16 bytes); the launchers
// choose VEC > 1 only where every row they touch is.
#ifndef FX_CUDA_PACK_CUH
#define FX_CUDA_PACK_CUH

#include "cuda/common.cuh"

namespace fx::cuda {

template <typename S, int VEC> struct alignas(sizeof(S) * VEC < 16 ? sizeof(S) * VEC : 16) Pack {
    S v[VEC];
};

template <typename T, int VEC> __device__ __forceinline__ void load_pack(const T *p, int64_t i, float (&out)[VEC])
{
    const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC> *>(p + i);
#pragma unroll
    for (int k = 0; k < VEC; k++)
        out[k] = (float)Elem<T>::load(pk.v[k]);
}

template <typename T, int VEC> __device__ __forceinline__ void store_pack(T *p, int64_t i, const float (&v)[VEC])
{
    Pack<T, VEC> pk;
#pragma unroll
    for (int k = 0; k < VEC; k++)
        pk.v[k] = Elem<T>::store(v[k]);
    *reinterpret_cast<Pack<T, VEC> *>(p + i) = pk;
}

// The same for a tensor whose type (f32, bf16, f16) is a run-time value:
// one branch a pack, the same for every thread.
template <int VEC> __device__ __forceinline__ void load_pack_any(const void *p, int type, int64_t i, float (&out)[VEC])
{
    switch (type) {
    case FX_BF16: load_pack<__nv_bfloat16, VEC>(static_cast<const __nv_bfloat16 *>(p), i, out); break;
    case FX_F16: load_pack<__half, VEC>(static_cast<const __half *>(p), i, out); break;
    default: load_pack<float, VEC>(static_cast<const float *>(p), i, out); break;
    }
}

template <int VEC> __device__ __forceinline__ void store_pack_any(void *p, int type, int64_t i, const float (&v)[VEC])
{
    switch (type) {
    case FX_BF16: store_pack<__nv_bfloat16, VEC>(static_cast<__nv_bfloat16 *>(p), i, v); break;
    case FX_F16: store_pack<__half, VEC>(static_cast<__half *>(p), i, v); break;
    default: store_pack<float, VEC>(static_cast<float *>(p), i, v); break;
    }
}

// Whether a pointer is aligned to `bytes`.
static inline bool aligned_to(const void *p, size_t bytes) { return p == nullptr || (uintptr_t)p % bytes == 0; }

} // namespace fx::cuda

#endif
