"""Byte-copy primitives for numba kernels: ``memcpy`` (plain or with non-temporal stores), unaligned 8-byte loads and
16-byte copies and stores; and
atomic operations on int64 array elements (sequentially consistent), for threads that share work.

A plain ``for`` loop over uint8 elements compiles to one byte per iteration (numba's negative-index
handling keeps LLVM from widening it); these emit LLVM's memory intrinsics directly. The caller checks
bounds: nothing here does.
"""

from __future__ import annotations

import platform
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _byte_ptr(context: Any, builder: Any, arrty: Any, arr: Any, offset: Any) -> Any:
    a = context.make_array(arrty)(context, builder, arr)
    return builder.gep(a.data, [offset])


@intrinsic
def copy(typingctx: Any, dst: Any, d: Any, src: Any, s: Any, n: Any) -> Any:
    """``dst[d:d+n] = src[s:s+n]`` for uint8 arrays whose two spans do not overlap."""
    sig = types.void(dst, d, src, s, n)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        pd = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
        ps = _byte_ptr(context, builder, sig.args[2], args[2], args[3])
        cgutils.raw_memcpy(builder, pd, ps, args[4], 1)

    return sig, codegen


@intrinsic
def copy_streaming(typingctx: Any, dst: Any, d: Any, src: Any, s: Any, n: Any) -> Any:
    """``copy`` with non-temporal stores: the bytes go to memory without the destination's cache lines being
    read in first, and without evicting what the caches hold. ``dst[d]`` must be 16-byte aligned (the
    caller checks); the last ``n % 16`` bytes are copied plainly. Call ``store_fence`` before another thread
    may read what was written."""
    sig = types.void(dst, d, src, s, n)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        i64 = ir.IntType(64)
        vec = ir.VectorType(i64, 2)
        pd = _byte_ptr(context, builder, sig.args[0], args[0], args[1])
        ps = _byte_ptr(context, builder, sig.args[2], args[2], args[3])
        n = args[4]
        whole = builder.and_(n, i64(~15))
        hint = builder.module.add_metadata([ir.IntType(32)(1)])
        with cgutils.for_range_slice(builder, i64(0), whole, i64(16)) as (off, _):
            value = builder.load(builder.bitcast(builder.gep(ps, [off]), vec.as_pointer()), align=1)
            store = builder.store(value, builder.bitcast(builder.gep(pd, [off]), vec.as_pointer()), align=16)
            store.set_metadata("nontemporal", hint)
        cgutils.raw_memcpy(builder, builder.gep(pd, [whole]), builder.gep(ps, [whole]), builder.sub(n, whole), 1)

    return sig, codegen


@intrinsic
def store_fence(typingctx: Any) -> Any:
    """A full memory fence: orders ``copy_streaming``'s non-temporal stores before every later store (the
    flag another thread reads to know the copy is done)."""
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        if _X86:  # sfence: what orders non-temporal stores (a locked instruction need not)
            builder.call(builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), [])), [])
        builder.fence("seq_cst")

    return sig, codegen


@intrinsic
def load8(typingctx: Any, src: Any, s: Any) -> Any:
    """The 8 bytes ``src[s:s+8]`` as one int64 (little-endian machines), any alignment."""
    sig = types.int64(src, s)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        p = builder.bitcast(_byte_ptr(context, builder, sig.args[0], args[0], args[1]), ir.IntType(64).as_pointer())
        return builder.load(p, align=1)

    return sig, codegen


@intrinsic
def load1(typingctx: Any, src: Any, s: Any) -> Any:
    """``src[s]`` as an int64, without numba's negative-index handling."""
    sig = types.int64(src, s)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.zext(builder.load(_byte_ptr(context, builder, sig.args[0], args[0], args[1])), ir.IntType(64))

    return sig, codegen


@intrinsic
def store1(typingctx: Any, dst: Any, d: Any, value: Any) -> Any:
    """``dst[d] = value`` (the low byte of an int64), without numba's negative-index handling."""
    sig = types.void(dst, d, value)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store(builder.trunc(args[2], ir.IntType(8)), _byte_ptr(context, builder, sig.args[0], args[0], args[1]))

    return sig, codegen


