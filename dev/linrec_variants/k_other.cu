// MinLSTM, Liquid (f32) and MinGRU bf16 forwards (dev/linrec_variants).
#include "launch.cuh"

using namespace lvimpl;

void lv_register_other(std::vector<lv_variant> &out)
{
    constexpr int ML = FX_LINREC_MINLSTM, LQ = FX_LINREC_LIQUID, MG = FX_LINREC_MINGRU;
    out.push_back({"reg5 (main)", ML, 0, reg<ML, float, 4, 8, fwd_steps<ML, float, 4>()>});
    out.push_back({"reg8 (main)", LQ, 0, reg<LQ, float, 4, 8, fwd_steps<LQ, float, 4>()>});
    out.push_back({"reg8 (main)", MG, 1, reg<MG, __nv_bfloat16, 4, 16, fwd_steps<MG, __nv_bfloat16, 4>()>});
}
