/*
 * A stand-in for XLA's FFI API (c_api.h, API 0.2), enough to register
 * handlers and call them as XLA does, without XLA:
 *  - registration: like XLA, it asks each handler for its metadata (the
 *    FFI API version it was built against, its traits) through a call frame
 *    with the metadata extension, refuses one of another API version, and
 *    refuses a second, different handler under a name and platform;
 *  - calls: an execution context with a stream, a device ordinal and a
 *    scratch allocator whose memory the caller supplies (host memory, or
 *    CUDA memory freed only after the stream is synchronized, as XLA's
 *    stream-ordered allocator would);
 *  - errors with a code and a message.
 * Used by the C-level handler test (test/xla/ffi_call_test.c) and, built
 * into a stand-in libxla_extension.so, by the Common Test suite of
 * fusex:xla_register/0,1.
 */
#ifndef FAKE_XLA_API_H
#define FAKE_XLA_API_H

#include <stddef.h>
#include <stdint.h>

#include "xla/ffi/api/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

const XLA_FFI_Api *fake_xla_api(void);

typedef struct fake_registration {
    char name[64];
    char platform[16];
    XLA_FFI_Handler *execute;
    int major, minor; /* the handler's FFI API version */
    unsigned traits;
} fake_registration;

/* The registrations so far (at most `max` copied); their count. */
int fake_xla_registrations(fake_registration *out, int max);
/* "name@platform@0.2;..." for the Erlang test; the length written. */
int fake_xla_registrations_text(char *buf, int len);

/* What a call runs with (XLA's execution context is opaque to handlers). */
struct XLA_FFI_ExecutionContext {
    void *stream;
    int32_t device;
    /* Scratch: `alloc` gives `size` bytes on `align`, NULL when it cannot. */
    void *(*alloc)(void *user, size_t size, size_t align);
    void *user;
    int allocations, frees;
};

/* An error's code and message (for the tests to read). */
XLA_FFI_Error_Code fake_xla_error_code(const XLA_FFI_Error *err);
const char *fake_xla_error_message(const XLA_FFI_Error *err);
void fake_xla_error_free(XLA_FFI_Error *err);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_XLA_API_H */
