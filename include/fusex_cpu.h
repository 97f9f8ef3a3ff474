/*
 * The CPU backend: the reference every other backend is tested against, and
 * device 0 wherever fusex runs. A program that links it (the NIF, the C
 * tests, the XLA handlers' library) hands it to the runtime or calls it
 * directly; nothing below it names it.
 */
#ifndef FUSEX_CPU_H
#define FUSEX_CPU_H

#include "fusex.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const fx_backend fx_cpu_backend;

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_CPU_H */
