// The entries of a family's ops table (c_src/cuda/<family>.cu): what every
// op does before its launcher, written once. An op is described by a
// struct OP:
//
//   struct Forward : OpEntry<fx_linrec_fwd_args> {
//       static constexpr const char *kWhat = "linrec forward";   // its name in messages
//       static fx_dtype type(const Args *a) { return a->p.dtype; } // the type that picks the launcher
//       template <typename T> static int launch(const Run &r, const Args *a, fx_status *st)
//       {
//           return forward<T>(r, a, st);                          // <family>/launchers.cuh
//       }
//   };
//
// and may also say, where OpEntry's defaults do not fit:
//
//   static int check(const Args *, fx_status *);
//       limits of the family's kernels that the op layer does not know
//       (the selective scan's dimensions below 2^31); default: none;
//   template <typename T> static size_t scratch(const fx_exec *, const Args *);
//       the most scratch bytes the launcher for T asks of the context, from
//       the shapes alone (SIZE_MAX when that does not fit); default: none.
//
// The table then holds `entry<Forward>` and `scratch_entry<Forward>`. The
// launchers are instantiated for the float types a family computes in f32
// (FX_DISPATCH_FLOAT: f32, bf16, f16); a launcher that takes a second
// type (a weight type, a gradient type) dispatches it itself.
#ifndef FX_CUDA_ENTRY_CUH
#define FX_CUDA_ENTRY_CUH

#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"

namespace fx::cuda {

template <class ARGS> struct OpEntry {
    typedef ARGS Args;
    static int check(const Args *, fx_status *) { return FX_OK; }
    template <typename T> static size_t scratch(const fx_exec *, const Args *) { return 0; }
};

// An op's slot: ex entered (its device made current; its record, the
// caller's stream and scratch in a Run), OP::check, then OP::launch<T>
// for the arguments' type.
template <class OP> int entry(const fx_exec *ex, const typename OP::Args *a, fx_status *st)
{
    Run r;
    if (enter(ex, &r, st) || OP::check(a, st))
        return st->code;
    return FX_DISPATCH_FLOAT(T, OP::type(a), OP::kWhat, st, [&] { return OP::template launch<T>(r, a, st); });
}

// An op's scratch query: OP::scratch<T> for the arguments' type. A type
// with no kernel asks for none (the op itself then fails with the message).
template <class OP> size_t scratch_entry(const fx_exec *ex, const typename OP::Args *a)
{
    size_t bytes = 0;
    fx_status st;
    fx_status_clear(&st);
    (void)FX_DISPATCH_FLOAT(T, OP::type(a), OP::kWhat, &st, [&] {
        bytes = OP::template scratch<T>(ex, a);
        return (int)FX_OK;
    });
    return bytes;
}

} // namespace fx::cuda

#endif
