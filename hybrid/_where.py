"""The user's source line: the innermost frame outside hybrid, compiler and runtime.

The eager front end asks for it on every op (the engine names it when the op fails), so it
is a short walk up the stack with one dict lookup per frame: whether a file is inside the
package is decided once per file name.
"""
from __future__ import annotations

import os
import sys

_ROOTS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
               + os.sep for p in ("hybrid", "compiler", "runtime"))
_INSIDE: dict = {}  # co_filename -> True when it is a file of the package


def _inside(filename: str) -> bool:
    inside = filename.startswith(_ROOTS)
    if len(_INSIDE) < 4096:
        _INSIDE[filename] = inside
    return inside


def user_frame(depth: int = 1):
    """(filename, lineno) of the caller's caller outside the package, or None."""
    f = sys._getframe(depth)
    inside = _INSIDE.get
    while f is not None:
        fn = f.f_code.co_filename
        flag = inside(fn)
        if flag is None:
            flag = _inside(fn)
        if not flag:
            return (fn, f.f_lineno)
        f = f.f_back
    return None
