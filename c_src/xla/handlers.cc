// The XLA FFI binding of fusex's custom-call targets (docs/XLA.md): a Host
// and a CUDA handler for each index of the op layer's registry of
// descriptions (core/op.h), up to FX_XLA_MAX_OPS, built against the FFI API
// 0.2 headers (the XLA of EXLA 0.12-0.13 and JAX 0.9.0; newer XLAs accept
// 0.2 handlers). fx_xla_handler gives them out by index; registration
// (exports.c) names each after its description.
//
// This file is C++ only because XLA's ffi.h is: it lets XLA's own binding
// code answer the version query and decode the call frame, copies the
// operands, results and attributes into plain structs and hands them to
// the C side (targets.c), which checks them and runs the op layer. Nothing
// here computes or checks anything of fusex's.
//
// The CUDA handlers need neither nvcc nor the CUDA runtime: the stream
// arrives as a pointer, scratch from XLA's allocator, and the kernels are
// launched by priv/fusex_cuda.so, loaded at the first CUDA call.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"
#include "xla/fx_xla.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error to_error(const fx_status &st)
{
    switch (st.code) {
    case FX_OK: return ffi::Error::Success();
    case FX_EBADARG: return ffi::Error(ffi::ErrorCode::kInvalidArgument, st.msg);
    case FX_ENOMEM: return ffi::Error(ffi::ErrorCode::kResourceExhausted, st.msg);
    default: return ffi::Error(ffi::ErrorCode::kInternal, st.msg);
    }
}

ffi::Error fail(int op, const std::string &what)
{
    const char *name = fx_xla_target_name(op);
    return ffi::Error::InvalidArgument(std::string(name ? name : "fusex") + ": " + what);
}

// What XLA passed, copied into the structs targets.c reads.
struct Frame {
    fx_xla_buffer args[FX_XLA_MAX_BUFFERS];
    fx_xla_buffer rets[FX_XLA_MAX_BUFFERS];
    fx_xla_attr attrs[FX_XLA_MAX_ATTRS];
    fx_xla_call call;
};

void take_buffer(const ffi::AnyBuffer &b, fx_xla_buffer *out)
{
    out->data = b.untyped_data();
    out->type = static_cast<int>(b.element_type());
    out->rank = static_cast<int64_t>(b.dimensions().size());
    out->dims = b.dimensions().begin();
}

// Values are read by name: the 0.2 headers' Dictionary::get by iterator
// returns an index-sized integer, which would truncate a float.
template <typename T>
bool take_int(const ffi::Dictionary &attrs, const ffi::Dictionary::Iterator &it, const char *what, fx_xla_attr *a)
{
    if (!attrs.isa<T>(it))
        return false;
    auto value = attrs.get<T>(*it);
    if (!value.has_value())
        return false;
    a->kind = FX_XLA_ATTR_INT;
    a->i = static_cast<int64_t>(*value);
    a->what = what;
    return true;
}

template <typename T>
bool take_float(const ffi::Dictionary &attrs, const ffi::Dictionary::Iterator &it, const char *what, fx_xla_attr *a)
{
    if (!attrs.isa<T>(it))
        return false;
    auto value = attrs.get<T>(*it);
    if (!value.has_value())
        return false;
    a->kind = FX_XLA_ATTR_FLOAT;
    a->f = static_cast<double>(*value);
    a->what = what;
    return true;
}

