// MinLSTM, Liquid (f32) and MinGRU bf16 forward variants (tools/linrec_variants).
#include "launch.cuh"

using namespace lvimpl;

void lv_register_other(std::vector<lv_variant> &out)
{
    constexpr int ML = FX_LINREC_MINLSTM, LQ = FX_LINREC_LIQUID, MG = FX_LINREC_MINGRU;
    out.push_back({"reg5 (main)", ML, 0, reg<ML, float, 4, 8, fwd_steps<ML, float, 4>()>});
    out.push_back({"pipe2 keep", ML, 0, pipe<ML, float, 4, 8, 2, kKeepRegs>});
    out.push_back({"pipe2 slots", ML, 0, pipe<ML, float, 4, 8, 2, kKeepSlots>});
    out.push_back({"reg8 (main)", LQ, 0, reg<LQ, float, 4, 8, fwd_steps<LQ, float, 4>()>});
    out.push_back({"pipe8 recompute", LQ, 0, pipe<LQ, float, 4, 8, 8, kRecompute>});
    out.push_back({"pipe4 recompute", LQ, 0, pipe<LQ, float, 4, 8, 4, kRecompute>});
    out.push_back({"reg8 (main)", MG, 1, reg<MG, __nv_bfloat16, 4, 16, fwd_steps<MG, __nv_bfloat16, 4>()>});
    out.push_back({"pipe7 recompute", MG, 1, pipe<MG, __nv_bfloat16, 4, 16, 7, kRecompute>});
    out.push_back({"pipe8 recompute", MG, 1, pipe<MG, __nv_bfloat16, 4, 16, 8, kRecompute>});
    out.push_back({"pipe4 recompute", MG, 1, pipe<MG, __nv_bfloat16, 4, 16, 4, kRecompute>});
    out.push_back({"pipe2 keep", MG, 1, pipe<MG, __nv_bfloat16, 4, 16, 2, kKeepRegs>});
}
