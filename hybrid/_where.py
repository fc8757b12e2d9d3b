"""The user's source line: the innermost frame outside hybrid, compiler and runtime."""
from __future__ import annotations

import os
import sys

_ROOTS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), p)
               + os.sep for p in ("hybrid", "compiler", "runtime"))


def user_frame(depth: int = 1):
    """(filename, lineno) of the caller's caller outside the package, or None."""
    f = sys._getframe(depth)
    roots = _ROOTS
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(roots):
            return (fn, f.f_lineno)
        f = f.f_back
    return None
