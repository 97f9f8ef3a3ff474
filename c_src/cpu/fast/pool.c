/* The fast path's thread pool and per-thread scratch (fast.h).
 *
 * Threads are started on the first call that needs them and wait on a
 * condition variable between calls; a call publishes one job (a function,
 * its range, the number of chunks), wakes the threads, runs the first
 * chunk itself and waits for the rest. One call holds the pool at a time:
 * a second caller (another dirty scheduler) runs its work inline rather
 * than queue, so no call ever waits on another's. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/fast/fast.h"

#define MAX_THREADS 64
/* Polls of the pending count before the caller sleeps on it: the other
 * chunks usually end within microseconds of the caller's. */
#define SPIN_POLLS 4000

typedef struct pool_job {
    fx_pool_fn fn;
    void *ctx;
    int64_t n, align;
    int parts;
} pool_job;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t threads[MAX_THREADS];
    int started;       /* worker threads running (the caller is not one) */
    int stopping;
    uint64_t generation; /* bumped per job */
    uint64_t start_generation[MAX_THREADS];
    pool_job job;
    atomic_int pending;  /* chunks of the job not yet finished by workers */
    atomic_flag busy;    /* a call holds the pool */
} pool = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .busy = ATOMIC_FLAG_INIT,
};

static int thread_target = 0; /* 0: not yet decided */
static pthread_once_t target_once = PTHREAD_ONCE_INIT;

/* A child of fork has none of the parent's threads: it starts its own. */
static void forget_threads_in_child(void)
{
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.started = 0;
    pool.stopping = 0;
    atomic_flag_clear(&pool.busy);
}

static void decide_threads(void)
{
    pthread_atfork(NULL, NULL, forget_threads_in_child);
    int n = 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    else
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *env = getenv("FUSEX_CPU_THREADS");
    if (env && *env) {
        int want = atoi(env);
        if (want > 0)
            n = want;
    }
    thread_target = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

int fx_pool_threads(void)
{
    pthread_once(&target_once, decide_threads);
    return thread_target;
}

/* Chunk k of a job: [lo, hi). */
static void chunk(const pool_job *j, int k, int64_t *lo, int64_t *hi)
{
    int64_t units = (j->n + j->align - 1) / j->align;
    int64_t a = units * k / j->parts, b = units * (k + 1) / j->parts;
    *lo = a * j->align;
    *hi = b * j->align < j->n ? b * j->align : j->n;
}

/* ---- per-thread scratch ---- */

typedef struct scratch {
    void *block;
    size_t size;
} scratch;

static _Thread_local scratch task_scratch, call_scratch;

/* A worker's scratch goes with it (its thread-local pointers do). */
static void release_scratch(void)
{
    free(task_scratch.block);
    free(call_scratch.block);
    task_scratch = (scratch){0};
    call_scratch = (scratch){0};
}

static void *worker(void *arg)
{
    int index = (int)(intptr_t)arg; /* 1.. : the caller runs chunk 0 */
    /* The generation when it was made: a job published before the thread
     * first takes the lock is still its to run. */
    uint64_t seen = pool.start_generation[index - 1];
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen && !pool.stopping)
            pthread_cond_wait(&pool.wake, &pool.lock);
        if (pool.stopping)
            break;
        seen = pool.generation;
        pool_job j = pool.job;
        pthread_mutex_unlock(&pool.lock);
        if (index < j.parts) {
            int64_t lo, hi;
            chunk(&j, index, &lo, &hi);
            if (lo < hi)
                j.fn(j.ctx, lo, hi);
            if (atomic_fetch_sub(&pool.pending, 1) == 1) {
                pthread_mutex_lock(&pool.lock);
                pthread_cond_signal(&pool.done);
                pthread_mutex_unlock(&pool.lock);
            }
        }
        pthread_mutex_lock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
    release_scratch();
    return NULL;
}

/* Under pool.lock: starts workers up to `want` (fewer where threads cannot
 * be made: the job then has fewer chunks). */
static int start_workers(int want)
{
    pool.stopping = 0;
    while (pool.started < want) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, (size_t)1 << 20);
        pool.start_generation[pool.started] = pool.generation;
        int rc = pthread_create(&pool.threads[pool.started], &attr, worker, (void *)(intptr_t)(pool.started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        pool.started++;
    }
    return pool.started;
}

