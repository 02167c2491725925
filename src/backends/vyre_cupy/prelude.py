"""The CUDA C helper prelude every generated kernel starts with.

Each helper implements one rule of the IR semantics (``ir.md``, "Semantics")
exactly, so the kernel body is a plain sequence of helper calls and C
operators whose meaning never depends on C's undefined or
implementation-defined corners (signed overflow, shifts by 32, division by
zero, float-to-int overflow). F32 arithmetic goes through the ``_rn``
intrinsics, so even a build with ``--fmad=true`` could not contract it, and the
transcendentals are evaluated in binary64 and rounded once to binary32, the
way the numpy reference computes them.

The prelude sits behind an include guard, so several generated kernels can be
concatenated into one translation unit (the test suite compiles the whole
conformance corpus in one ``nvcc`` or ``g++`` invocation).

Three memory-access macros are hooks for the CPU emulation harness (see
``docs/cuda.md``); on a GPU they are the plain access they name:

- ``VY_LOAD(p)`` reads ``*p``;
- ``VY_STORE(p, v)`` writes ``*p = v``;
- ``VY_ATOMIC(p)`` is the address handed to an atomic.
"""

from __future__ import annotations

import blake3

from vyre_async.abc import public_dir as _public_dir

__all__ = ["PRELUDE", "PRELUDE_DIGEST", "PRELUDE_VERSION"]
__dir__ = _public_dir(__name__)

#: The prelude's revision, for people (its comment line and `CODEGEN_VERSION`); the
#: cache identity follows `PRELUDE_DIGEST`, so an edit without a bump is still a miss.
PRELUDE_VERSION = 1

PRELUDE = r"""#ifndef VYRE_CUDA_PRELUDE
#define VYRE_CUDA_PRELUDE 1
/* vyre_cupy prelude v1: exact IR semantics (ir.md). Generated code; do not edit. */
#ifndef VY_LOAD
#define VY_LOAD(p) (*(p))
#endif
#ifndef VY_STORE
#define VY_STORE(p, v) ((void)(*(p) = (v)))
#endif
#ifndef VY_ATOMIC
#define VY_ATOMIC(p) (p)
#endif
#define VY_FN __device__ __forceinline__

/* u32: x / 0 = 0xFFFFFFFF, x % 0 = 0. */
VY_FN unsigned vy_div_u32(unsigned a, unsigned b) { return b == 0u ? 0xFFFFFFFFu : a / b; }
VY_FN unsigned vy_mod_u32(unsigned a, unsigned b) { return b == 0u ? 0u : a % b; }
VY_FN unsigned vy_min_u32(unsigned a, unsigned b) { return a < b ? a : b; }
VY_FN unsigned vy_max_u32(unsigned a, unsigned b) { return a < b ? b : a; }
/* Shift counts use the low 5 bits; shr is logical on u32, arithmetic on i32. */
VY_FN unsigned vy_shl_u32(unsigned a, unsigned b) { return a << (b & 31u); }
VY_FN unsigned vy_shr_u32(unsigned a, unsigned b) { return a >> (b & 31u); }
/* i32 add/sub/mul/neg wrap modulo 2^32 (computed on the bit patterns). */
VY_FN int vy_add_i32(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
VY_FN int vy_sub_i32(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
VY_FN int vy_mul_i32(int a, int b) { return (int)((unsigned)a * (unsigned)b); }
VY_FN int vy_neg_i32(int a) { return (int)(0u - (unsigned)a); }
/* i32: C truncation; x / 0 = 0, x % 0 = 0, INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0. */
VY_FN int vy_div_i32(int a, int b) {
  if (b == 0) return 0;
  if (b == -1) return vy_neg_i32(a);
  return a / b;
}
VY_FN int vy_mod_i32(int a, int b) { return (b == 0 || b == -1) ? 0 : a % b; }
VY_FN int vy_min_i32(int a, int b) { return a < b ? a : b; }
VY_FN int vy_max_i32(int a, int b) { return a < b ? b : a; }
VY_FN int vy_shl_i32(int a, int b) { return (int)((unsigned)a << ((unsigned)b & 31u)); }
VY_FN int vy_shr_i32(int a, int b) { return a >> ((unsigned)b & 31u); }
/* Bit counts on the 32-bit pattern; clz(0) = ctz(0) = 32. */
VY_FN unsigned vy_popc(unsigned a) { return (unsigned)__popc(a); }
VY_FN unsigned vy_clz(unsigned a) { return (unsigned)__clz((int)a); }
VY_FN unsigned vy_ctz(unsigned a) { return a == 0u ? 32u : (unsigned)(__ffs((int)a) - 1); }
/* f32 min/max: IEEE 754-2019 minimumNumber/maximumNumber (NaN ignored, -0 < +0). */
VY_FN float vy_fmin(float a, float b) {
  if (a == 0.0f && b == 0.0f) return __uint_as_float(__float_as_uint(a) | __float_as_uint(b));
  return fminf(a, b);
}
VY_FN float vy_fmax(float a, float b) {
  if (a == 0.0f && b == 0.0f) return __uint_as_float(__float_as_uint(a) & __float_as_uint(b));
  return fmaxf(a, b);
}
/* Transcendentals: binary64 evaluation rounded once to binary32 (as the reference). */
VY_FN float vy_exp(float x) { return (float)exp((double)x); }
VY_FN float vy_log(float x) { return (float)log((double)x); }
VY_FN float vy_sin(float x) { return (float)sin((double)x); }
VY_FN float vy_cos(float x) { return (float)cos((double)x); }
VY_FN float vy_tanh(float x) { return (float)tanh((double)x); }
VY_FN float vy_rsqrt(float x) { return (float)(1.0 / sqrt((double)x)); }
/* f32 -> u32/i32: truncate toward zero, saturate, NaN -> 0. */
VY_FN unsigned vy_f2u(float x) {
  if (x != x || x <= 0.0f) return 0u;
  if (x >= 4294967296.0f) return 0xFFFFFFFFu;
  return __float2uint_rz(x);
}
VY_FN int vy_f2i(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return __float2int_rz(x);
}
#endif /* VYRE_CUDA_PRELUDE */
"""

#: blake3 of the prelude's text (16 hex digits), part of the compiler fingerprint.
PRELUDE_DIGEST = blake3.blake3(PRELUDE.encode()).hexdigest()[:16]
