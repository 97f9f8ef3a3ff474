// The emulator's runtime: blocks of pthreads with barriers (see emu.h).
#include "emu.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;

namespace {

struct block_state {
    pthread_barrier_t all;
    pthread_barrier_t warp[32];
    float exchange[32][32];
    unsigned uexchange[32][32];
    alignas(64) unsigned char shared[96 * 1024];
    unsigned index;
    unsigned nwarps;
    std::vector<pthread_t> threads;
};

struct thread_arg {
    block_state *blk;
    unsigned tid;
    const std::function<void()> *kernel;
};

thread_local block_state *current;
thread_local unsigned rng_state;
std::atomic<int> jitter_percent{0};

void *thread_main(void *p)
{
    thread_arg *a = static_cast<thread_arg *>(p);
    current = a->blk;
    threadIdx = {a->tid, 0, 0};
    blockIdx = {a->blk->index, 0, 0};
    rng_state = a->blk->index * 7919u + a->tid * 104729u + 12345u;
    (*a->kernel)();
    delete a;
    return nullptr;
}

void maybe_pause()
{
    int j = jitter_percent.load(std::memory_order_relaxed);
    if (j == 0)
        return;
    rng_state = rng_state * 1103515245u + 12345u;
    if ((rng_state >> 16) % 100 < (unsigned)j)
        usleep((rng_state >> 4) % 300);
}

block_state *start_block(unsigned index, unsigned block, const std::function<void()> &kernel)
{
    block_state *b = new block_state;
    b->index = index;
    b->nwarps = (block + 31) / 32;
    memset(b->shared, 0xff, sizeof b->shared); // uninitialised shared memory reads as NaN
    pthread_barrier_init(&b->all, nullptr, block);
    for (unsigned w = 0; w < b->nwarps; w++) {
        unsigned lanes = block - w * 32 < 32 ? block - w * 32 : 32;
        pthread_barrier_init(&b->warp[w], nullptr, lanes);
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    b->threads.resize(block);
    for (unsigned t = 0; t < block; t++) {
        thread_arg *a = new thread_arg{b, t, &kernel};
        if (pthread_create(&b->threads[t], &attr, thread_main, a) != 0) {
            perror("pthread_create");
            abort();
        }
    }
    pthread_attr_destroy(&attr);
    return b;
}

void finish_block(block_state *b)
{
    for (pthread_t &t : b->threads)
        pthread_join(t, nullptr);
    pthread_barrier_destroy(&b->all);
    for (unsigned w = 0; w < b->nwarps; w++)
        pthread_barrier_destroy(&b->warp[w]);
    delete b;
}

} // namespace

void *emu_shared(size_t bytes)
{
    assert(bytes <= sizeof current->shared);
    (void)bytes;
    return current->shared;
}

void __syncthreads()
{
    maybe_pause();
    pthread_barrier_wait(&current->all);
}

void __syncwarp(unsigned) { pthread_barrier_wait(&current->warp[threadIdx.x / 32]); }

float __shfl_xor_sync(unsigned, float v, int lane_mask)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    current->exchange[w][lane] = v;
    pthread_barrier_wait(&current->warp[w]);
    float r = current->exchange[w][lane ^ (unsigned)lane_mask];
    pthread_barrier_wait(&current->warp[w]);
    return r;
}

unsigned __reduce_min_sync(unsigned, unsigned v)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    current->uexchange[w][lane] = v;
    pthread_barrier_wait(&current->warp[w]);
    unsigned m = v;
    for (unsigned l = 0; l < 32 && w * 32 + l < blockDim.x; l++)
        m = current->uexchange[w][l] < m ? current->uexchange[w][l] : m;
    pthread_barrier_wait(&current->warp[w]);
    return m;
}

void __nanosleep(unsigned)
{
    sched_yield();
    usleep(10);
}

float atomicAdd(float *p, float v)
{
    uint32_t *bits = reinterpret_cast<uint32_t *>(p);
    uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), want;
    do {
        float f;
        memcpy(&f, &old, sizeof f);
        f += v;
        memcpy(&want, &f, sizeof f);
    } while (!__atomic_compare_exchange_n(bits, &old, want, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    float f;
    memcpy(&f, &old, sizeof f);
    return f;
}

void emu_set_jitter(int percent) { jitter_percent.store(percent); }

void emu_launch(unsigned grid, unsigned block, int concurrent, const std::function<void()> &kernel)
{
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    std::deque<block_state *> live;
    for (unsigned b = 0; b < grid; b++) {
        while ((int)live.size() >= concurrent) {
            finish_block(live.front());
            live.pop_front();
        }
        live.push_back(start_block(b, block, kernel));
    }
    while (!live.empty()) {
        finish_block(live.front());
        live.pop_front();
    }
}