void fx_pool_run(int64_t n, int64_t align, int64_t work, fx_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (align < 1)
        align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t by_work = work / FX_POOL_MIN_WORK;
    int64_t parts = fx_pool_threads();
    parts = parts < by_work ? parts : by_work;
    parts = parts < units ? parts : units;
    if (parts <= 1 || atomic_flag_test_and_set(&pool.busy)) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    int workers = start_workers((int)parts - 1);
    if (workers + 1 < parts)
        parts = workers + 1;
    if (parts <= 1) {
        pthread_mutex_unlock(&pool.lock);
        atomic_flag_clear(&pool.busy);
        fn(ctx, 0, n);
        return;
    }
    pool.job = (pool_job){fn, ctx, n, align, (int)parts};
    atomic_store(&pool.pending, (int)parts - 1);
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);

    int64_t lo, hi;
    chunk(&pool.job, 0, &lo, &hi);
    if (lo < hi)
        fn(ctx, lo, hi);
    for (int i = 0; i < SPIN_POLLS && atomic_load(&pool.pending) > 0; i++)
        sched_yield();
    if (atomic_load(&pool.pending) > 0) {
        pthread_mutex_lock(&pool.lock);
        while (atomic_load(&pool.pending) > 0)
            pthread_cond_wait(&pool.done, &pool.lock);
        pthread_mutex_unlock(&pool.lock);
    }
    atomic_flag_clear(&pool.busy);
}

void fx_pool_shutdown(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stopping = 1;
    pthread_cond_broadcast(&pool.wake);
    int started = pool.started;
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < started; i++)
        pthread_join(pool.threads[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.started = 0;
    pool.stopping = 0;
    pthread_mutex_unlock(&pool.lock);
}


static void *grow(scratch *s, size_t bytes)
{
    if (bytes <= s->size)
        return s->block;
    if (bytes > SIZE_MAX - 4096)
        return NULL;
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    void *fresh = aligned_alloc(64, rounded);
    if (!fresh)
        return NULL;
    free(s->block);
    s->block = fresh;
    s->size = rounded;
    return fresh;
}

void *fx_fast_scratch(size_t bytes) { return grow(&task_scratch, bytes); }

void *fx_fast_call_scratch(size_t bytes) { return grow(&call_scratch, bytes); }

/* ---- rows ---- */

const float *fx_fast_load(const fx_tensor *t, int64_t i0, int64_t n, float *buf)
{
    switch (t->dtype) {
    case FX_F32: return (const float *)t->data + i0;
    case FX_BF16: {
        const uint16_t *p = (const uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            buf[i] = fx_fast_bits_f((uint32_t)p[i] << 16);
        return buf;
    }
    case FX_F16: {
        const uint16_t *p = (const uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            buf[i] = fx_f16_to_f32(p[i]);
        return buf;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            buf[i] = (float)fx_load_f64(t->data, t->dtype, i0 + i);
        return buf;
    }
}

void fx_fast_store(const fx_tensor *t, int64_t i0, int64_t n, const float *row)
{
    switch (t->dtype) {
    case FX_F32:
        if ((const float *)t->data + i0 != row)
            memcpy((float *)t->data + i0, row, sizeof(float) * (size_t)n);
        return;
    case FX_BF16: {
        uint16_t *p = (uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            p[i] = fx_f32_to_bf16(row[i]);
        return;
    }
    case FX_F16: {
        uint16_t *p = (uint16_t *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            p[i] = fx_f32_to_f16(row[i]);
        return;
    }
    default:
        for (int64_t i = 0; i < n; i++)
            fx_store_f64(t->data, t->dtype, i0 + i, row[i]);
    }
}

void fx_fast_load_strided(const fx_tensor *t, int64_t i0, int64_t stride, int64_t n, float *out)
{
    if (t->dtype == FX_F32) {
        const float *p = (const float *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            out[i] = p[i * stride];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)fx_load_f64(t->data, t->dtype, i0 + i * stride);
}

void fx_fast_store_strided(const fx_tensor *t, int64_t i0, int64_t stride, int64_t n, const float *v)
{
    if (t->dtype == FX_F32) {
        float *p = (float *)t->data + i0;
        for (int64_t i = 0; i < n; i++)
            p[i * stride] = v[i];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        fx_store_f64(t->data, t->dtype, i0 + i * stride, v[i]);
}

float fx_fast_at(const fx_tensor *t, int64_t i, float dflt)
{
    return t ? (float)fx_load_f64(t->data, t->dtype, i) : dflt;
}
