// The emulator's runtime: blocks of pthreads with barriers (see emu.h).
#include "emu.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <mutex>
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
    unsigned uexchange[32][32];
    std::mutex named_mu; // the named barriers (emu_bar_sync)
    std::condition_variable named_cv;
    unsigned named_arrived[16] = {}, named_generation[16] = {};
    alignas(64) unsigned char shared[96 * 1024];
    std::vector<unsigned char> stage;
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

block_state *start_block(unsigned index, unsigned block, const std::function<void()> &kernel,
                         size_t stage_bytes)
{
    block_state *b = new block_state;
    b->index = index;
    b->nwarps = (block + 31) / 32;
    memset(b->shared, 0xff, sizeof b->shared); // uninitialised shared memory reads as NaN
    b->stage.assign(stage_bytes ? stage_bytes : 16, 0xff);
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

void *emu_stage() { return current->stage.data(); }

void __syncthreads()
{
    maybe_pause();
    pthread_barrier_wait(&current->all);
}

void __syncwarp(unsigned) { pthread_barrier_wait(&current->warp[threadIdx.x / 32]); }

void emu_bar_sync(int id, int threads)
{
    assert(id >= 0 && id < 16 && threads > 0 && threads % 32 == 0);
    maybe_pause();
    block_state *b = current;
    std::unique_lock<std::mutex> lock(b->named_mu);
    const unsigned generation = b->named_generation[id];
    if (++b->named_arrived[id] == (unsigned)threads) {
        b->named_arrived[id] = 0;
        b->named_generation[id]++;
        b->named_cv.notify_all();
    } else {
        b->named_cv.wait(lock, [&] { return b->named_generation[id] != generation; });
    }
}

// One value per lane through the warp's exchange array, between barriers.
template <typename T> static T exchange(T v, unsigned from_lane_of(unsigned lane, unsigned arg), unsigned arg)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    static_assert(sizeof(T) == sizeof(unsigned), "32-bit values");
    unsigned bits;
    memcpy(&bits, &v, sizeof bits);
    current->uexchange[w][lane] = bits;
    pthread_barrier_wait(&current->warp[w]);
    unsigned src = from_lane_of(lane, arg);
    unsigned got = src < 32 && w * 32 + src < blockDim.x ? current->uexchange[w][src] : bits;
    pthread_barrier_wait(&current->warp[w]);
    T r;
    memcpy(&r, &got, sizeof r);
    return r;
}

static unsigned xor_lane(unsigned lane, unsigned mask) { return lane ^ mask; }
static unsigned up_lane(unsigned lane, unsigned delta) { return lane >= delta ? lane - delta : lane; }

float __shfl_xor_sync(unsigned, float v, int lane_mask) { return exchange(v, xor_lane, (unsigned)lane_mask); }
int __shfl_xor_sync(unsigned, int v, int lane_mask) { return exchange(v, xor_lane, (unsigned)lane_mask); }
float __shfl_up_sync(unsigned, float v, unsigned delta) { return exchange(v, up_lane, delta); }

int __all_sync(unsigned, int predicate)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    current->uexchange[w][lane] = predicate != 0;
    pthread_barrier_wait(&current->warp[w]);
    int all = 1;
    for (unsigned l = 0; l < 32 && w * 32 + l < blockDim.x; l++)
        all = all && current->uexchange[w][l];
    pthread_barrier_wait(&current->warp[w]);
    return all;
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

void emu_launch(unsigned grid, unsigned block, int concurrent, const std::function<void()> &kernel,
                size_t stage_bytes)
{
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    std::deque<block_state *> live;
    for (unsigned b = 0; b < grid; b++) {
        while ((int)live.size() >= concurrent) {
            finish_block(live.front());
            live.pop_front();
        }
        live.push_back(start_block(b, block, kernel, stage_bytes));
    }
    while (!live.empty()) {
        finish_block(live.front());
        live.pop_front();
    }
}
