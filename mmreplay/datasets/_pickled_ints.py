"""Read a pickled set of integers without unpickling it.

Newer Dopamine versions save ``episode_end_indices`` (a Python set of ring
slots, often numpy ``int64`` scalars) with ``pickle.dump``. A dataset is
untrusted input and ``pickle.load`` runs whatever the file says, so this
module never calls it: it walks the opcode stream with ``pickletools.genops``
(which only decodes opcodes) on a tiny stack machine that knows a handful of
opcodes and a few names (``set``, ``frozenset``, ``list``, numpy's ``scalar``
and ``dtype``, and the ``_codecs.encode`` old protocols spell bytes with), which
it interprets itself — nothing is imported or called. Any
other content is refused.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import Any

import numpy as np

_ALLOWED_GLOBALS = {
    ("builtins", "set"): "set", ("__builtin__", "set"): "set",
    ("builtins", "frozenset"): "frozenset", ("__builtin__", "frozenset"): "frozenset",
    ("builtins", "list"): "list", ("__builtin__", "list"): "list",
    ("numpy.core.multiarray", "scalar"): "scalar", ("numpy._core.multiarray", "scalar"): "scalar",
    ("numpy", "dtype"): "dtype",
    ("_codecs", "encode"): "encode",  # how protocols 0-2 spell a bytes object (the scalar's raw bytes)
}
_INTS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_TEXT = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}
_BYTES = {"BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"}


@dataclass(frozen=True)
class _Name:
    what: str


@dataclass
class _Dtype:
    descr: str
    order: str = "<"


class _Mark:
    pass


def read_int_set(data: bytes, where: str) -> list[int]:
    """The sorted integers of a pickled set/frozenset/list/tuple of ints (or numpy integer scalars).

    Raises ``ValueError`` naming ``where`` for anything else.
    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}

    def fail(why: str) -> ValueError:
        return ValueError(f"{where}: not a pickled set of integers ({why}); refusing to read it")

    def pop_mark() -> list[Any]:
        for i in range(len(stack) - 1, -1, -1):
            if isinstance(stack[i], _Mark):
                items = stack[i + 1:]
                del stack[i:]
                return items
        raise fail("unbalanced MARK")

    try:
        for op, raw_arg, _ in pickletools.genops(data):
            name = op.name
            arg: Any = raw_arg
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                break
            if name in _INTS:
                stack.append(int(arg))
            elif name in _TEXT:
                stack.append(str(arg))
            elif name in _BYTES:
                stack.append(bytes(arg))
            elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
                stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
            elif name == "MARK":
                stack.append(_Mark())
            elif name == "EMPTY_SET":
                stack.append(set())
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(name[-1])
                items = stack[-k:]
                del stack[-k:]
                stack.append(tuple(items))
            elif name == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif name == "LIST":
                stack.append(pop_mark())
            elif name == "FROZENSET":
                stack.append(frozenset(pop_mark()))
            elif name == "ADDITEMS":
                items = pop_mark()
                if not isinstance(stack[-1], set):
                    raise fail("ADDITEMS without a set")
                stack[-1].update(items)
            elif name == "APPENDS":
                items = pop_mark()
                if not isinstance(stack[-1], list):
                    raise fail("APPENDS without a list")
                stack[-1].extend(items)
            elif name == "APPEND":
                item = stack.pop()
                if not isinstance(stack[-1], list):
                    raise fail("APPEND without a list")
                stack[-1].append(item)
            elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[int(arg)])
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                if name == "GLOBAL":
                    module, _, attr = str(arg).partition(" ")
                else:
                    attr = stack.pop()
                    module = stack.pop()
                what = _ALLOWED_GLOBALS.get((module, attr))
                if what is None:
                    raise fail(f"refers to {module}.{attr}")
                stack.append(_Name(what))
            elif name == "REDUCE":
                args = stack.pop()
                fn = stack.pop()
                stack.append(_apply(fn, args, fail))
            elif name == "BUILD":
                state = stack.pop()
                obj = stack[-1]
                if not isinstance(obj, _Dtype) or not isinstance(state, tuple) or len(state) < 2:
                    raise fail("unexpected object state")
                obj.order = str(state[1])
            else:
                raise fail(f"opcode {name}")
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(where):
            raise
        raise fail(str(exc) or type(exc).__name__) from None
    if len(stack) != 1 or not isinstance(stack[0], (set, frozenset, list, tuple)):
        raise fail("the top object is not a collection")
    values = list(stack[0])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise fail("holds something other than integers")
    return sorted(values)


def _apply(fn: Any, args: Any, fail: Any) -> Any:
    if not isinstance(fn, _Name) or not isinstance(args, tuple):
        raise fail("unexpected call")
    if fn.what in ("set", "frozenset", "list"):
        items = args[0] if args else []
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise fail(f"{fn.what}() of a non-collection")
        return {"set": set, "frozenset": frozenset, "list": list}[fn.what](items)
    if fn.what == "encode":
        if len(args) != 2 or not isinstance(args[0], str) or args[1] != "latin1":
            raise fail("unexpected encode()")
        return args[0].encode("latin1")
    if fn.what == "dtype":
        if not args or not isinstance(args[0], str):
            raise fail("dtype() without a type string")
        return _Dtype(args[0])
    # numpy scalar: (dtype, raw bytes) -> int, for integer dtypes only
    if len(args) != 2 or not isinstance(args[0], _Dtype) or not isinstance(args[1], bytes):
        raise fail("unexpected numpy scalar")
    dt = np.dtype(args[0].descr).newbyteorder("<" if args[0].order in ("<", "|", "=") else ">")
    if dt.kind not in "iu" or len(args[1]) != dt.itemsize:
        raise fail(f"numpy scalar of dtype {dt}")
    return int(np.frombuffer(args[1], dt)[0])
