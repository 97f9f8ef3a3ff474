/* A stand-in for XLA's FFI API (see fake_xla_api.h). */
#include "fake_xla_api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct XLA_FFI_Error {
    XLA_FFI_Error_Code code;
    char message[1024];
};

static XLA_FFI_Error *make_error(XLA_FFI_Error_Code code, const char *message)
{
    XLA_FFI_Error *err = calloc(1, sizeof *err);
    if (!err)
        abort(); /* a test fixture: nothing sensible to do */
    err->code = code;
    snprintf(err->message, sizeof err->message, "%s", message ? message : "");
    return err;
}

XLA_FFI_Error_Code fake_xla_error_code(const XLA_FFI_Error *err) { return err->code; }
const char *fake_xla_error_message(const XLA_FFI_Error *err) { return err->message; }
void fake_xla_error_free(XLA_FFI_Error *err) { free(err); }

static XLA_FFI_Error *error_create(XLA_FFI_Error_Create_Args *args)
{
    return make_error(args->errc, args->message);
}

static void error_get_message(XLA_FFI_Error_GetMessage_Args *args) { args->message = args->error->message; }

static void error_destroy(XLA_FFI_Error_Destroy_Args *args) { free(args->error); }

/* ---- registration ---- */

#define MAX_REGISTRATIONS 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static fake_registration registry[MAX_REGISTRATIONS];
static int nregistry;

static const XLA_FFI_Api *api_table(void);

/* Asks a handler for its metadata, as XLA does when it registers one. */
static XLA_FFI_Error *query_metadata(XLA_FFI_Handler *handler, XLA_FFI_Metadata *md)
{
    memset(md, 0, sizeof *md);
    md->struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
    md->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    XLA_FFI_Metadata_Extension ext;
    memset(&ext, 0, sizeof ext);
    ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
    ext.extension_base.type = XLA_FFI_Extension_Metadata;
    ext.metadata = md;
    XLA_FFI_CallFrame frame;
    memset(&frame, 0, sizeof frame);
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.extension_start = &ext.extension_base;
    frame.api = api_table();
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args.struct_size = XLA_FFI_Args_STRUCT_SIZE;
    frame.rets.struct_size = XLA_FFI_Rets_STRUCT_SIZE;
    frame.attrs.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
    return handler(&frame);
}

static XLA_FFI_Error *handler_register(XLA_FFI_Handler_Register_Args *args)
{
    char msg[2048];
    if (args->struct_size < XLA_FFI_Handler_Register_Args_STRUCT_SIZE)
        return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, "XLA_FFI_Handler_Register_Args too small");
    if (!args->bundle.execute)
        return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, "no execute handler");
    XLA_FFI_Metadata md;
    XLA_FFI_Error *err = query_metadata(args->bundle.execute, &md);
    if (err) {
        snprintf(msg, sizeof msg, "metadata query of %.*s failed: %.1000s", (int)(args->name.len % 256),
                 args->name.ptr, err->message);
        free(err);
        return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    }
    if (md.api_version.major_version != XLA_FFI_API_MAJOR || md.api_version.minor_version != XLA_FFI_API_MINOR) {
        snprintf(msg, sizeof msg,
                 "FFI handler's API version (%d.%d) is incompatible with the framework's API version (%d.%d)",
                 md.api_version.major_version, md.api_version.minor_version, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
        return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregistry; i++) {
        fake_registration *r = &registry[i];
        if (strlen(r->name) == args->name.len && memcmp(r->name, args->name.ptr, args->name.len) == 0 &&
            strlen(r->platform) == args->platform.len &&
            strncasecmp(r->platform, args->platform.ptr, args->platform.len) == 0) {
            int same = r->execute == args->bundle.execute && r->traits == args->traits;
            pthread_mutex_unlock(&lock);
            if (same)
                return NULL;
            snprintf(msg, sizeof msg, "Duplicate FFI handler registration for %.64s on platform %.16s",
                     r->name, r->platform);
            return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
        }
    }
    if (nregistry == MAX_REGISTRATIONS || args->name.len >= sizeof registry[0].name ||
        args->platform.len >= sizeof registry[0].platform) {
        pthread_mutex_unlock(&lock);
        return make_error(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "the fake registry is full");
    }
    fake_registration *r = &registry[nregistry++];
    memcpy(r->name, args->name.ptr, args->name.len);
    r->name[args->name.len] = '\0';
    memcpy(r->platform, args->platform.ptr, args->platform.len);
    r->platform[args->platform.len] = '\0';
    r->execute = args->bundle.execute;
    r->major = md.api_version.major_version;
    r->minor = md.api_version.minor_version;
    r->traits = md.traits;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int fake_xla_registrations(fake_registration *out, int max)
{
    pthread_mutex_lock(&lock);
    int n = nregistry;
    for (int i = 0; i < n && i < max; i++)
        out[i] = registry[i];
    pthread_mutex_unlock(&lock);
    return n;
}

int fake_xla_registrations_text(char *buf, int len)
{
    int used = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nregistry && used < len; i++)
        used += snprintf(buf + used, (size_t)(len - used), "%s@%s@%d.%d;", registry[i].name, registry[i].platform,
                         registry[i].major, registry[i].minor);
    pthread_mutex_unlock(&lock);
    return used < len ? used : len - 1;
}

