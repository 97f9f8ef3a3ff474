// MinGRU f32 forward variants (tools/linrec_variants).
#include "launch.cuh"

using namespace lvimpl;

void lv_register_mingru(std::vector<lv_variant> &out)
{
    constexpr int K = FX_LINREC_MINGRU;
    out.push_back({"staged8 (main)", K, 0, staged<K, float, 4, 8, 8>});
    out.push_back({"reg8", K, 0, reg<K, float, 4, 8, 8>});
    out.push_back({"pipe4 keep", K, 0, pipe<K, float, 4, 8, 4, kKeepRegs>});
    out.push_back({"pipe4 recompute", K, 0, pipe<K, float, 4, 8, 4, kRecompute>});
    out.push_back({"pipe4 slots", K, 0, pipe<K, float, 4, 8, 4, kKeepSlots>});
    out.push_back({"pipe2 slots", K, 0, pipe<K, float, 4, 8, 2, kKeepSlots>});
    out.push_back({"pipe4 slots w16", K, 0, pipe<K, float, 4, 4, 4, kKeepSlots>});
}
