/* Shared by the CPU kernel families: parallel-loop thresholds and the
 * per-family op tables the CPU backend links in. */
#ifndef FX_CPU_H
#define FX_CPU_H

#include "fusex.h"

/* Below this many elements a parallel region costs more than it saves. */
#define FX_CPU_PARALLEL_MIN 32768

extern const struct fx_ssm_ops fx_cpu_ssm_ops;
extern const struct fx_linrec_ops fx_cpu_linrec_ops;
extern const struct fx_optim_ops fx_cpu_optim_ops;

int fx_cpu_threads(void);

#endif