/* ---- the execution context ---- */

static XLA_FFI_Error *stream_get(XLA_FFI_Stream_Get_Args *args)
{
    if (!args->ctx)
        return make_error(XLA_FFI_Error_Code_FAILED_PRECONDITION, "no execution context");
    args->stream = args->ctx->stream;
    return NULL;
}

static XLA_FFI_Error *device_ordinal_get(XLA_FFI_DeviceOrdinal_Get_Args *args)
{
    if (!args->ctx)
        return make_error(XLA_FFI_Error_Code_FAILED_PRECONDITION, "no execution context");
    args->device_ordinal = args->ctx->device;
    return NULL;
}

static XLA_FFI_Error *memory_allocate(XLA_FFI_DeviceMemory_Allocate_Args *args)
{
    XLA_FFI_ExecutionContext *ctx = args->ctx;
    if (!ctx || !ctx->alloc)
        return make_error(XLA_FFI_Error_Code_UNIMPLEMENTED, "no scratch allocator");
    /* As XLA: a power of two up to 16 bytes, nothing larger. */
    if (args->alignment == 0 || (args->alignment & (args->alignment - 1)) || args->alignment > 16) {
        char msg[64];
        snprintf(msg, sizeof msg, "Unsupported alignment: %zu", args->alignment);
        return make_error(XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
    }
    args->data = ctx->alloc(ctx->user, args->size, args->alignment);
    if (!args->data)
        return make_error(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, "scratch exhausted");
    ctx->allocations++;
    return NULL;
}

/* The memory stays with its owner (an arena the test resets once the
 * stream is idle): XLA's allocator is stream-ordered, so what a handler
 * frees is reused only by work enqueued after it. */
static XLA_FFI_Error *memory_free(XLA_FFI_DeviceMemory_Free_Args *args)
{
    if (args->ctx)
        args->ctx->frees++;
    return NULL;
}

static const XLA_FFI_Api *api_table(void)
{
    static const XLA_FFI_Api api = {
        .struct_size = XLA_FFI_Api_STRUCT_SIZE,
        .api_version = {.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE,
                        .major_version = XLA_FFI_API_MAJOR,
                        .minor_version = XLA_FFI_API_MINOR},
        .XLA_FFI_Error_Create = error_create,
        .XLA_FFI_Error_GetMessage = error_get_message,
        .XLA_FFI_Error_Destroy = error_destroy,
        .XLA_FFI_Handler_Register = handler_register,
        .XLA_FFI_Stream_Get = stream_get,
        .XLA_FFI_DeviceMemory_Allocate = memory_allocate,
        .XLA_FFI_DeviceMemory_Free = memory_free,
        .XLA_FFI_DeviceOrdinal_Get = device_ordinal_get,
    };
    return &api;
}

const XLA_FFI_Api *fake_xla_api(void) { return api_table(); }
