// MinGRU f32 forward variants (tools/linrec_variants).
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
    // Reduce ahead, fix up behind (the backend's choice where chains are
    // few and long: the thin case): the lead in MB of inputs, staged or in
    // registers, 16-channel tiles.
    out.push_back({"ahead staged8 16MB (thin)", K, 0, ahead<K, float, 4, 8, 8, true, 16>});
    out.push_back({"ahead staged8 8MB", K, 0, ahead<K, float, 4, 8, 8, true, 8>});
    out.push_back({"ahead staged8 32MB", K, 0, ahead<K, float, 4, 8, 8, true, 32>});
    out.push_back({"ahead reg8 16MB", K, 0, ahead<K, float, 4, 8, 8, false, 16>});
    out.push_back({"ahead staged8 w16 16MB", K, 0, ahead<K, float, 4, 4, 8, true, 16>});
}
