#include "emu.h"

#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>

namespace emu {

int current;
dim3 block_idx, block_dim, grid_dim, thread_idx[1024];

namespace {
constexpr size_t kStack = 256 * 1024;
int nthreads;
ucontext_t start_ctx[1024];
jmp_buf sched_jb, fiber_jb[1024];
char *stacks[1024];
bool started[1024], done[1024];
int block_waiting, block_gen, warp_waiting[32], warp_gen[32];
float warp_slot[32][32];
const std::function<void()> *body;

void yield()
{
    if (!_setjmp(fiber_jb[current]))
        _longjmp(sched_jb, 1);
}

void entry()
{
    (*body)();
    done[current] = true;
    _longjmp(sched_jb, 1);
}

// Runs fiber t until it yields at a barrier or returns.
void resume(int t)
{
    current = t;
    if (!_setjmp(sched_jb)) {
        if (!started[t]) {
            started[t] = true;
            setcontext(&start_ctx[t]);
        }
        _longjmp(fiber_jb[t], 1);
    }
}

void warp_barrier(int w)
{
    int gen = warp_gen[w];
    if (++warp_waiting[w] == 32) {
        warp_waiting[w] = 0;
        warp_gen[w]++;
    } else {
        while (warp_gen[w] == gen)
            yield();
    }
}
} // namespace

void syncthreads()
{
    int gen = block_gen;
    if (++block_waiting == nthreads) {
        block_waiting = 0;
        block_gen++;
    } else {
        while (block_gen == gen)
            yield();
    }
}

void syncwarp() { warp_barrier(current / 32); }

float shfl_xor(float v, int lane_mask)
{
    int lane = current % 32, w = current / 32;
    warp_slot[w][lane] = v;
    warp_barrier(w);
    float r = warp_slot[w][lane ^ lane_mask];
    warp_barrier(w);
    return r;
}

void run_block(unsigned block, int threads, const std::function<void()> &kernel)
{
    if (threads % 32 != 0 || threads > 1024) {
        fprintf(stderr, "emu: %d threads per block\n", threads);
        abort();
    }
    static const bool reverse = getenv("EMU_REVERSE") != nullptr;
    nthreads = threads;
    body = &kernel;
    block_idx = dim3(block, 0, 0);
    block_dim = dim3((unsigned)threads, 1, 1);
    block_waiting = 0;
    for (int w = 0; w < 32; w++)
        warp_waiting[w] = 0;
    for (int t = 0; t < threads; t++) {
        if (!stacks[t])
            stacks[t] = static_cast<char *>(malloc(kStack));
        getcontext(&start_ctx[t]);
        start_ctx[t].uc_stack.ss_sp = stacks[t];
        start_ctx[t].uc_stack.ss_size = kStack;
        start_ctx[t].uc_link = nullptr;
        makecontext(&start_ctx[t], entry, 0);
        started[t] = done[t] = false;
        thread_idx[t] = dim3((unsigned)t, 0, 0);
    }
    int remaining = threads;
    long idle_rounds = 0;
    while (remaining > 0) {
        int finished_before = remaining;
        for (int i = 0; i < threads; i++) {
            int t = reverse ? threads - 1 - i : i;
            if (done[t])
                continue;
            resume(t);
            if (done[t])
                remaining--;
        }
        // Threads that returned while others wait at a barrier: a deadlock
        // on a GPU too.
        if (remaining == finished_before && remaining < threads && ++idle_rounds > 100000) {
            fprintf(stderr, "emu: block %u deadlocked (%d threads left)\n", block, remaining);
            abort();
        }
    }
}

} // namespace emu
