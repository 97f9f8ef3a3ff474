// MinGRU f32 forward variants (dev/linrec_variants).
#include "launch.cuh"

using namespace lvimpl;

void lv_register_mingru(std::vector<lv_variant> &out)
{
    constexpr int K = FX_LINREC_MINGRU;
    out.push_back({"staged8 (main)", K, 0, staged<K, float, 4, 8, 8>});
    out.push_back({"reg8", K, 0, reg<K, float, 4, 8, 8>});
    // 16-channel tiles (64-byte rows): twice the chains of tiles, each
    // twice as long in time (the thin case's look-back).
    out.push_back({"staged8 w16", K, 0, staged<K, float, 4, 4, 8>});
}
