// Generic linear scan f32 forward variants (dev/linrec_variants).
#include "launch.cuh"

using namespace lvimpl;

void lv_register_scan(std::vector<lv_variant> &out)
{
    constexpr int K = FX_LINREC_SCAN;
    out.push_back({"reg8 (main)", K, 0, reg<K, float, 4, 8, 8>});
    out.push_back({"staged8", K, 0, staged<K, float, 4, 8, 8>});
}
