"""The WGSL helper prelude every generated shader starts with.

WGSL's own integer and float rules differ from the IR's (``ir.md``,
"Semantics") in the corners: ``a / 0 = a``, ``INT_MIN / -1 = INT_MIN``, shift
amounts that are constant and ≥ 32 do not compile, float→int conversion is
implementation-defined for NaN, and implementations may assume floats are
never NaN or infinite (Mesa rewrites ``x != x`` to false). Each helper here
implements one IR rule explicitly:

- integer division, remainder, shifts and the i32 wrap-around are written on
  the 32-bit patterns, inside functions (their operands are never
  const-expressions, so no constant case can become a shader-creation error);
- every NaN test, comparison, ``min``/``max``, ``neg``/``abs``, float→int
  cast and ``fmod`` decides on the ``bitcast<u32>`` bit pattern, which no
  finite-math rewrite can fold away;
- integer→f32 conversion rounds to nearest even on the bits (WGSL allows
  either neighbour);
- float constants are made with `vy_f32` from their bits, so a NaN or an
  infinity is a run-time value, never a const-expression (which WGSL rejects).

What stays with the platform is listed in ``docs/wgpu.md``: the
transcendentals, and float arithmetic whose operands or result are NaN,
infinite or ``-0`` (Mesa folds ``x - x`` to ``0`` and ``x * 0`` to ``0``).
"""

from __future__ import annotations

import blake3

from vyre_async.abc import public_dir as _public_dir

__all__ = ["PRELUDE", "PRELUDE_DIGEST", "PRELUDE_VERSION"]
__dir__ = _public_dir(__name__)

#: The prelude's revision, for people (its comment line and `CODEGEN_VERSION`); the
#: cache identity follows `PRELUDE_DIGEST`, so an edit without a bump is still a miss.
PRELUDE_VERSION = 1

