/* The C test runner: every Check suite, on the device FUSEX_DEVICE names
 * (cpu by default). CUDA contexts do not survive fork, so GPU runs use
 * no-fork mode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusex_cpu.h"
#include "testutil.h"

int main(void)
{
    fx_status st;
    fx_status_clear(&st);
    const char *priv = getenv("FUSEX_PRIV");
    if (fx_runtime_init(priv ? priv : "priv", &fx_cpu_backend, &st) != FX_OK) {
        fprintf(stderr, "runtime init failed: %s\n", st.msg);
        return 2;
    }
    fx_device *dev = fx_test_device();
    fprintf(stderr, "fusex C tests on %s (CUDA: %s)\n", dev->label,
            fx_device_find(FX_DEVICE_CUDA, 0) ? "available" : fx_cuda_unavailable_reason());
    fx_test_seed();

    SRunner *sr = srunner_create(fx_suite_dtype());
    srunner_add_suite(sr, fx_suite_runtime());
    srunner_add_suite(sr, fx_suite_ops());
    srunner_add_suite(sr, fx_suite_pointer());
    srunner_add_suite(sr, fx_suite_optim());
    srunner_add_suite(sr, fx_suite_linrec());
    srunner_add_suite(sr, fx_suite_ssm());
    srunner_add_suite(sr, fx_suite_rnn());
    srunner_add_suite(sr, fx_suite_exec());
    srunner_add_suite(sr, fx_suite_op());
    srunner_add_suite(sr, fx_suite_linear());
    srunner_add_suite(sr, fx_suite_norm());
    srunner_add_suite(sr, fx_suite_conv());
    srunner_add_suite(sr, fx_suite_replay());
    srunner_add_suite(sr, fx_suite_model());
    srunner_add_suite(sr, fx_suite_fast());
    if (dev->kind == FX_DEVICE_CUDA)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    fx_runtime_shutdown();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
