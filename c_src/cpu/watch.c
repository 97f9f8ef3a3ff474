/* Callers that go away (fusex_cpu.h): the test a caller names per thread,
 * and the watch the long loops poll. */
#include <time.h>

#include "cpu/cpu.h"

static _Thread_local fx_alive_fn caller_alive;
static _Thread_local void *caller_arg;

void fx_cpu_watch_caller(fx_alive_fn alive, void *arg)
{
    caller_alive = alive;
    caller_arg = arg;
}

void fx_cpu_unwatch_caller(void)
{
    caller_alive = NULL;
    caller_arg = NULL;
}

void fx_watch_begin(fx_watch *w)
{
    w->alive = caller_alive;
    w->arg = caller_arg;
    w->owner = pthread_self();
    atomic_init(&w->gone, false);
    w->polls = 0;
    w->next_ns = 0;
}

/* The clock is read once every WATCH_POLLS polls, the test run at most
 * every WATCH_PERIOD_NS: a few nanoseconds a step, and a killed caller's
 * work stops within about 10 ms. */
#define WATCH_POLLS 64
#define WATCH_PERIOD_NS 10000000

bool fx_watch_gone(fx_watch *w)
{
    if (!w->alive)
        return false;
    if (atomic_load_explicit(&w->gone, memory_order_relaxed))
        return true;
    if (!pthread_equal(pthread_self(), w->owner) || ++w->polls < WATCH_POLLS)
        return false;
    w->polls = 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    if (ns < w->next_ns)
        return false;
    w->next_ns = ns + WATCH_PERIOD_NS;
    if (w->alive(w->arg))
        return false;
    atomic_store(&w->gone, true);
    return true;
}

int fx_watch_end(fx_watch *w, const char *op, fx_status *st)
{
    if (w->alive && atomic_load(&w->gone))
        return fx_fail(st, FX_EINTERNAL, "cancelled: the process that called %s exited before it finished", op);
    return FX_OK;
}
