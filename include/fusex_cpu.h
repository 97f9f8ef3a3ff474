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

/* Callers that go away. CPU work runs on the calling thread (a dirty
 * scheduler, under the NIF). When the process that called it is killed
 * its result has nowhere to go, yet the work would hold that thread and
 * the cores for as long as it takes: two calls of minutes stalled every
 * fusex CPU op of a 2-core node. So a caller names, for the duration of a
 * call that can run long, a test of whether the one it works for is still
 * there (per thread: the thread that then runs the op); the long loops of
 * the scans poll it and give up once it says no, failing the op with
 * FX_EINTERNAL ("cancelled: ..."). Nothing is watched where no test was
 * named. */
typedef bool (*fx_alive_fn)(void *arg);
void fx_cpu_watch_caller(fx_alive_fn alive, void *arg);
void fx_cpu_unwatch_caller(void);

#ifdef __cplusplus
}
#endif

#endif /* FUSEX_CPU_H */
