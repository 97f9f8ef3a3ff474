// The emulator's scheduler: blocks of fibers on one OS thread (emu.h says
// what is emulated and what is not).
#include "emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "run.h"

// The kernels' `__shared__` variables, gathered by shared.ld.
extern "C" char fx_emu_shared_begin[], fx_emu_shared_end[];

namespace fx_emu {

thread_pos *cur;
dim3 grid_dim, block_dim;

namespace {

constexpr size_t kStack = 256 << 10; // a fiber's stack (a kernel's frame is a few KB)
constexpr int kMaxThreads = 1024;
constexpr int kNamedBarriers = 16;
constexpr size_t kCanary = 64;  // bytes past a block's dynamic shared memory, checked after it
// Spins (__nanosleep, as the look-back waits) while no block of the launch
// finishes or opens a __syncthreads: past this, one is waiting for
// something that never comes. (The blocks of a persistent kernel finish
// only at its end; one that goes on through its barriers is progressing.)
constexpr long kSpinLimit = 20000000;

struct pending_copy {
    void *dst;
    const void *src;
    int bytes;
    bool valid;
    unsigned group; // the commit group it belongs to
};

struct block;

// Where a fiber or the scheduler goes on: GCC's __builtin_setjmp buffer
// (frame and stack pointers and the resume address; the compiler saves
// every other register at the setjmp). Far cheaper than glibc's longjmp,
// which also walks the thread's cleanup handlers.
typedef void *context[5];

struct fiber : thread_pos {
    context ctx;
    ucontext_t start; // its first entry only
    char *stack;
    bool started, done;
    block *blk;
    const unsigned *wait_on; // a barrier's generation, while it waits there
    unsigned wait_val;
    std::vector<pending_copy> copies;
    unsigned committed; // commit groups closed so far
};

// A barrier's state alternates between two slots by generation: a thread
// reads the outcome of generation g after it opened, and slot g & 1 is
// reset only when generation g + 1 opens, which needs that thread again.
struct warp_state {
    int arrived, live;
    unsigned gen;
    uint64_t value[2][32]; // shuffles: what each lane put in
    unsigned ballot[2], present[2];
};

struct block {
    unsigned index;
    int threads, nwarps, live;
    std::vector<fiber *> fibers; // the slot's, reused by every block it runs
    int arrived;
    unsigned gen;
    int count[2], total[2]; // __syncthreads_*: predicates true, threads arrived
    warp_state warps[kMaxThreads / 32];
    struct {
        int arrived;
        unsigned gen;
    } named[kNamedBarriers];
    unsigned char *dyn = nullptr;
    size_t dyn_bytes = 0, dyn_cap = 0;
    unsigned char *scan = nullptr;
    size_t scan_bytes = 0, scan_cap = 0;
    std::vector<unsigned char> statics; // its copy of the __shared__ section
    std::vector<unsigned> order;
    bool busy = false;
};

struct config {
    int blocks = 4;     // blocks in flight (the most, 2x, in a random interleaving)
    uint64_t seed = 0;  // 0: the fixed order
    bool reverse = false;
    bool trace = false; // each launch on stderr
} cfg;
bool configured;
uint64_t rng;
thread_local int last_error; // per host thread, as CUDA's
std::mutex launching;         // one launch at a time: the state below is the launch's

context sched_ctx;
fiber *running;
// The pass under way (run_pass): its block, the next place in its order,
// the fibers resumed so far and the most it may resume.
block *pass_block;
int pass_pos, pass_ran, pass_stop;
std::vector<block *> slots;
block *section_owner; // whose __shared__ variables are in the section now
std::vector<unsigned char> host_section;
long spins;
const char *launch_name;
void (*launch_fn)(void *);
void *launch_ctx;

size_t section_bytes() { return (size_t)(fx_emu_shared_end - fx_emu_shared_begin); }

[[noreturn]] void die(const std::string &what)
{
    fprintf(stderr, "fusex CUDA emulator: %s\n", what.c_str());
    fflush(stderr);
    abort();
}

// "<kernel> block <index>"
std::string where(unsigned index) { return std::string(launch_name) + " block " + std::to_string(index); }

unsigned random_below(unsigned n)
{ /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned)((z ^ (z >> 31)) % n);
}

bool random_order() { return cfg.seed != 0; }

// ---- fibers ----

// The next fiber of the pass that can run (not finished, not held at a
// barrier that has not opened), or nullptr when the pass is over.
fiber *next_in_pass()
{
    block *b = pass_block;
    while (pass_pos < b->threads && pass_ran < pass_stop) {
        fiber *f = b->fibers[b->order[(size_t)pass_pos++]];
        if (f->done || (f->wait_on && *f->wait_on == f->wait_val))
            continue;
        pass_ran++;
        return f;
    }
    return nullptr;
}

// Goes on in f (its first entry: at fiber_main). __builtin_longjmp may not
// share a function with the __builtin_setjmp it returns to.
__attribute__((noinline)) void enter(fiber *f)
{
    running = f;
    cur = f;
    if (!f->started) {
        f->started = true;
        setcontext(&f->start);
    }
    __builtin_longjmp(f->ctx, 1);
}

__attribute__((noinline)) void back_to_scheduler()
{
    running = nullptr;
    cur = nullptr;
    __builtin_longjmp(sched_ctx, 1);
}

// The running fiber stops here; the next one of the pass (or the
// scheduler) goes on. It resumes here when a later pass takes it.
void yield()
{
    if (__builtin_setjmp(running->ctx) == 0) {
        fiber *next = next_in_pass();
        if (next)
            enter(next);
        back_to_scheduler();
    }
}

// Yields until *gen moves past val (a barrier's generation opens).
void wait_for(const unsigned *gen, unsigned val)
{
    running->wait_on = gen;
    running->wait_val = val;
    while (*gen == val)
        yield();
    running->wait_on = nullptr;
}

void land(const pending_copy &c)
{
    if (c.valid)
        memcpy(c.dst, c.src, (size_t)c.bytes);
    else
        memset(c.dst, 0, (size_t)c.bytes);
}

// Lands this thread's copies of every group before `group`.
void land_before(unsigned group)
{
    std::vector<pending_copy> &all = running->copies;
    size_t kept = 0;
    for (size_t i = 0; i < all.size(); i++) {
        if (all[i].group < group)
            land(all[i]);
        else
            all[kept++] = all[i];
    }
    all.resize(kept);
}

void open_warp(warp_state &w)
{
    w.arrived = 0;
    w.gen++;
    w.ballot[w.gen & 1] = w.present[w.gen & 1] = 0;
}

void open_block(block *b)
{
    spins = 0;
    b->arrived = 0;
    b->gen++;
    b->count[b->gen & 1] = b->total[b->gen & 1] = 0;
}

// What a thread does when its kernel returns: its copies land, and
// barriers that waited only for it open (a GPU counts exited warps as
// arrived).
void thread_exit(fiber *f)
{
    land_before(~0u);
    block *b = f->blk;
    b->live--;
    warp_state &w = b->warps[f->warp];
    w.live--;
    if (w.arrived > 0 && w.arrived == w.live)
        open_warp(w);
    if (b->arrived > 0 && b->arrived == b->live)
        open_block(b);
}

void fiber_main()
{
    for (;;) {
        fiber *f = running;
        launch_fn(launch_ctx);
        thread_exit(f);
        f->done = true;
        yield(); // taken again for a thread of a later block
    }
}

size_t page_bytes() { return (size_t)sysconf(_SC_PAGESIZE); }

fiber *new_fiber()
{
    fiber *f = new fiber();
    const size_t page = page_bytes();
    void *mem = mmap(nullptr, kStack + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (mem == MAP_FAILED)
        die("no memory for the stack of a fiber");
    mprotect(mem, page, PROT_NONE); // an overflow faults
    f->stack = static_cast<char *>(mem);
    getcontext(&f->start);
    f->start.uc_stack.ss_sp = f->stack + page;
    f->start.uc_stack.ss_size = kStack;
    f->start.uc_link = nullptr;
    makecontext(&f->start, fiber_main, 0);
    return f;
}

// ---- blocks ----

// The __shared__ variables of block b in the section (the block before
// it keeps its own in its copy).
void take_section(block *b)
{
    const size_t n = section_bytes();
    if (n == 0 || section_owner == b)
        return;
    if (section_owner)
        memcpy(section_owner->statics.data(), fx_emu_shared_begin, n);
    memcpy(fx_emu_shared_begin, b->statics.data(), n);
    section_owner = b;
}

block *start_block(unsigned index, int threads, size_t smem)
{
    block *b = nullptr;
    for (block *s : slots)
        if (!s->busy) {
            b = s;
            break;
        }
    if (!b) {
        b = new block();
        slots.push_back(b);
    }
    b->busy = true;
    b->index = index;
    b->threads = threads;
    b->nwarps = (threads + 31) / 32;
    b->live = threads;
    b->arrived = 0;
    b->gen = 0;
    b->count[0] = b->total[0] = 0;
    for (int w = 0; w < b->nwarps; w++) {
        warp_state &ws = b->warps[w];
        ws.arrived = 0;
        ws.live = threads - 32 * w < 32 ? threads - 32 * w : 32;
        ws.gen = 0;
        ws.ballot[0] = ws.present[0] = 0;
    }
    for (auto &n : b->named)
        n.arrived = 0;
    // shared memory: NaN until written
    if (smem + kCanary > b->dyn_cap) {
        free(b->dyn);
        b->dyn_cap = smem + kCanary;
        b->dyn = static_cast<unsigned char *>(aligned_alloc(128, (b->dyn_cap + 127) / 128 * 128));
        if (!b->dyn)
            die("no memory for the shared memory of " + where(index));
    }
    b->dyn_bytes = smem;
    memset(b->dyn, 0xff, smem + kCanary);
    b->scan_bytes = 0; // poisoned when the kernel first asks for it
    b->statics.assign(section_bytes(), 0xff);
    while ((int)b->fibers.size() < threads)
        b->fibers.push_back(new_fiber());
    for (int t = 0; t < threads; t++) {
        fiber *f = b->fibers[(size_t)t];
        f->thread_idx = make_uint3((unsigned)t, 0, 0);
        f->block_idx = make_uint3(index, 0, 0);
        f->lane = (unsigned)t % 32;
        f->warp = (unsigned)t / 32;
        f->done = false;
        f->blk = b;
        f->wait_on = nullptr;
        f->copies.clear();
        f->committed = 0;
    }
    b->order.resize((size_t)threads);
    return b;
}

void finish_block(block *b)
{
    for (size_t i = 0; i < kCanary; i++)
        if (b->dyn[b->dyn_bytes + i] != 0xff)
            die(where(b->index) + " wrote past its " + std::to_string(b->dyn_bytes) +
                " bytes of dynamic shared memory");
    if (section_owner == b)
        section_owner = nullptr;
    b->busy = false;
}

[[noreturn]] void deadlock(block *b)
{
    std::string what;
    int shown = 0;
    for (int t = 0; t < b->threads && shown < 8; t++) {
        const fiber *f = b->fibers[(size_t)t];
        if (f->done)
            continue;
        const char *at = f->wait_on == &b->gen ? "__syncthreads"
                         : f->wait_on == &b->warps[f->warp].gen ? "a warp sync point"
                                                                : "a named barrier";
        what += " thread " + std::to_string(t) + " waits at " + at + ";";
        shown++;
    }
    what += " " + std::to_string(b->live) + " threads live";
    die(where(b->index) + " can never go on:" + what);
}

// The order of a pass over b's fibers: in order, backward (FUSEX_EMU_REVERSE
// or at random), or shuffled.
void choose_order(block *b)
{
    const unsigned n = (unsigned)b->threads;
    const unsigned how = random_order() ? random_below(4) : cfg.reverse ? 1 : 0;
    for (unsigned i = 0; i < n; i++)
        b->order[i] = how == 1 ? n - 1 - i : i;
    if (how >= 2)
        for (unsigned i = n - 1; i > 0; i--)
            std::swap(b->order[i], b->order[random_below(i + 1)]);
}

// Every runnable fiber of b once (in a random interleaving, maybe only
// the first few), each going on until it yields: a yielding fiber hands
// over to the next one itself, the last one to the scheduler.
void run_pass(block *b)
{
    take_section(b);
    choose_order(b);
    pass_block = b;
    pass_pos = 0;
    pass_ran = 0;
    pass_stop = random_order() && random_below(8) == 0 ? 1 + (int)random_below((unsigned)b->threads) : b->threads;
    fiber *first = next_in_pass();
    if (!first) {
        if (b->live > 0)
            deadlock(b);
        return;
    }
    if (__builtin_setjmp(sched_ctx) == 0)
        enter(first);
}

void configure()
{
    if (configured)
        return;
    configured = true;
    if (const char *s = getenv("FUSEX_EMU_BLOCKS"))
        cfg.blocks = atoi(s) < 1 ? 1 : atoi(s) > 64 ? 64 : atoi(s);
    if (const char *s = getenv("FUSEX_EMU_SEED"))
        cfg.seed = strtoull(s, nullptr, 10);
    if (const char *s = getenv("FUSEX_EMU_REVERSE"))
        cfg.reverse = *s && strcmp(s, "0") != 0;
    if (const char *s = getenv("FUSEX_EMU_TRACE"))
        cfg.trace = *s && strcmp(s, "0") != 0;
    rng = cfg.seed;
}

} // namespace

// ---- what emu.h's device functions call ----

void syncthreads() { syncthreads_reduce(0, 0); }

int syncthreads_reduce(int predicate, int op)
{
    block *b = running->blk;
    const unsigned gen = b->gen, s = gen & 1;
    b->count[s] += predicate != 0;
    b->total[s]++;
    if (++b->arrived == b->live)
        open_block(b);
    else
        wait_for(&b->gen, gen);
    return op == 0 ? b->count[s] > 0 : op == 1 ? b->count[s] == b->total[s] : b->count[s];
}

void syncwarp()
{
    warp_state &w = running->blk->warps[running->warp];
    const unsigned gen = w.gen;
    if (++w.arrived == w.live)
        open_warp(w);
    else
        wait_for(&w.gen, gen);
}

uint64_t shuffle(uint64_t v, int how, int arg, int width)
{
    fiber *f = running;
    warp_state &w = f->blk->warps[f->warp];
    const unsigned s = w.gen & 1, lane = f->lane;
    w.value[s][lane] = v;
    w.present[s] |= 1u << lane;
    syncwarp();
    const int seg = (int)lane / width * width, in = (int)lane - seg; // the lane's segment of `width`
    int src;
    switch (how) {
    case 0: src = seg + (arg % width + width) % width; break;
    case 1: src = in >= arg ? (int)lane - arg : (int)lane; break;
    case 2: src = in + arg < width ? (int)lane + arg : (int)lane; break;
    default: src = (in ^ arg) < width ? seg + (in ^ arg) : (int)lane; break;
    }
    // a lane that is not there (exited, or past a partial warp) gives nothing new
    return src >= 0 && src < 32 && (w.present[s] >> src & 1) ? w.value[s][src] : v;
}

unsigned vote(int predicate, int op)
{
    fiber *f = running;
    warp_state &w = f->blk->warps[f->warp];
    const unsigned s = w.gen & 1;
    if (predicate)
        w.ballot[s] |= 1u << f->lane;
    w.present[s] |= 1u << f->lane;
    syncwarp();
    return op == 0 ? (w.ballot[s] & w.present[s]) == w.present[s] : op == 1 ? w.ballot[s] != 0 : w.ballot[s];
}

void spin()
{
    if (++spins > kSpinLimit)
        die(where(running->blk->index) + " spins on and on, and no block of the launch finishes");
    yield();
}

void bar_sync(int id, int threads)
{
    block *b = running->blk;
    if (id < 0 || id >= kNamedBarriers || threads <= 0 || threads % 32 != 0 || threads > b->threads)
        die(where(b->index) + ": bar.sync with id " + std::to_string(id) + " and " + std::to_string(threads) +
            " threads");
    auto &n = b->named[id];
    const unsigned gen = n.gen;
    if (++n.arrived == threads) {
        n.arrived = 0;
        n.gen++;
    } else {
        wait_for(&n.gen, gen);
    }
}

void *dynamic_smem() { return running->blk->dyn; }

void *scan_shared(size_t bytes)
{
    block *b = running->blk;
    if (b->scan_bytes == 0) { // the first thread of the block to get here
        if (bytes > b->scan_cap) {
            free(b->scan);
            b->scan_cap = bytes;
            b->scan = static_cast<unsigned char *>(aligned_alloc(128, (bytes + 127) / 128 * 128));
            if (!b->scan)
                die("no memory for the FX_SCAN_SHARED block of " + where(b->index));
        }
        memset(b->scan, 0xff, bytes);
        b->scan_bytes = bytes;
    } else if (bytes != b->scan_bytes) {
        die(where(b->index) + " asks for FX_SCAN_SHARED blocks of two sizes");
    }
    return b->scan;
}

void copy_async(void *dst, const void *src, int bytes, bool valid)
{
    pending_copy c = {dst, src, bytes, valid, running->committed};
    if (random_order() && random_below(2) == 0)
        land(c); // as soon as issued
    else
        running->copies.push_back(c);
}

void copy_commit() { running->committed++; }

void copy_wait(int pending)
{
    if (running->committed > (unsigned)pending)
        land_before(running->committed - (unsigned)pending);
}

void copy_wait_all() { land_before(~0u); }

// ---- launches (run.h) ----

int run_grid(const char *name, int64_t grid, int threads, size_t smem, size_t smem_limit, void (*fn)(void *),
             void *ctx, int64_t cooperative)
{
    if (running) // (before the lock: this thread holds it)
        die(std::string(name) + " launched from inside a kernel (" + where(running->blk->index) + ")");
    std::lock_guard<std::mutex> held(launching);
    configure();
    if (grid < 1 || grid > 0x7fffffff || threads < 1 || threads > kMaxThreads || smem > smem_limit) {
        last_error = cudaErrorInvalidConfiguration;
        return last_error;
    }
    if (cooperative > 0 && grid > cooperative) {
        last_error = cudaErrorCooperativeLaunchTooLarge;
        return last_error;
    }
    launch_name = name;
    launch_fn = fn;
    launch_ctx = ctx;
    grid_dim = dim3((unsigned)grid, 1, 1);
    block_dim = dim3((unsigned)threads, 1, 1);
    host_section.assign(fx_emu_shared_begin, fx_emu_shared_end);
    // a cooperative grid is resident whole: its blocks wait for each other
    const int inflight = cooperative > 0   ? (int)grid
                         : random_order() ? 1 + (int)random_below(2 * (unsigned)cfg.blocks)
                                          : cfg.blocks;
    if (cfg.trace)
        fprintf(stderr, "fusex CUDA emulator: %s: %lld blocks of %d threads, %zu bytes of dynamic shared memory, %d in "
                        "flight%s\n",
                name, (long long)grid, threads, smem, inflight, cooperative > 0 ? " (cooperative)" : "");
    std::vector<block *> live;
    int64_t next = 0;
    size_t turn = 0;
    spins = 0;
    while (next < grid || !live.empty()) {
        while ((int)live.size() < inflight && next < grid)
            live.push_back(start_block((unsigned)next++, threads, smem));
        const size_t pick = random_order() ? random_below((unsigned)live.size()) : turn++ % live.size();
        block *b = live[pick];
        run_pass(b);
        if (b->live == 0) {
            finish_block(b);
            live.erase(live.begin() + (ptrdiff_t)pick);
            spins = 0;
        }
    }
    if (!host_section.empty())
        memcpy(fx_emu_shared_begin, host_section.data(), host_section.size());
    section_owner = nullptr;
    return cudaSuccess;
}

void release_all()
{
    std::lock_guard<std::mutex> held(launching);
    for (block *b : slots) {
        for (fiber *f : b->fibers) {
            munmap(f->stack, kStack + page_bytes());
            delete f;
        }
        free(b->dyn);
        free(b->scan);
        delete b;
    }
    slots.clear();
    section_owner = nullptr;
}

int take_last_error()
{
    const int err = last_error;
    last_error = cudaSuccess;
    return err;
}

std::string describe()
{
    std::lock_guard<std::mutex> held(launching);
    configure();
    std::string s;
    if (cfg.seed)
        s = "1 to " + std::to_string(2 * cfg.blocks) + " blocks in flight, random interleaving FUSEX_EMU_SEED=" +
            std::to_string(cfg.seed);
    else
        s = std::to_string(cfg.blocks) + " blocks in flight, fixed order" +
            (cfg.reverse ? ", threads last to first" : "");
    s += ", " + std::to_string(section_bytes()) + " bytes of __shared__ variables";
    return s;
}

} // namespace fx_emu