void take_attr(const ffi::Dictionary &attrs, const ffi::Dictionary::Iterator &it, fx_xla_attr *a)
{
    std::string_view name = *it;
    a->name = name.data();
    a->name_len = name.size();
    a->kind = FX_XLA_ATTR_OTHER;
    a->what = attrs.isa<std::string_view>(it) ? "a string" : "an attribute that is not a scalar number";
    // u64 is left out: its values above 2^63 have no i64.
    if (take_int<int64_t>(attrs, it, "an i64", a) || take_int<int32_t>(attrs, it, "an i32", a) ||
        take_int<int16_t>(attrs, it, "an i16", a) || take_int<int8_t>(attrs, it, "an i8", a) ||
        take_int<uint32_t>(attrs, it, "a u32", a) || take_int<uint16_t>(attrs, it, "a u16", a) ||
        take_int<uint8_t>(attrs, it, "a u8", a) || take_int<bool>(attrs, it, "an i1", a) ||
        take_float<double>(attrs, it, "an f64", a) || take_float<float>(attrs, it, "an f32", a))
        return;
    if (attrs.isa<uint64_t>(it))
        a->what = "a u64";
}

std::optional<ffi::Error> unpack(int op, ffi::RemainingArgs &args, ffi::RemainingRets &rets,
                                 const ffi::Dictionary &attrs, Frame &f)
{
    std::memset(&f, 0, sizeof f);
    if (args.size() > FX_XLA_MAX_BUFFERS)
        return fail(op, "operands: expected at most " + std::to_string(FX_XLA_MAX_BUFFERS) + ", got " +
                                std::to_string(args.size()));
    if (rets.size() > FX_XLA_MAX_BUFFERS)
        return fail(op, "results: expected at most " + std::to_string(FX_XLA_MAX_BUFFERS) + ", got " +
                                std::to_string(rets.size()));
    if (attrs.size() > FX_XLA_MAX_ATTRS)
        return fail(op, "attributes: expected at most " + std::to_string(FX_XLA_MAX_ATTRS) + ", got " +
                                std::to_string(attrs.size()));
    for (size_t i = 0; i < args.size(); i++) {
        auto b = args.get<ffi::AnyBuffer>(i);
        if (!b.has_value())
            return fail(op, "operand " + std::to_string(i) + ": expected an array, got another kind of operand");
        take_buffer(*b, &f.args[i]);
    }
    for (size_t i = 0; i < rets.size(); i++) {
        auto b = rets.get<ffi::AnyBuffer>(i);
        if (!b.has_value())
            return fail(op, "result " + std::to_string(i) + ": expected an array, got another kind of result");
        take_buffer(**b, &f.rets[i]);
    }
    int n = 0;
    for (auto it = attrs.begin(); it != attrs.end(); ++it)
        take_attr(attrs, it, &f.attrs[n++]);
    f.call.op = op;
    f.call.nargs = static_cast<int>(args.size());
    f.call.nrets = static_cast<int>(rets.size());
    f.call.nattrs = n;
    f.call.args = f.args;
    f.call.rets = f.rets;
    f.call.attrs = f.attrs;
    return std::nullopt;
}

ffi::Error run(const fx_xla_call &call)
{
    fx_status st;
    fx_status_clear(&st);
    fx_xla_run(&call, &st);
    return to_error(st);
}

ffi::Error host_run(int op, ffi::RemainingArgs &args, ffi::RemainingRets &rets, const ffi::Dictionary &attrs)
{
    Frame f;
    if (auto err = unpack(op, args, rets, attrs, f))
        return *err;
    f.call.platform = FX_XLA_HOST;
    return run(f.call);
}

// XLA's scratch allocator as an fx_scratch: it gives back what it handed
// out when the handler returns (stream-ordered), so release is NULL.
struct Scratch {
    ffi::ScratchAllocator *xla;
    int device;
};

// XLA refuses alignments above 16 bytes ("Unsupported alignment"); fusex's
// launchers want FX_SCRATCH_ALIGN. So each piece asks for that much more
// and starts at the first aligned byte (XLA frees by its own pointer).
constexpr size_t kXlaAlign = 16;

