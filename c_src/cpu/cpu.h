/* Shared by the CPU kernel families: parallel-loop thresholds and the
 * per-family op tables the CPU backend links in. */
#ifndef FX_CPU_H
#define FX_CPU_H

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

extern const struct fx_ssm_ops fx_cpu_ssm_ops;
extern const struct fx_linrec_ops fx_cpu_linrec_ops;
extern const struct fx_optim_ops fx_cpu_optim_ops;

int fx_cpu_threads(void);

#endif
