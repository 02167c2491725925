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

The transcendentals are vyre's own too (below), and the code generator makes
every f32 constant and operand of ``+ - * /`` opaque (`vy_o`), so finite-math
folding (Mesa folds ``x - x`` and ``x * 0`` to ``0``) and fma contraction cannot
happen. What stays with the platform is ``/`` and ``sqrt`` (correctly rounded
on lavapipe; WebGPU allows 2.5 ULP) and subnormal handling (``docs/wgpu.md``).
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
// Turns of the prelude's own loops since the last loop-budget check (sliced shaders).
var<private> vy_ticks: u32 = 0u;
// Set when a prelude loop was cut short (lavapipe); loop-guarded shaders report it.
var<private> vy_cut: bool = false;
// x, unchanged, but not a value the compiler can fold: vy_info.grid.w is always 0.
fn vy_o(x: f32, k: u32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ (vy_info.grid.w * k)); }
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
// f32 mod: C fmodf (exact; the sign of the dividend), on the bits. With x = mx * 2^ex and
// y = my * 2^ey (24-bit mantissas), x mod y = ((mx * 2^(ex - ey)) mod my) * 2^ey,
// and the power of two is taken 8 bits at a time: (r * 2^8) mod my = ((r mod my) * 2^8) mod my.
// A loop of at most 35 turns: the same steps unrolled hang lavapipe's compiler when both
// operands are uniform. Its turns count in vy_ticks, which a sliced shader's loop budget
// also spends (lavapipe's loop cap counts them too).
fn vy_fmod(x: f32, y: f32) -> f32 {
  let ux = bitcast<u32>(x); let uy = bitcast<u32>(y);
  let sx = ux & 0x80000000u;
  let ax = ux & 0x7fffffffu; let ay = uy & 0x7fffffffu;
  if (ay == 0u || ay > 0x7f800000u || ax >= 0x7f800000u) { return vy_f32(0x7fc00000u); }
  if (ax < ay) { return x; }
  if (ax == ay) { return bitcast<f32>(sx); }
  var ex = i32(ax >> 23u); var ey = i32(ay >> 23u);
  var mx = (ax & 0x007fffffu) | 0x00800000u; var my = (ay & 0x007fffffu) | 0x00800000u;
  if (ex == 0) { let z = i32(countLeadingZeros(ax)) - 8; mx = ax << u32(z); ex = 1 - z; }
  if (ey == 0) { let z = i32(countLeadingZeros(ay)) - 8; my = ay << u32(z); ey = 1 - z; }
  var d = ex - ey;
  var r = mx % my;
  loop { if (d < 8) { break; } vy_ticks = vy_ticks + 1u; r = (r << 8u) % my; d = d - 8; }
  if (d >= 8) { vy_cut = true; }  // the loop was cut (lavapipe's loop cap)
  r = (r << u32(d)) % my;
  if (r == 0u) { return bitcast<f32>(sx); }
  let z = i32(countLeadingZeros(r)) - 8;
  r = r << u32(z);
  let e = ey - z;
  if (e > 0) { return bitcast<f32>(sx | (u32(e) << 23u) | (r & 0x007fffffu)); }
  return bitcast<f32>(sx | (r >> u32(1 - e)));
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
// 64-bit helpers on vec2<u32>(low word, high word), for vy_fma.
fn vy_clz64(x: vec2<u32>) -> u32 { if (x.y != 0u) { return countLeadingZeros(x.y); } return 32u + countLeadingZeros(x.x); }
fn vy_shl64(x: vec2<u32>, n: u32) -> vec2<u32> {
  if (n == 0u) { return x; }
  if (n >= 64u) { return vec2<u32>(0u, 0u); }
  if (n >= 32u) { return vec2<u32>(0u, x.x << (n - 32u)); }
  return vec2<u32>(x.x << n, (x.y << n) | (x.x >> (32u - n)));
}
fn vy_shr64(x: vec2<u32>, n: u32) -> vec2<u32> {
  if (n == 0u) { return x; }
  if (n >= 64u) { return vec2<u32>(0u, 0u); }
  if (n >= 32u) { return vec2<u32>(x.y >> (n - 32u), 0u); }
  return vec2<u32>((x.x >> n) | (x.y << (32u - n)), x.y >> n);
}
fn vy_lt64(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn vy_add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  let lo = a.x + b.x;
  return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn vy_sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
  return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
// x shifted right by n, the bits shifted out OR-ed into bit 0 ("sticky").
fn vy_shr64_sticky(x: vec2<u32>, n: u32) -> vec2<u32> {
  var r = vy_shr64(x, n);
  let back = vy_shl64(r, n);
  if (n >= 64u) { if ((x.x | x.y) != 0u) { r.x = r.x | 1u; } return r; }
  if (back.x != x.x || back.y != x.y) { r.x = r.x | 1u; }
  return r;
}
// f32 fma: a * b + c with ONE rounding (to nearest even), on integers: WGSL's fma may
// round twice (lavapipe's does). The product is exact in 48 bits; both addends are
// placed with their top bit at bit 61, the smaller shifted right with a sticky bit.
fn vy_fma(a: f32, b: f32, c: f32) -> f32 {
  let ua = bitcast<u32>(a); let ub = bitcast<u32>(b); let uc = bitcast<u32>(c);
  let aa = ua & 0x7fffffffu; let ab = ub & 0x7fffffffu; let ac = uc & 0x7fffffffu;
  let sp = (ua ^ ub) & 0x80000000u; let sc = uc & 0x80000000u;
  if (aa > 0x7f800000u || ab > 0x7f800000u || ac > 0x7f800000u) { return vy_f32(0x7fc00000u); }
  if (aa == 0x7f800000u || ab == 0x7f800000u) {
    if (aa == 0u || ab == 0u || (ac == 0x7f800000u && sc != sp)) { return vy_f32(0x7fc00000u); }
    return bitcast<f32>(sp | 0x7f800000u);
  }
  if (ac == 0x7f800000u) { return c; }
  if (aa == 0u || ab == 0u) {
    if (ac == 0u) { return bitcast<f32>(sp & sc); }
    return c;
  }
  var ma = aa & 0x007fffffu; var ea = i32(aa >> 23u);
  if (ea == 0) { ea = 1; } else { ma = ma | 0x00800000u; }
  var mb = ab & 0x007fffffu; var eb = i32(ab >> 23u);
  if (eb == 0) { eb = 1; } else { mb = mb | 0x00800000u; }
  var p = vec2<u32>(ma * mb, vy_mulhi_u32(ma, mb));
  let kp = vy_clz64(p) - 2u;
  p = vy_shl64(p, kp);
  let ep = ea + eb - 300 - i32(kp);
  var q = vec2<u32>(0u, 0u);
  var eq = ep;
  if (ac != 0u) {
    var mc = ac & 0x007fffffu; var ec = i32(ac >> 23u);
    if (ec == 0) { ec = 1; } else { mc = mc | 0x00800000u; }
    q = vec2<u32>(mc, 0u);
    let kq = vy_clz64(q) - 2u;
    q = vy_shl64(q, kq);
    eq = ec - 150 - i32(kq);
  }
  var e = ep;
  if (ep >= eq) { q = vy_shr64_sticky(q, u32(ep - eq)); } else { p = vy_shr64_sticky(p, u32(eq - ep)); e = eq; }
  var sum: vec2<u32>; var sign: u32;
  if (sp == sc) { sum = vy_add64(p, q); sign = sp; }
  else if (vy_lt64(p, q)) { sum = vy_sub64(q, p); sign = sc; }
  else { sum = vy_sub64(p, q); sign = sp; }
  if ((sum.x | sum.y) == 0u) { return bitcast<f32>(0u); }
  let top = 63 - i32(vy_clz64(sum));
  var shift = top - 23;
  if (-149 - e > shift) { shift = -149 - e; }
  let elsb = e + shift;
  var m: u32;
  if (shift <= 0) {
    m = vy_shl64(sum, u32(-shift)).x;
  } else {
    let kept = vy_shr64(sum, u32(shift));
    let rest = vy_sub64(sum, vy_shl64(kept, u32(shift)));
    let half = vy_shl64(vec2<u32>(1u, 0u), u32(shift - 1));
    m = kept.x;
    if (shift < 64 && (vy_lt64(half, rest) || (rest.x == half.x && rest.y == half.y && (m & 1u) == 1u))) {
      m = m + 1u;
    }
  }
  if (m == 0u) { return bitcast<f32>(sign); }
  if (m < 0x00800000u) { return bitcast<f32>(sign | m); }
  let biased = elsb + 150;
  if (biased >= 255 || (biased == 254 && m >= 0x01000000u)) { return bitcast<f32>(sign | 0x7f800000u); }
  return bitcast<f32>(sign | ((u32(biased) << 23u) + (m - 0x00800000u)));
}
// Transcendentals. exp, log and tanh are vyre's own (after musl's expf, logf and a
// Taylor series), built from +, -, *, / only: WGSL lets a platform's exp be off by
// 3 + 2|x| ULP and its log and tanh by an absolute error, which is unbounded in ULP near
// log(1) and tanh(0) (lavapipe: 64, 101 and 665 million ULP). sin and cos are vyre's
// too (WGSL bounds the platform's only by an absolute error, on [-pi, pi] only).
fn vy_scale(y: f32, k: i32) -> f32 {
  let k1 = k / 2;
  let k2 = k - k1;
  return (y * bitcast<f32>(u32(k1 + 127) << 23u)) * bitcast<f32>(u32(k2 + 127) << 23u);
}
fn vy_exp(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let hx = b & 0x7fffffffu;
  let neg = (b >> 31u) != 0u;
  if (hx > 0x7f800000u) { return x; }
  if (!neg && hx >= 0x42b17218u) { return vy_f32(0x7f800000u); }
  if (neg && hx >= 0x42cff1b5u) { return vy_f32(0u); }
  var k = 0;
  var hi = x;
  var lo = vy_f32(0u);
  var r = x;
  if (hx > 0x3eb17218u) {
    if (hx > 0x3f851592u) {
      k = i32(vy_f32(0x3fb8aa3bu) * x + select(vy_f32(0x3f000000u), vy_f32(0xbf000000u), neg));
    } else {
      k = select(1, -1, neg);
    }
    let kf = f32(k);
    hi = x - kf * vy_f32(0x3f317200u);
    lo = kf * vy_f32(0x35bfbe8eu);
    r = hi - lo;
  } else if (hx <= 0x39000000u) {
    return vy_f32(0x3f800000u) + x;
  }
  let xx = r * r;
  let c = r - xx * (vy_f32(0x3e2aaa8fu) + xx * vy_f32(0xbb355215u));
  var y: f32;
  if (k == 0) {
    y = vy_f32(0x3f800000u) - ((r * c) / (c - vy_f32(0x40000000u)) - r);
    return y;
  }
  y = vy_f32(0x3f800000u) - ((lo - (r * c) / (vy_f32(0x40000000u) - c)) - hi);
  return vy_scale(y, k);
}
fn vy_log(x: f32) -> f32 {
  var ix = bitcast<u32>(x);
  var k = 0;
  if (ix > 0x7f800000u && ix < 0x80000000u) { return x; }
  if ((ix & 0x7fffffffu) == 0u) { return vy_f32(0xff800000u); }
  if ((ix >> 31u) != 0u) { return vy_f32(0x7fc00000u); }
  if (ix == 0x7f800000u) { return x; }
  if (ix < 0x00800000u) {
    k = -25;
    ix = bitcast<u32>(x * vy_f32(0x4c000000u));
  }
  ix = ix + (0x3f800000u - 0x3f3504f3u);
  k = k + i32(ix >> 23u) - 0x7f;
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  let f = bitcast<f32>(ix) - vy_f32(0x3f800000u);
  let s = f / (vy_f32(0x40000000u) + f);
  let z = s * s;
  let w = z * z;
  let t1 = w * (vy_f32(0x3eccce13u) + w * vy_f32(0x3e789e26u));
  let t2 = z * (vy_f32(0x3f2aaaaau) + w * vy_f32(0x3e91e9eeu));
  let r = t2 + t1;
  let hfsq = vy_f32(0x3f000000u) * f * f;
  let dk = f32(k);
  return s * (hfsq + r) + dk * vy_f32(0x3717f7d1u) - hfsq + f + dk * vy_f32(0x3f317180u);
}
fn vy_tanh(x: f32) -> f32 {
  let b = bitcast<u32>(x);
  let w = b & 0x7fffffffu;
  let sign = b & 0x80000000u;
  if (w > 0x7f800000u || w == 0u) { return x; }
  if (w >= 0x41200000u) { return bitcast<f32>(sign | 0x3f800000u); }
  if (w > 0x3f0c9f54u) {
    let a = bitcast<f32>(w);
    let t = vy_f32(0x3f800000u) - vy_f32(0x40000000u) / (vy_exp(a + a) + vy_f32(0x3f800000u));
    return bitcast<f32>(bitcast<u32>(t) | sign);
  }
  let z = x * x;
  return x + x * (z * (vy_f32(0xbeaaaaabu) + z * (vy_f32(0x3e088889u) + z * (vy_f32(0xbd5d0dd1u) + z * (vy_f32(0x3cb327a4u) + z * (vy_f32(0xbc11371bu) + z * (vy_f32(0x3b6b69e8u) + z * (vy_f32(0xbabed1b2u) + z * (vy_f32(0x3a1aac12u) + z * (vy_f32(0xb97abebcu)))))))))));
}
// sin and cos: |x| = k * pi/2 + r, reduced by Payne-Hanek on integers for every
// |x| >= pi/4 (vy_reduce_big), then Cephes' polynomials on [-pi/4, pi/4].
// Payne-Hanek reduction for pi/4 <= |x|: x * 2/pi mod 4 from the bits of 2/pi
// (vy_twobypi, 288 of them) on integers. Returns (r, quadrant).
var<private> vy_twobypi: array<u32, 9> = array<u32, 9>(0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu, 0xdebbc561u, 0xb7246e3au);
fn vy_bits_at(p: array<u32, 5>, pos: u32) -> u32 {
  var q = p;
  let w = pos / 32u; let o = pos % 32u;
  if (o == 0u) { return q[w]; }
  return (q[w] >> o) | (q[w + 1u] << (32u - o));
}
fn vy_twobypi_at(pos: u32) -> u32 {
  let w = pos / 32u; let o = pos % 32u;
  if (o == 0u) { return vy_twobypi[w]; }
  return (vy_twobypi[w] << o) | (vy_twobypi[w + 1u] >> (32u - o));
}
fn vy_reduce_big(a: f32) -> vec2<f32> {
  let b = bitcast<u32>(a);
  let m = (b & 0x007fffffu) | 0x00800000u;
  let e = i32(b >> 23u) - 150;
  let s = max(1, e - 1);
  let f2 = vy_twobypi_at(u32(s - 1)); let f1 = vy_twobypi_at(u32(s + 31)); let f0 = vy_twobypi_at(u32(s + 63));
  let l0 = m * f0; let h0 = vy_mulhi_u32(m, f0);
  let l1 = m * f1; let h1 = vy_mulhi_u32(m, f1);
  let l2 = m * f2; let h2 = vy_mulhi_u32(m, f2);
  let p1 = h0 + l1; let c1 = select(0u, 1u, p1 < h0);
  let p2a = h1 + l2; let c2a = select(0u, 1u, p2a < h1);
  let p2 = p2a + c1; let c2b = select(0u, 1u, p2 < p2a);
  let p3 = h2 + c2a + c2b;
  let p = array<u32, 5>(l0, p1, p2, p3, 0u);
  let l = u32(s + 95 - e);
  var q = vy_bits_at(p, l) & 3u;
  var frac = vec2<u32>(vy_bits_at(p, l - 64u), vy_bits_at(p, l - 32u));
  var neg = false;
  if (frac.y >= 0x80000000u) {
    q = (q + 1u) & 3u;
    frac = vy_sub64(vec2<u32>(0u, 0u), frac);
    neg = true;
  }
  let z = vy_clz64(frac);
  if (z >= 64u) { return vec2<f32>(vy_f32(0u), f32(q)); }
  // The top 32 bits of the fraction as a sum of two floats (hi rounded, lo exact),
  // times pi/2 = p1 + p2 with one exact fma.
  let top = vy_shl64(frac, z).y;
  let hi = vy_u2f(top);
  let lo = vy_i2f(bitcast<i32>(top - vy_f2u(hi)));
  let th = vy_scale(hi, -32 - i32(z));
  let tl = vy_scale(lo, -32 - i32(z));
  var r = vy_fma(th, vy_f32(0x3fc90fdbu), th * vy_f32(0xb33bbd2eu) + tl * vy_f32(0x3fc90fdbu));
  if (neg) { r = vy_fneg(r); }
  return vec2<f32>(r, f32(q));
}
fn vy_sincos_r(a: f32) -> vec2<f32> {
  if (bitcast<u32>(a) < 0x3f490fdbu) { return vec2<f32>(a, 0.0); }
  return vy_reduce_big(a);
}
fn vy_sin_poly(r: f32) -> f32 {
  let z = r * r;
  return r + r * z * (vy_f32(0xbe2aaaa3u) + z * (vy_f32(0x3c08839eu) + z * vy_f32(0xb94ca1f9u)));
}
fn vy_cos_poly(r: f32) -> f32 {
  let z = r * r;
  return vy_f32(0x3f800000u) - vy_f32(0x3f000000u) * z
    + z * z * (vy_f32(0x3d2aaaa5u) + z * (vy_f32(0xbab6061au) + z * vy_f32(0x37ccf5ceu)));
}
fn vy_sin(x: f32) -> f32 {
  let a = bitcast<u32>(x) & 0x7fffffffu;
  if (a >= 0x7f800000u) { return vy_f32(0x7fc00000u); }
  if (a < 0x39800000u) { return x; }
  let rk = vy_sincos_r(bitcast<f32>(a));
  let q = u32(rk.y) & 3u;
  var v: f32;
  if ((q & 1u) == 0u) { v = vy_sin_poly(rk.x); } else { v = vy_cos_poly(rk.x); }
  if (q >= 2u) { v = vy_fneg(v); }
  if (a != bitcast<u32>(x)) { return vy_fneg(v); }
  return v;
}
fn vy_cos(x: f32) -> f32 {
  let a = bitcast<u32>(x) & 0x7fffffffu;
  if (a >= 0x7f800000u) { return vy_f32(0x7fc00000u); }
  let rk = vy_sincos_r(bitcast<f32>(a));
  let q = (u32(rk.y) + 1u) & 3u;
  var v: f32;
  if ((q & 1u) == 0u) { v = vy_sin_poly(rk.x); } else { v = vy_cos_poly(rk.x); }
  if (q >= 2u) { return vy_fneg(v); }
  return v;
}
// 1 / sqrt(x), two correctly rounded steps: the opaque 1 keeps a compiler from turning it
// into an approximate reciprocal square root.
fn vy_rsqrt(x: f32) -> f32 { return vy_o(vy_f32(0x3f800000u), 0x9e3779b9u) / sqrt(x); }
"""

#: blake3 of the prelude's text (16 hex digits), part of the compiler fingerprint.
PRELUDE_DIGEST = blake3.blake3(PRELUDE.encode()).hexdigest()[:16]
