// The tensor-core product of the persistent GRU and LSTM kernels for
// 16-bit inputs: mma.sync m16n8k16 (bf16 or f16 in, f32 accumulated), the
// recurrent weights' rows as A (row-major, in shared memory) and a batch
// tile of h as B (its rows: B's columns). Fragments are loaded with plain
// 32-bit shared-memory loads in the PTX ISA's layouts:
//
//   lane = 4 g + t (g = lane / 4, t = lane % 4)
//   A a0: row g, k 2t..2t+1   a1: row g+8, k 2t..   a2: row g, k 2t+8..   a3: row g+8, k 2t+8..
//   B b0: k 2t..2t+1, col g   b1: k 2t+8..2t+9, col g
//   C c0, c1: row g, cols 2t, 2t+1   c2, c3: row g+8, cols 2t, 2t+1
//
// On the CPU emulator (test/emu) the same warp-wide product runs without
// the instruction: each lane gathers, with shuffles, the rows of A and the
// columns of B that its four results need from the lanes that hold them in
// those layouts, so a fragment loaded in the wrong place gives a wrong
// result there as on a GPU.
#ifndef FX_CUDA_RNN_MMA_CUH
#define FX_CUDA_RNN_MMA_CUH

#include <type_traits>

#include "cuda/common.cuh"

namespace fx::cuda::rnn {

#ifndef __CUDA_ARCH__
template <typename T> inline float half_bits(uint32_t bits)
{
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        __nv_bfloat16_raw raw;
        raw.x = (unsigned short)bits;
        return __bfloat162float(__nv_bfloat16(raw));
    } else {
        __half_raw raw;
        raw.x = (unsigned short)bits;
        return __half2float(__half(raw));
    }
}
#endif

// d += a b for one m16n8k16 tile (T: __nv_bfloat16 or __half).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
#ifdef __CUDA_ARCH__
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float rows[2][16], cols[2][16];
    for (int src_t = 0; src_t < 4; src_t++) {
        const int src = g * 4 + src_t;
        const uint32_t r[4] = {__shfl_sync(0xffffffffu, a[0], src), __shfl_sync(0xffffffffu, a[1], src),
                               __shfl_sync(0xffffffffu, a[2], src), __shfl_sync(0xffffffffu, a[3], src)};
        for (int half = 0; half < 2; half++) { // rows g and g + 8
            rows[half][2 * src_t] = half_bits<T>(r[half] & 0xffffu);
            rows[half][2 * src_t + 1] = half_bits<T>(r[half] >> 16);
            rows[half][2 * src_t + 8] = half_bits<T>(r[2 + half] & 0xffffu);
            rows[half][2 * src_t + 9] = half_bits<T>(r[2 + half] >> 16);
        }
    }
    for (int c = 0; c < 2; c++) {
        const int n = 2 * t + c;
        for (int src_t = 0; src_t < 4; src_t++) {
            const int src = n * 4 + src_t;
            const uint32_t b0 = __shfl_sync(0xffffffffu, b[0], src), b1 = __shfl_sync(0xffffffffu, b[1], src);
            cols[c][2 * src_t] = half_bits<T>(b0 & 0xffffu);
            cols[c][2 * src_t + 1] = half_bits<T>(b0 >> 16);
            cols[c][2 * src_t + 8] = half_bits<T>(b1 & 0xffffu);
            cols[c][2 * src_t + 9] = half_bits<T>(b1 >> 16);
        }
    }
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < 2; c++) {
            float s = d[2 * i + c];
            for (int k = 0; k < 16; k++)
                s = fmaf(rows[i][k], cols[c][k], s);
            d[2 * i + c] = s;
        }
#endif
}

__device__ __forceinline__ uint32_t load_pair(const void *p) { return *static_cast<const uint32_t *>(p); }

// out[q][b] = sum_k W[row q][k] v[b][k] (matvec's contract, persistent.cuh)
// on tensor cores: rows of T `ld` elements apart, zero from K up to `kp`
// (K rounded up to 16); v [8 NT][ldv] of T, zero past K and past the batch
// tile. Each warp takes an m-tile of 16 rows and a share of the k-steps,
// its NT n-tiles of 8 batch rows reusing each A fragment.
template <int NT, typename T>
__device__ __forceinline__ void matvec_mma(const T *base, int64_t gate_stride, int64_t ld, int units, int valid,
                                           int rows, int kp, const T *v, int ldv, float *out, float *part)
{
    constexpr int BT = 8 * NT;
    const int warps = (int)blockDim.x / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int mtiles = (rows + 15) / 16, ksteps = kp / 16;
    int splits = mtiles >= warps ? 1 : warps / mtiles;
    if (splits > ksteps)
        splits = ksteps > 0 ? ksteps : 1;
    const int per = (ksteps + splits - 1) / splits;
    float *dst = splits == 1 ? out : part;
    for (int w = warp; w < mtiles * splits; w += warps) {
        const int mt = w % mtiles, ks = w / mtiles;
        const int s0 = ks * per, s1 = s0 + per < ksteps ? s0 + per : ksteps;
        const T *row[2];
        for (int i = 0; i < 2; i++) {
            const int q = mt * 16 + g + 8 * i;
            row[i] = q < rows && q % units < valid ? base + ((q / units) * gate_stride + q % units) * ld : nullptr;
        }
        float acc[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            for (int i = 0; i < 4; i++)
                acc[nt][i] = 0.f;
        for (int s = s0; s < s1; s++) {
            const int k = s * 16 + 2 * t;
            const uint32_t a[4] = {row[0] ? load_pair(row[0] + k) : 0u, row[1] ? load_pair(row[1] + k) : 0u,
                                   row[0] ? load_pair(row[0] + k + 8) : 0u, row[1] ? load_pair(row[1] + k + 8) : 0u};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const T *vb = v + (nt * 8 + g) * ldv + k;
                const uint32_t b[2] = {load_pair(vb), load_pair(vb + 8)};
                mma_16816<T>(acc[nt], a, b);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            for (int i = 0; i < 2; i++) {
                const int q = mt * 16 + g + 8 * i;
                if (q < rows) {
                    float *o = dst + (ks * rows + q) * BT + nt * 8 + 2 * t;
                    o[0] = acc[nt][2 * i];
                    o[1] = acc[nt][2 * i + 1];
                }
            }
    }
    __syncthreads();
    if (splits > 1) {
        for (int i = threadIdx.x; i < rows * BT; i += (int)blockDim.x) {
            float sum = 0.f;
            for (int ks = 0; ks < splits; ks++)
                sum += part[ks * rows * BT + i];
            out[i] = sum;
        }
        __syncthreads();
    }
}

} // namespace fx::cuda::rnn

#endif
