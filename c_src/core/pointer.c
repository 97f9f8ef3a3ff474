#include "core/pointer.h"

#include <stdlib.h>
#include <string.h>

#include "fusex_dtype.h"

/* ---- export ---- */

static int export_ipc(const fx_tensor *t, fx_pointer *out, fx_status *st)
{
    fx_device *dev = t->device;
    fx_buffer *buf = t->buffer;
    if (!dev->backend->ipc_export)
        return fx_fail(st, FX_EBADARG,
                       "kind: expected local for a tensor on %s (ipc handles are CUDA memory), got ipc",
                       dev->label);
    if (buf->borrowed)
        return fx_fail(st, FX_EBADARG,
                       "tensor: expected a tensor allocated by fusex with ipc => true, got a view of "
                       "memory fusex does not own (from_pointer); export it where it was allocated");
    if (!buf->exportable)
        return fx_fail(st, FX_EBADARG,
                       "tensor: expected a tensor allocated with ipc => true, got pool memory; use "
                       "fusex:copy(T, Device, #{ipc => true})");
    if (dev->backend->ipc_export(dev->ordinal, buf->ptr, out->handle, st) != FX_OK)
        return st->code;
    out->offset = (int64_t)((char *)t->data - (char *)buf->ptr);
    return FX_OK;
}

int fx_op_to_pointer(const fx_tensor *t, fx_pointer_kind kind, bool sync, fx_pointer *out,
                     fx_status *st)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->size = t->nbytes;
    out->size_known = true;
    if (kind == FX_PTR_IPC) {
        if (export_ipc(t, out, st) != FX_OK)
            return st->code;
    } else {
        out->address = (uintptr_t)t->data;
    }
    fx_buffer_mark_exported(t->buffer);
    if (sync)
        return t->device->backend->synchronize(t->device->ordinal, st);
    return FX_OK;
}

/* ---- import ---- */

static void unref_owner(void *owner) { fx_buffer_unref(owner); }

typedef struct ipc_mapping {
    fx_device *device;
    void *base;
} ipc_mapping;

static void close_mapping(void *arg)
{
    ipc_mapping *m = arg;
    m->device->backend->ipc_close(m->device->ordinal, m->base);
    free(m);
}

static int expect_size(const fx_pointer *p, size_t nbytes, const char *what, fx_status *st)
{
    if (!p->size_known || p->size >= nbytes)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "pointer: expected a region of at least %zu bytes (%s), got %zu bytes",
                   nbytes, what, p->size);
}

static int expect_aligned(uintptr_t addr, fx_dtype dtype, const char *what, fx_status *st)
{
    size_t align = fx_dtype_size(dtype);
    if (addr % align == 0)
        return FX_OK;
    return fx_fail(st, FX_EBADARG, "pointer: expected %s aligned to %zu bytes (the size of %s), got 0x%llx",
                   what, align, fx_dtype_name(dtype), (unsigned long long)addr);
}

/* A local address: inside a live fusex allocation (the view then holds a
 * reference to it), inside one fusex freed (refused), or foreign (checked
 * by the backend where it can). Returns the borrowed buffer or NULL. */
static fx_buffer *borrow_local(fx_device *dev, uintptr_t addr, size_t nbytes, fx_status *st)
{
    fx_buffer *owner = NULL;
    fx_freed_range freed;
    switch (fx_registry_find(dev, addr, &owner, &freed)) {
    case FX_ADDR_LIVE: {
        uintptr_t base = (uintptr_t)owner->ptr;
        if (nbytes > owner->nbytes || addr - base > owner->nbytes - nbytes) {
            fx_fail(st, FX_EBADARG,
                    "pointer: expected %zu bytes inside the fusex allocation of %zu bytes at 0x%llx, "
                    "got an address %llu bytes into it",
                    nbytes, owner->nbytes, (unsigned long long)base, (unsigned long long)(addr - base));
            fx_buffer_unref(owner);
            return NULL;
        }
        fx_buffer *view = fx_buffer_borrow(dev, (void *)addr, nbytes, unref_owner, owner);
        if (!view) {
            fx_buffer_unref(owner);
            fx_fail(st, FX_ENOMEM, "out of host memory for a buffer record");
        }
        return view;
    }
    case FX_ADDR_FREED:
        fx_fail(st, FX_EBADARG,
                "pointer: expected live memory, got 0x%llx inside a fusex allocation of %zu bytes at "
                "0x%llx that was freed (use-after-free of its owner)",
                (unsigned long long)addr, freed.nbytes, (unsigned long long)freed.base);
        return NULL;
    default:
        break;
    }
    const fx_backend *b = dev->backend;
    if (b->pointer_check && b->pointer_check(dev->ordinal, (const void *)addr, nbytes, st) != FX_OK)
        return NULL;
    fx_buffer *view = fx_buffer_borrow(dev, (void *)addr, nbytes, NULL, NULL);
    if (!view)
        fx_fail(st, FX_ENOMEM, "out of host memory for a buffer record");
    return view;
}

