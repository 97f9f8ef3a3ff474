// The same kernels with default-policy stores of h instead of streaming
// (evict-first) ones: compiled with FX_SCAN_PLAIN_STORES and the kernels'
// namespaces renamed (see the Makefile), so nothing clashes with the other
// kernel files.
#include "launch.cuh"

using namespace lvimpl;

void lv_register_plain(std::vector<lv_variant> &out)
{
    constexpr int MG = FX_LINREC_MINGRU, SC = FX_LINREC_SCAN;
    out.push_back({"staged8 plain stores", MG, 0, staged<MG, float, 4, 8, 8>});
    out.push_back({"reg8 plain stores", SC, 0, reg<SC, float, 4, 8, 8>});
}