def _x86_crc(name: str, width: int) -> Any:
    @intrinsic
    def crc(typingctx: Any, c: Any, data: Any) -> Any:
        sig = types.int64(types.int64, types.int64)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            i32, i64 = ir.IntType(32), ir.IntType(64)
            if width == 64:
                fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(i64, [i64, i64]))
                return builder.call(fn, [args[0], args[1]])
            fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(i32, [i32, ir.IntType(8)]))
            got = builder.call(fn, [builder.trunc(args[0], i32), builder.trunc(args[1], ir.IntType(8))])
            return builder.zext(got, i64)

        return sig, codegen

    return crc


# The SSE4.2 CRC-32C instructions: one step over 8 bytes, and over 1 byte (x86-64 only).
crc32c_u64 = _x86_crc("llvm.x86.sse42.crc32.64.64", 64)
crc32c_u8 = _x86_crc("llvm.x86.sse42.crc32.32.8", 8)


@intrinsic
def copy16(typingctx: Any, dst: Any, d: Any, src: Any, s: Any) -> Any:
    """``dst[d:d+16] = src[s:s+16]`` as one unaligned 16-byte load and store (the spans may overlap: the
    load happens first)."""
    sig = types.void(dst, d, src, s)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        i128p = ir.IntType(128).as_pointer()
        ps = builder.bitcast(_byte_ptr(context, builder, sig.args[2], args[2], args[3]), i128p)
        pd = builder.bitcast(_byte_ptr(context, builder, sig.args[0], args[0], args[1]), i128p)
        builder.store(builder.load(ps, align=1), pd, align=1)

    return sig, codegen


@intrinsic
def store16(typingctx: Any, dst: Any, d: Any, lo: Any, hi: Any) -> Any:
    """``dst[d:d+16]`` = the 8 bytes of the int64 ``lo``, then those of ``hi``: one unaligned 16-byte store."""
    sig = types.void(dst, d, types.int64, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        vec = ir.VectorType(ir.IntType(64), 2)
        i32 = ir.IntType(32)
        value = builder.insert_element(ir.Constant(vec, ir.Undefined), args[2], i32(0))
        value = builder.insert_element(value, args[3], i32(1))
        p = builder.bitcast(_byte_ptr(context, builder, sig.args[0], args[0], args[1]), vec.as_pointer())
        builder.store(value, p, align=1)

    return sig, codegen


@intrinsic
def prefetch(typingctx: Any, src: Any, s: Any) -> Any:
    """Hint the CPU to bring the cache line holding ``src[s]`` (element ``s``, of any dtype) in (for reading);
    never faults."""
    sig = types.void(src, s)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        i32 = ir.IntType(32)
        i8p = ir.IntType(8).as_pointer()
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
        p = builder.bitcast(_byte_ptr(context, builder, sig.args[0], args[0], args[1]), i8p)
        builder.call(fn, [p, i32(0), i32(3), i32(1)])

    return sig, codegen


def _slot(context: Any, builder: Any, sig: Any, args: Any) -> Any:
    a = context.make_array(sig.args[0])(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, sig.args[0], a, [args[1]])


@intrinsic
def atomic_add(typingctx: Any, ctl: Any, i: Any, v: Any) -> Any:
    """``ctl[i] += v`` atomically (int64 array); returns the value before."""
    sig = types.int64(ctl, types.intp, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.atomic_rmw("add", _slot(context, builder, sig, args), args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx: Any, ctl: Any, i: Any) -> Any:
    """``ctl[i]``, an atomic load (a loop that watches it sees other threads' stores)."""
    sig = types.int64(ctl, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.load_atomic(_slot(context, builder, sig, args), "seq_cst", 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx: Any, ctl: Any, i: Any, v: Any) -> Any:
    """``ctl[i] = v``, an atomic store."""
    sig = types.void(ctl, types.intp, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> None:
        builder.store_atomic(args[2], _slot(context, builder, sig, args), "seq_cst", 8)

    return sig, codegen