int scratch_alloc(void *ctx, size_t nbytes, void **ptr, fx_status *st)
{
    auto *s = static_cast<Scratch *>(ctx);
    if (nbytes > SIZE_MAX - FX_SCRATCH_ALIGN)
        return fx_fail(st, FX_ENOMEM, "scratch: %zu bytes do not fit a size", nbytes);
    std::optional<void *> got = s->xla->Allocate(nbytes + FX_SCRATCH_ALIGN - kXlaAlign, kXlaAlign);
    if (!got.has_value() || !*got)
        return fx_fail(st, FX_ENOMEM, "scratch: XLA's allocator could not give %zu bytes on cuda:%d", nbytes,
                       s->device);
    auto start = reinterpret_cast<uintptr_t>(*got);
    start = (start + FX_SCRATCH_ALIGN - 1) / FX_SCRATCH_ALIGN * FX_SCRATCH_ALIGN;
    *ptr = reinterpret_cast<void *>(start);
    return FX_OK;
}

ffi::Error cuda_run(int op, void *stream, int32_t device, ffi::ScratchAllocator &scratch,
                    ffi::RemainingArgs &args, ffi::RemainingRets &rets, const ffi::Dictionary &attrs)
{
    Frame f;
    if (auto err = unpack(op, args, rets, attrs, f))
        return *err;
    Scratch s{&scratch, device};
    f.call.platform = FX_XLA_CUDA;
    f.call.device = device;
    f.call.stream = stream;
    f.call.scratch.alloc = scratch_alloc;
    f.call.scratch.release = nullptr;
    f.call.scratch.ctx = &s;
    return run(f.call);
}

// What XLA calls: one function per index and platform (a call frame does
// not say which target it is for), each binding once. The implementations
// are passed as function pointers, so the binding's machinery is
// instantiated once per platform, not once per index.
template <int Op>
ffi::Error host_impl(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs)
{
    return host_run(Op, args, rets, attrs);
}

template <int Op>
ffi::Error cuda_impl(void *stream, int32_t device, ffi::ScratchAllocator scratch, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, ffi::Dictionary attrs)
{
    return cuda_run(Op, stream, device, scratch, args, rets, attrs);
}

using HostImpl = ffi::Error (*)(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary);
using CudaImpl = ffi::Error (*)(void *, int32_t, ffi::ScratchAllocator, ffi::RemainingArgs, ffi::RemainingRets,
                                ffi::Dictionary);

template <int Op>
XLA_FFI_Error *host_entry(XLA_FFI_CallFrame *frame)
{
    static auto *handler =
        ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs().To(HostImpl{host_impl<Op>}).release();
    return handler->Call(frame);
}

template <int Op>
XLA_FFI_Error *cuda_entry(XLA_FFI_CallFrame *frame)
{
    static auto *handler = ffi::Ffi::Bind()
                               .Ctx<ffi::PlatformStream<void *>>()
                               .Ctx<ffi::DeviceOrdinal>()
                               .Ctx<ffi::ScratchAllocator>()
                               .RemainingArgs()
                               .RemainingRets()
                               .Attrs()
                               .To(CudaImpl{cuda_impl<Op>})
                               .release();
    return handler->Call(frame);
}

template <int... Op>
constexpr std::array<XLA_FFI_Handler *, sizeof...(Op)> host_table(std::integer_sequence<int, Op...>)
{
    return {&host_entry<Op>...};
}

template <int... Op>
constexpr std::array<XLA_FFI_Handler *, sizeof...(Op)> cuda_table(std::integer_sequence<int, Op...>)
{
    return {&cuda_entry<Op>...};
}

constexpr auto kHostHandlers = host_table(std::make_integer_sequence<int, FX_XLA_MAX_OPS>{});
constexpr auto kCudaHandlers = cuda_table(std::make_integer_sequence<int, FX_XLA_MAX_OPS>{});

} // namespace

extern "C" void *fx_xla_handler(int op, int platform)
{
    if (op < 0 || op >= FX_XLA_MAX_OPS)
        return nullptr;
    switch (platform) {
    case FX_XLA_HOST: return reinterpret_cast<void *>(kHostHandlers[op]);
    case FX_XLA_CUDA: return reinterpret_cast<void *>(kCudaHandlers[op]);
    default: return nullptr;
    }
}
