"""The device helpers every generated CUDA source starts with (C text).

One implementation for the GPU and the emulator alike (no CUDA-only intrinsics where the
result matters), so the emulator tests the very code a GPU runs:

- float16 as IEEE bits: ``hyb_h2f``, ``hyb_f2h`` and ``hyb_d2h`` (round to nearest even,
  NaN payloads kept as NumPy keeps them), ``hyb_rh`` (round a float to float16);
- NumPy's NaN-propagating maximum/minimum (``hyb_fmax``, ``hyb_fmin``) and floored
  division/modulo for floats (npy_divmod) and integers (``x // 0 == x % 0 == 0``, wrapping
  ``MIN // -1``), integer powers by squaring (``hyb_ipow``; a negative exponent gives
  1 / x**|y| truncated, as the scalar protocol says);
- ``hyb_shfl_down``: __shfl_down_sync for every register type (bool and 8-bit integers
  through int);
- ``HYB_DYNAMIC_SHARED``: dynamic shared memory (the emulation header defines its own).
"""
from __future__ import annotations

_HALF = r"""
__device__ __forceinline__ float hyb_h2f(unsigned short h) {
    const unsigned sign = ((unsigned)h & 0x8000u) << 16;
    const unsigned e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0) return __uint_as_float(__float_as_uint((float)m * 0x1p-24f) | sign);
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short hyb_f2h(float f) {
    const unsigned x = __float_as_uint(f);
    const unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {  /* NaN: the payload's top bits, still a NaN */
        unsigned r = 0x7c00u + ((ax & 0x7fffffu) >> 13);
        return (unsigned short)(sign | (r == 0x7c00u ? 0x7c01u : r));
    }
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  /* rounds to inf */
    if (ax < 0x38800000u)  /* a float16 subnormal: m * 2^-24, m rounded to even */
        return (unsigned short)(sign | (unsigned)rintf(__uint_as_float(ax) * 0x1p24f));
    const unsigned r = ax - 0x38000000u;
    return (unsigned short)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
__device__ __forceinline__ unsigned short hyb_d2h(double d) {
    const unsigned long long x = (unsigned long long)__double_as_longlong(d);
    const unsigned sign = (unsigned)(x >> 48) & 0x8000u;
    const unsigned long long ax = x & 0x7fffffffffffffffULL;
    if (ax > 0x7ff0000000000000ULL) {
        unsigned r = 0x7c00u + (unsigned)((ax & 0xfffffffffffffULL) >> 42);
        return (unsigned short)(sign | (r == 0x7c00u ? 0x7c01u : r));
    }
    if (ax >= 0x40effe0000000000ULL) return (unsigned short)(sign | 0x7c00u);
    if (ax < 0x3f10000000000000ULL)
        return (unsigned short)(sign |
                                (unsigned)rint(__longlong_as_double((long long)ax) * 0x1p24));
    const unsigned long long r = ax - 0x3f00000000000000ULL;
    return (unsigned short)(sign | (unsigned)((r + 0x1ffffffffffULL + ((r >> 42) & 1ULL)) >> 42));
}
__device__ __forceinline__ float hyb_rh(float f) { return hyb_h2f(hyb_f2h(f)); }
"""

_FLOAT_TEMPLATE = r"""
__device__ __forceinline__ T hyb_fmax(T x, T y) { return (x != x || x > y) ? x : y; }
__device__ __forceinline__ T hyb_fmin(T x, T y) { return (x != x || x < y) ? x : y; }
__device__ __forceinline__ T hyb_mod(T a, T b) {
    T mod = fmodS(a, b);
    if (b == (T)0) return mod;
    if (mod != (T)0) {
        if ((b < (T)0) != (mod < (T)0)) mod += b;
    } else {
        mod = copysignS((T)0, b);
    }
    return mod;
}
__device__ __forceinline__ T hyb_floordiv(T a, T b) {
    if (b == (T)0) return a / b;
    const T mod = fmodS(a, b);
    T div = (a - mod) / b;
    if (mod != (T)0 && ((b < (T)0) != (mod < (T)0))) div -= (T)1;
    if (div == (T)0) return copysignS((T)0, a / b);
    T fl = floorS(div);
    if (div - fl > (T)0.5) fl += (T)1;
    return fl;
}
"""

