/* Shared by the CPU kernel families: parallel-loop thresholds and the
 * per-family op tables the CPU backend links in. */
#ifndef FX_CPU_H
#define FX_CPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "fusex.h"
#include "fusex_cpu.h"

/* Below this many elements a parallel region costs more than it saves.
 * Waking the team costs microseconds on an idle machine, and far more when
 * the BEAM's schedulers (which spin while they look for work) or other
 * processes hold the cores: a cheap elementwise op over 64K elements was
 * measured at 252 µs with two threads against 172 µs with one on a loaded
 * 2-core machine. Around a quarter million elements the work (~100 µs and
 * up) outweighs that. */
#define FX_CPU_PARALLEL_MIN 262144

/* The CPU backend's devices: 0 runs the fast f32 path (c_src/cpu/fast),
 * 1 the f64-accumulating oracle these files implement, which the tests
 * compare every other path against. Both are host memory. */
#define FX_CPU_FAST 0
#define FX_CPU_REFERENCE 1

/* The oracle's op tables (the fast tables hand f64 and the reference
 * device's calls to them). */
extern const struct fx_ssm_ops fx_cpu_ssm_ops;
extern const struct fx_linrec_ops fx_cpu_linrec_ops;
extern const struct fx_optim_ops fx_cpu_optim_ops;
extern const struct fx_rnn_ops fx_cpu_rnn_ops;
extern const struct fx_linear_ops fx_cpu_linear_ops;
extern const struct fx_norm_ops fx_cpu_norm_ops;
extern const struct fx_conv_ops fx_cpu_conv_ops;
extern const struct fx_loss_ops fx_cpu_loss_ops;

int fx_cpu_threads(void);

/* The test fx_cpu_watch_caller named, as one op sees it. */
typedef struct fx_watch {
    fx_alive_fn alive; /* NULL: nothing to watch */
    void *arg;
    pthread_t owner;   /* the thread that named it: the only one alive() may run on */
    atomic_bool gone;
    unsigned polls;    /* the owner's, since its last look at the clock */
    int64_t next_ns;   /* the owner's: when alive() may run next */
} fx_watch;

/* At the start of an op, on the thread that runs it: takes that thread's
 * test (the threads the op starts, OpenMP's, poll the same watch). */
void fx_watch_begin(fx_watch *w);
/* Whether the caller is gone; cheap enough for every step of a loop, from
 * any thread: an atomic load, and on the owner now and then (at most every
 * 10 ms) the test itself. */
bool fx_watch_gone(fx_watch *w);
/* FX_OK, or the cancellation of `op` in st when the caller went. */
int fx_watch_end(fx_watch *w, const char *op, fx_status *st);

/* The tasks of a watched parallel loop run in pieces of this many, the
 * watch looked at between them: an OpenMP loop cannot be left early, and
 * skipping the tasks still left (`continue`) would cost a scheduling step
 * each, hours for a loop of 2^40. So a killed caller's work stops within
 * one piece. Large enough that a piece's fork-join costs nothing. */
#define FX_WATCH_PIECE ((int64_t)1 << 14)

/* [lo, hi) of the piece starting at lo of `tasks`. */
static inline int64_t fx_piece_end(int64_t lo, int64_t tasks)
{
    return tasks - lo < FX_WATCH_PIECE ? tasks : lo + FX_WATCH_PIECE;
}

#endif