static fx_buffer *borrow_ipc(fx_device *dev, const fx_pointer *p, fx_dtype dtype, size_t nbytes,
                             fx_status *st)
{
    const fx_backend *b = dev->backend;
    if (!b->ipc_open) {
        fx_fail(st, FX_EBADARG, "device: expected a CUDA device for an ipc handle, got %s", dev->label);
        return NULL;
    }
    if (p->offset < 0) {
        fx_fail(st, FX_EBADARG, "offset: expected a non-negative byte offset, got %lld",
                (long long)p->offset);
        return NULL;
    }
    if (expect_aligned((uintptr_t)p->offset, dtype, "an offset", st) != FX_OK)
        return NULL;
    ipc_mapping *m = calloc(1, sizeof *m);
    if (!m) {
        fx_fail(st, FX_ENOMEM, "out of host memory for an IPC mapping record");
        return NULL;
    }
    size_t mapped = 0;
    if (b->ipc_open(dev->ordinal, p->handle, &m->base, &mapped, st) != FX_OK) {
        free(m);
        return NULL;
    }
    m->device = dev;
    size_t offset = (size_t)p->offset;
    if (mapped && (offset > mapped || nbytes > mapped - offset)) {
        fx_fail(st, FX_EBADARG,
                "pointer: expected %zu bytes at offset %zu of the IPC allocation, got an allocation of "
                "%zu bytes",
                nbytes, offset, mapped);
        close_mapping(m);
        return NULL;
    }
    fx_buffer *view = fx_buffer_borrow(dev, (char *)m->base + offset, nbytes, close_mapping, m);
    if (!view) {
        close_mapping(m);
        fx_fail(st, FX_ENOMEM, "out of host memory for a buffer record");
    }
    return view;
}

int fx_op_from_pointer(fx_device *dev, const fx_pointer *p, fx_dtype dtype, int rank,
                       const int64_t *dims, bool sync, fx_tensor *out, fx_status *st)
{
    memset(out, 0, sizeof *out);
    int64_t numel;
    size_t nbytes;
    if (fx_shape_nbytes("shape", dtype, rank, dims, &numel, &nbytes, st) != FX_OK)
        return st->code;
    char what[200], shape[160];
    fx_format_shape(shape, sizeof shape, rank, dims);
    snprintf(what, sizeof what, "shape %s of %s", shape, fx_dtype_name(dtype));
    if (expect_size(p, nbytes, what, st) != FX_OK)
        return st->code;
    fx_buffer *buf;
    if (p->kind == FX_PTR_LOCAL) {
        if (p->address == 0)
            return fx_fail(st, FX_EBADARG, "pointer: expected a non-null address, got 0");
        if (expect_aligned(p->address, dtype, "an address", st) != FX_OK)
            return st->code;
        buf = borrow_local(dev, p->address, nbytes, st);
    } else {
        buf = borrow_ipc(dev, p, dtype, nbytes, st);
    }
    if (!buf)
        return st->code;
    if (sync && dev->backend->device_synchronize &&
        dev->backend->device_synchronize(dev->ordinal, st) != FX_OK) {
        fx_buffer_unref(buf);
        return st->code;
    }
    out->buffer = buf;
    out->data = buf->ptr;
    out->device = dev;
    out->dtype = dtype;
    out->rank = rank;
    memcpy(out->dims, dims, sizeof(int64_t) * (size_t)rank);
    out->numel = numel;
    out->nbytes = nbytes;
    return FX_OK;
}
