/* Runs the ssm Check suite with "cuda:0" standing for the emulated CUDA
 * kernels: the CPU backend's memory and tensor ops, the CUDA backend's
 * selective scan kernels (tools/ssm_emu). test_ssm.c is compiled with
 * fx_test_device renamed to emu_test_device, so its CUDA branches run:
 * every result is compared against the CPU backend on the same inputs. */
#include <stdio.h>
#include <stdlib.h>

#include "fusex_ssm.h"
#include "testutil.h"

#include "fusex_cpu.h"
extern const struct fx_ssm_ops fx_emu_ssm_ops;
static fx_backend emu_backend;
static fx_device emu_device;

fx_device *emu_test_device(void) { return &emu_device; }

int main(void)
{
    fx_status st;
    fx_status_clear(&st);
    setenv("FUSEX_DISABLE_CUDA", "1", 1);
    if (fx_runtime_init("priv", &fx_cpu_backend, &st) != FX_OK) {
        fprintf(stderr, "runtime init failed: %s\n", st.msg);
        return 2;
    }
    emu_backend = fx_cpu_backend;
    emu_backend.name = "cuda (emulated)";
    emu_backend.ssm = &fx_emu_ssm_ops;
    emu_device.kind = FX_DEVICE_CUDA;
    emu_device.ordinal = 0;
    snprintf(emu_device.label, sizeof emu_device.label, "cuda:0");
    emu_device.backend = &emu_backend;
    atomic_init(&emu_device.allocated, 0);
    atomic_init(&emu_device.peak, 0);
    atomic_init(&emu_device.live_tensors, 0);
    fprintf(stderr, "fusex ssm Check suite on the CUDA kernels, emulated on the CPU\n");
    fx_test_seed();
    SRunner *sr = srunner_create(fx_suite_ssm());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