PRELUDE = r"""// vyre_wgpu prelude v1: exact IR semantics (ir.md). Generated code; do not edit.
fn vy_f32(bits: u32) -> f32 { return bitcast<f32>(bits); }
fn vy_idx(i: u32) -> u32 { return i; }
fn vy_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
// u32: x / 0 = 0xFFFFFFFF, x % 0 = 0; shift counts use the low 5 bits.
fn vy_div_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0xffffffffu; } return a / b; }
fn vy_mod_u32(a: u32, b: u32) -> u32 { if (b == 0u) { return 0u; } return a % b; }
fn vy_shl_u32(a: u32, b: u32) -> u32 { return a << (b & 31u); }
fn vy_shr_u32(a: u32, b: u32) -> u32 { return a >> (b & 31u); }
fn vy_mulhi_u32(a: u32, b: u32) -> u32 {
  let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;
  let ll = al * bl; let lh = al * bh; let hl = ah * bl; let hh = ah * bh;
  let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
  return hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
}
// i32 add/sub/mul/neg wrap modulo 2^32 (computed on the bit patterns).
fn vy_add_i32(a: i32, b: i32) -> i32 { return bitcast<i32>(bitcast<u32>(a) + bitcast<u32>(b)); }
fn vy_sub_i32(a: i32, b: i32) -> i32 { return bitcast<i32>(bitcast<u32>(a) - bitcast<u32>(b)); }
fn vy_mul_i32(a: i32, b: i32) -> i32 { return bitcast<i32>(bitcast<u32>(a) * bitcast<u32>(b)); }
fn vy_neg_i32(a: i32) -> i32 { return bitcast<i32>(0u - bitcast<u32>(a)); }
// i32: truncating; x / 0 = 0, x % 0 = 0, INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0.
fn vy_div_i32(a: i32, b: i32) -> i32 {
  if (b == 0) { return 0; }
  if (b == -1) { return vy_neg_i32(a); }
  return a / b;
}
fn vy_mod_i32(a: i32, b: i32) -> i32 { if (b == 0 || b == -1) { return 0; } return a % b; }
fn vy_shl_i32(a: i32, b: i32) -> i32 { return bitcast<i32>(bitcast<u32>(a) << (bitcast<u32>(b) & 31u)); }
fn vy_shr_i32(a: i32, b: i32) -> i32 { return a >> (bitcast<u32>(b) & 31u); }
// Bit counts on the 32-bit pattern; clz(0) = ctz(0) = 32.
fn vy_popc(a: u32) -> u32 { return countOneBits(a); }
fn vy_clz(a: u32) -> u32 { if (a == 0u) { return 32u; } return countLeadingZeros(a); }
fn vy_ctz(a: u32) -> u32 { if (a == 0u) { return 32u; } return countTrailingZeros(a); }
// f32 comparisons: IEEE (every comparison but ne is false for NaN), decided on the bits.
// The order key maps the float order (-0 = +0) onto the unsigned integer order.
fn vy_key(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) == 0u) { return 0x80000000u; }
  if ((b & 0x80000000u) != 0u) { return ~b; }
  return b | 0x80000000u;
}
fn vy_feq(a: f32, b: f32) -> bool { return !vy_isnan(a) && !vy_isnan(b) && vy_key(a) == vy_key(b); }
fn vy_fne(a: f32, b: f32) -> bool { return !vy_feq(a, b); }
fn vy_flt(a: f32, b: f32) -> bool { return !vy_isnan(a) && !vy_isnan(b) && vy_key(a) < vy_key(b); }
fn vy_fle(a: f32, b: f32) -> bool { return !vy_isnan(a) && !vy_isnan(b) && vy_key(a) <= vy_key(b); }
fn vy_fgt(a: f32, b: f32) -> bool { return vy_flt(b, a); }
fn vy_fge(a: f32, b: f32) -> bool { return vy_fle(b, a); }
// f32 min/max: IEEE 754-2019 minimumNumber/maximumNumber (NaN ignored, -0 < +0).
fn vy_fmin(a: f32, b: f32) -> f32 {
  if (vy_isnan(a)) { return b; }
  if (vy_isnan(b)) { return a; }
  let ba = bitcast<u32>(a); let bb = bitcast<u32>(b);
  if ((ba & 0x7fffffffu) == 0u && (bb & 0x7fffffffu) == 0u) { return bitcast<f32>(ba | bb); }
  if (vy_key(a) < vy_key(b)) { return a; }
  return b;
}
fn vy_fmax(a: f32, b: f32) -> f32 {
  if (vy_isnan(a)) { return b; }
  if (vy_isnan(b)) { return a; }
  let ba = bitcast<u32>(a); let bb = bitcast<u32>(b);
  if ((ba & 0x7fffffffu) == 0u && (bb & 0x7fffffffu) == 0u) { return bitcast<f32>(ba & bb); }
  if (vy_key(a) < vy_key(b)) { return b; }
  return a;
}
fn vy_fneg(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ 0x80000000u); }
fn vy_fabs(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) & 0x7fffffffu); }
fn vy_ftrue(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) != 0u; }
// f32 mod: C fmodf (exact; the sign of the dividend), on the bits (after musl's fmodf).
fn vy_fmod(x: f32, y: f32) -> f32 {
  var ux = bitcast<u32>(x); var uy = bitcast<u32>(y);
  let sx = ux & 0x80000000u;
  var ex = i32((ux >> 23u) & 0xffu); var ey = i32((uy >> 23u) & 0xffu);
  if ((uy & 0x7fffffffu) == 0u || vy_isnan(y) || ex == 255) { return vy_f32(0x7fc00000u); }
  if ((ux & 0x7fffffffu) <= (uy & 0x7fffffffu)) {
    if ((ux & 0x7fffffffu) == (uy & 0x7fffffffu)) { return bitcast<f32>(sx); }
    return x;
  }
  if (ex == 0) {
    var i = ux << 9u;
    loop { if ((i >> 31u) != 0u) { break; } ex = ex - 1; i = i << 1u; }
    ux = ux << u32(1 - ex);
  } else {
    ux = (ux & 0x007fffffu) | 0x00800000u;
  }
  if (ey == 0) {
    var i = uy << 9u;
    loop { if ((i >> 31u) != 0u) { break; } ey = ey - 1; i = i << 1u; }
    uy = uy << u32(1 - ey);
  } else {
    uy = (uy & 0x007fffffu) | 0x00800000u;
  }
  loop {
    if (ex <= ey) { break; }
    let d = ux - uy;
    if ((d >> 31u) == 0u) {
      if (d == 0u) { return bitcast<f32>(sx); }
      ux = d;
    }
    ux = ux << 1u;
    ex = ex - 1;
  }
  let d = ux - uy;
  if ((d >> 31u) == 0u) {
    if (d == 0u) { return bitcast<f32>(sx); }
    ux = d;
  }
  loop { if ((ux >> 23u) != 0u) { break; } ux = ux << 1u; ex = ex - 1; }
  if (ex > 0) {
    ux = (ux - 0x00800000u) | (u32(ex) << 23u);
  } else {
    ux = ux >> u32(1 - ex);
  }
  return bitcast<f32>(ux | sx);
}
// Rounding functions on the bits: floor, ceil, trunc, round (ties to even), sign kept.
fn vy_trunc(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let e = i32((b >> 23u) & 0xffu) - 127;
  if (e >= 23) { return x; }
  if (e < 0) { return bitcast<f32>(b & 0x80000000u); }
  let m = 0x007fffffu >> u32(e);
  return bitcast<f32>(b & ~m);
}
fn vy_round(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let e = i32((b >> 23u) & 0xffu) - 127;
  if (e >= 23) { return x; }
  let s = b & 0x80000000u;
  if (e < -1) { return bitcast<f32>(s); }
  if (e == -1) {
    if ((b & 0x7fffffffu) > 0x3f000000u) { return bitcast<f32>(s | 0x3f800000u); }
    return bitcast<f32>(s);
  }
  let frac = 0x007fffffu >> u32(e);
  let half = 0x00400000u >> u32(e);
  let r = b & frac;
  var t = b & ~frac;
  let one = frac + 1u;
  if (r > half || (r == half && (t & one) != 0u)) { t = t + one; }
  return bitcast<f32>(t);
}
fn vy_floor(x: f32) -> f32 {
  let t = vy_trunc(x);
  if ((bitcast<u32>(x) & 0x80000000u) != 0u && bitcast<u32>(t) != bitcast<u32>(x) && !vy_isnan(x)) {
    return t - 1.0;
  }
  return t;
}
fn vy_ceil(x: f32) -> f32 {
  let t = vy_trunc(x);
  if ((bitcast<u32>(x) & 0x80000000u) == 0u && bitcast<u32>(t) != bitcast<u32>(x) && !vy_isnan(x)) {
    return t + 1.0;
  }
  if ((bitcast<u32>(x) & 0x80000000u) != 0u && (bitcast<u32>(t) & 0x7fffffffu) == 0u) {
    return bitcast<f32>(0x80000000u);
  }
  return t;
}
// f32 -> u32/i32: truncate toward zero, saturate, NaN -> 0.
fn vy_f2u(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  if (vy_isnan(x) || (b & 0x80000000u) != 0u) { return 0u; }
  if (b >= 0x4f800000u) { return 0xffffffffu; }
  let e = i32(b >> 23u) - 127;
  if (e < 0) { return 0u; }
  let m = (b & 0x007fffffu) | 0x00800000u;
  if (e >= 23) { return m << u32(e - 23); }
  return m >> u32(23 - e);
}
fn vy_f2i(x: f32) -> i32 {
  let b = bitcast<u32>(x);
  if (vy_isnan(x)) { return 0; }
  let a = b & 0x7fffffffu;
  if (a >= 0x4f000000u) {
    if ((b & 0x80000000u) != 0u) { return bitcast<i32>(0x80000000u); }
    return 2147483647;
  }
  let m = vy_f2u(bitcast<f32>(a));
  if ((b & 0x80000000u) != 0u) { return bitcast<i32>(0u - m); }
  return bitcast<i32>(m);
}
// u32/i32 -> f32: round to nearest even, on the bits.
fn vy_u2f(u: u32) -> f32 {
  if (u == 0u) { return bitcast<f32>(0u); }
  let e = 31u - countLeadingZeros(u);
  if (e <= 23u) { return bitcast<f32>(((e + 127u) << 23u) | ((u << (23u - e)) & 0x007fffffu)); }
  let sh = e - 23u;
  var m = u >> sh;
  let r = u & ((1u << sh) - 1u);
  let half = 1u << (sh - 1u);
  if (r > half || (r == half && (m & 1u) == 1u)) { m = m + 1u; }
  return bitcast<f32>(((e + 127u) << 23u) + (m - 0x00800000u));
}
fn vy_i2f(i: i32) -> f32 {
  let b = bitcast<u32>(i);
  if ((b & 0x80000000u) != 0u) { return bitcast<f32>(bitcast<u32>(vy_u2f(0u - b)) | 0x80000000u); }
  return vy_u2f(b);
}
// Transcendentals: the platform's (docs/wgpu.md lists their error on lavapipe).
fn vy_rsqrt(x: f32) -> f32 { return 1.0 / sqrt(x); }
"""

#: blake3 of the prelude's text (16 hex digits), part of the compiler fingerprint.
PRELUDE_DIGEST = blake3.blake3(PRELUDE.encode()).hexdigest()[:16]
