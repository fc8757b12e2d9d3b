"""The book's ``np`` (``from hybrid import np``, ``mx.np``): hybrid's NumPy-named functions
under MXNet's module name, with NumPy's dtype names and constants. Every name here is an
alias of the one implementation (hybrid/ndarray.py, hybrid/random.py, hybrid/linalg.py);
where MXNet's np departs from NumPy, hybrid follows MXNet (docs/book.md).

    from hybrid import np, npx
    X = np.arange(12).reshape(3, 4)        # float32, as in MXNet
    isinstance(X, np.ndarray)              # True
    np.random.rand(2, 5), np.linalg.norm(X)
"""
import math as _math

import numpy as _numpy

from . import linalg, random  # noqa: F401 - np.linalg, np.random
from .ndarray import *  # noqa: F401,F403 - the NumPy-named functions
from .ndarray import NDArray
from .numpy_ops import *  # noqa: F401,F403 - more of NumPy's and the Array API's names

ndarray = NDArray  # the array class: isinstance(x, np.ndarray)

# NumPy's scalar types as dtype names: every hybrid dtype= argument accepts them, and
# comparing an array's dtype with them works as in NumPy (x.dtype == np.float32)
float16 = _numpy.float16
float32 = _numpy.float32
float64 = _numpy.float64
int8 = _numpy.int8
uint8 = _numpy.uint8
int32 = _numpy.int32
int64 = _numpy.int64
bool_ = _numpy.bool_
bool = _numpy.bool_  # noqa: A001 - NumPy 2's and the Array API's name (np.bool is np.bool_)
dtype = _numpy.dtype

pi = _math.pi
e = _math.e
inf = _math.inf
nan = _math.nan
newaxis = None
