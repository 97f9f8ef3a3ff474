// A stand-in for EXLA's libxla_extension.so: exports XLA's C++ accessor of
// its FFI API, xla::ffi::GetXlaFfiApi() (EXLA's own plugins call it), over
// the fake API of fake_xla_api.c, whose registrations the test reads back.
#include "fake_xla_api.h"

namespace xla::ffi {
__attribute__((visibility("default"))) const XLA_FFI_Api *GetXlaFfiApi() { return fake_xla_api(); }
} // namespace xla::ffi
