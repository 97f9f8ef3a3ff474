/* Devices and launch contexts of the XLA handlers. The handlers' library
 * owns its device records (no fusex runtime runs in a JAX process, and in a
 * BEAM process the NIF's runtime is another copy, hidden from this one):
 * "cpu" with the CPU backend linked in, and "cuda:N" with the CUDA backend,
 * priv/fusex_cuda.so, loaded at the first CUDA call. The library itself is
 * plain C and C++: it needs neither nvcc nor the CUDA runtime. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "fusex_cpu.h"
#include "xla/fx_xla.h"

#define MAX_CUDA_DEVICES 16

static fx_device host_device;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static fx_device cuda_devices[MAX_CUDA_DEVICES];
static int cuda_count;
static const fx_backend *cuda_backend;
static char cuda_reason[1024] = "the CUDA backend was not loaded";
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

/* The records' accounting and pointer registry serve fusex's own buffers;
 * XLA's never enter them. */
static void host_init(void) { fx_device_init(&host_device, FX_DEVICE_CPU, 0, &fx_cpu_backend); }

/* priv/fusex_cuda.so next to this library (FUSEX_CUDA_LIB overrides). */
static int cuda_library_path(char *path, size_t len)
{
    const char *env = getenv("FUSEX_CUDA_LIB");
    if (env && *env) {
        snprintf(path, len, "%s", env);
        return 0;
    }
    Dl_info info;
    if (!dladdr((const void *)cuda_library_path, &info) || !info.dli_fname) {
        snprintf(cuda_reason, sizeof cuda_reason,
                 "cannot tell where fusex_xla.so lies to find fusex_cuda.so beside it (set FUSEX_CUDA_LIB)");
        return -1;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    int dir_len = slash ? (int)(slash - info.dli_fname) : 1;
    snprintf(path, len, "%.*s/fusex_cuda.so", dir_len, slash ? info.dli_fname : ".");
    return 0;
}

static void cuda_load(void)
{
    char path[4096];
    if (cuda_library_path(path, sizeof path))
        return;
    const fx_backend *backend;
    int count = fx_cuda_backend_open(path, &backend, cuda_reason, sizeof cuda_reason);
    if (count <= 0)
        return;
    cuda_count = count < MAX_CUDA_DEVICES ? count : MAX_CUDA_DEVICES;
    for (int i = 0; i < cuda_count; i++)
        fx_device_init(&cuda_devices[i], FX_DEVICE_CUDA, i, backend);
    cuda_backend = backend;
}

const char *fx_xla_cuda_unavailable_reason(void)
{
    pthread_once(&cuda_once, cuda_load);
    return cuda_backend ? NULL : cuda_reason;
}

int fx_xla_device(const fx_xla_call *call, fx_device **dev, fx_exec *ex, fx_status *st)
{
    memset(ex, 0, sizeof *ex);
    if (call->platform == FX_XLA_HOST) {
        pthread_once(&host_once, host_init);
        *dev = &host_device;
        return fx_cpu_backend.exec_default(0, ex, st);
    }
    const char *why = fx_xla_cuda_unavailable_reason();
    if (why)
        return fx_fail(st, FX_EBADARG, "device: expected fusex's CUDA backend for XLA's CUDA platform, got none: %s",
                       why);
    /* XLA's device ordinal is the CUDA runtime's, which is the backend's
     * own numbering (it takes every visible device in order). */
    if (call->device < 0 || call->device >= cuda_count)
        return fx_fail(st, FX_EBADARG, "device: expected a CUDA device fusex sees (0..%d), got XLA's device %d",
                       cuda_count - 1, call->device);
    *dev = &cuda_devices[call->device];
    ex->device = call->device;
    ex->stream = call->stream;
    ex->scratch = call->scratch;
    return FX_OK;
}