_SIGNED_TEMPLATE = r"""
__device__ __forceinline__ T hyb_floordiv(T x, T y) {
    if (y == 0) return 0;
    if (y == (T)-1) return (T)(0u - (U)x);
    T q = (T)(x / y);
    const T r = (T)(x % y);
    if (r != 0 && ((r < 0) != (y < 0))) q = (T)(q - 1);
    return q;
}
__device__ __forceinline__ T hyb_mod(T x, T y) {
    if (y == 0 || y == (T)-1) return 0;
    T r = (T)(x % y);
    if (r != 0 && ((r < 0) != (y < 0))) r = (T)(r + y);
    return r;
}
__device__ __forceinline__ T hyb_ipow(T x, T y) {
    if (y < 0) return x == 1 ? (T)1 : (x == (T)-1 ? ((y & 1) ? (T)-1 : (T)1) : (T)0);
    U acc = 1u, base = (U)x;
    for (U e = (U)y; e != 0u; e >>= 1) {
        if (e & 1u) acc = (U)(acc * base);
        base = (U)(base * base);
    }
    return (T)acc;
}
"""

_UNSIGNED_TEMPLATE = r"""
__device__ __forceinline__ T hyb_floordiv(T x, T y) { return y == 0u ? (T)0 : (T)(x / y); }
__device__ __forceinline__ T hyb_mod(T x, T y) { return y == 0u ? (T)0 : (T)(x % y); }
__device__ __forceinline__ T hyb_ipow(T x, T y) {
    U acc = 1u, base = (U)x;
    for (U e = (U)y; e != 0u; e >>= 1) {
        if (e & 1u) acc = (U)(acc * base);
        base = (U)(base * base);
    }
    return (T)acc;
}
"""

# __shfl_down_sync for every register type: bool and 8-bit integers travel as int
_SHUFFLE_TYPES = (("float", None), ("double", None), ("int", None), ("long long", None),
                  ("unsigned long long", None), ("bool", "!= 0"), ("signed char", "cast"),
                  ("unsigned char", "cast"))


def _shuffles() -> str:
    lines = []
    for t, how in _SHUFFLE_TYPES:
        v = "v" if how is None else "(int)v"
        call = f"__shfl_down_sync(0xffffffffu, {v}, d)"
        if how == "!= 0":
            call = f"{call} != 0"
        elif how == "cast":
            call = f"({t}){call}"
        lines.append(f"__device__ __forceinline__ {t} hyb_shfl_down({t} v, int d) {{\n"
                     f"    return {call};\n}}")
    return "\n".join(lines)


def _instantiate(template: str, **names) -> str:
    text = template
    for k, v in names.items():
        text = text.replace(k, v)
    return text


def prelude() -> str:
    parts = ["// ---- hybrid CUDA prelude ----",
             "#ifndef HYBRID_EMULATE",
             "#define HYB_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]",
             "#endif",
             _HALF.strip("\n")]
    for t, s in (("float", "f"), ("double", "")):
        parts.append(_instantiate(_FLOAT_TEMPLATE, fmodS=f"fmod{s}", copysignS=f"copysign{s}",
                                  floorS=f"floor{s}", T=t).strip("\n"))
    for t, u in (("signed char", "unsigned"), ("int", "unsigned"),
                 ("long long", "unsigned long long")):
        parts.append(_instantiate(_SIGNED_TEMPLATE, U=u, T=t).strip("\n"))
    for t, u in (("unsigned char", "unsigned"), ("unsigned long long", "unsigned long long")):
        parts.append(_instantiate(_UNSIGNED_TEMPLATE, U=u, T=t).strip("\n"))
    parts.append(_shuffles())
    return "\n".join(parts) + "\n"
