// One quantizer call on a contiguous float32 CPU tensor: amax → scale (kinds none, tensor, delayed, or a given
// scale) → quantize(x·s)/s → the statistics of stats.py, with the new scaler state written into the caller's
// buffers. The same operations as rounding.py's kernel (``_round_bits``, ``_finish``, ``random_bits``) and
// scaling.py's ``scale_from_amax`` on the float32 bit patterns as int32, so the same bits for every format, rounding
// mode, scale and seed. Plain C++ (no torch headers); native.py builds it with the system compiler and
// ``-fno-fast-math -ffp-contract=off`` (float adds must not be reassociated: (x + C) − C is the rounding).
//
// Nearest takes the one-add road (|x| + C − C, C = 2^(e+23−M), e = |x|'s binade held in [emin, emax]) or, for
// ``bit_round`` variants, the bias-and-mask road with the subnormal one-add; stochastic and toward-zero cut the
// normal region's bits and rebuild the fixed-point region below the smallest normal from k = floor(|x| / q)
// (stochastic: + 1 when frac(|x| / q) > u, u from a counter-based hash of (seed, element index)). Then saturation
// or overflow, the sign and NaN. Sixteen lanes at a time where the compiler targets AVX-512 (``round16``), then eight
// with AVX2 (``round8``); the last elements (and every element where the compiler targets no AVX2) take the scalar
// twin ``round1``, so every road is exercised by the exactness tests. Where several threads are given, a call's
// elements are split into one contiguous part per thread (``parts_for``).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "kernel_abi.h"
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#define KERNEL_AVX2 1
#endif

namespace {

// The enums (parameter slots P_*, rounding modes, variant flag bits, scale kinds KIND_*, statistics slots S_*) are
// generated from altgrad/quant/kernel_abi.py, the table the Python side uses too: kernel_abi.h (native.py writes it).

constexpr int32_t kAbs = 0x7FFFFFFF, kInf = 0x7F800000, kNan = 0x7FC00000, kExp = 0x7F800000;
constexpr uint32_t kPhi = 0x9E3779B1u;  // rounding.random_bits: counter i → fmix32(i·φ + key)
constexpr int32_t kInvPow2Bits = 254 << 23;  // rounding.unscale: 1/2^k's bits = (254 << 23) − 2^k's bits

inline float as_f(int32_t v) { float f; std::memcpy(&f, &v, 4); return f; }
inline int32_t as_i(float f) { int32_t v; std::memcpy(&v, &f, 4); return v; }

inline uint32_t mix32(uint32_t h) {  // murmur3's fmix32 (rounding._mix32)
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// One element, exactly as rounding.py's ``_round_bits`` + ``_finish`` (r: its random bits, stochastic only).
template <int kRounding, int kFlags>
inline int32_t round1(int32_t bits, uint32_t r, const int32_t* p) {
  const int32_t sign = bits & INT32_MIN;
  const int32_t a0 = bits & kAbs;
  int32_t m;
  if constexpr (kRounding == NEAREST && !(kFlags & BIT_ROUND)) {
    int32_t e = a0 & kExp;
    e = e < p[P_EMIN_BITS] ? p[P_EMIN_BITS] : (e > p[P_EMAX_BITS] ? p[P_EMAX_BITS] : e);
    const float c = as_f(e + p[P_CSHIFT]);
    m = as_i((as_f(a0) + c) - c);
  } else {
    const int32_t a = a0 < kInf ? a0 : kInf;
    const int32_t low = p[P_LOW];
    int32_t normal, sub;
    if constexpr (kRounding == NEAREST) {
      int32_t parity = a >> p[P_SHIFT];
      if constexpr (kFlags & TIE_FLIP) parity ^= p[P_FLIP];
      normal = (a + (p[P_HALF] + (parity & p[P_LSB]))) & ~low;
      const float c = as_f(p[P_MAGIC]);
      sub = as_i((as_f(a) + c) - c);
    } else {
      normal = kRounding == STOCHASTIC ? (a + (static_cast<int32_t>(r) & low)) & ~low : a & ~low;
      float y = as_f(a < p[P_EMIN_BITS] ? a : p[P_EMIN_BITS]) * as_f(p[P_Y1]);
      if constexpr (kFlags & WIDE_QUANTUM) y = y * as_f(p[P_Y2]);
      const float yi = std::floor(y);
      int32_t k = static_cast<int32_t>(yi);
      if constexpr (kRounding == STOCHASTIC) {
        const float u = static_cast<float>((r >> 8) & 0xFFFFFFu) * 0x1p-24f;
        k += (y - yi) > u ? 1 : 0;
      }
      sub = as_i(as_f(p[P_MAGIC] + k) - as_f(p[P_MAGIC]));
    }
    m = a < p[P_EMIN_BITS] ? sub : normal;
  }
  if constexpr (kFlags & SATURATES) {
    m = m < p[P_MAX] ? m : p[P_MAX];
  } else if (m > p[P_MAX]) {
    m = a0 >= kInf ? p[P_OVF_INF] : p[P_OVF];
  }
  const int32_t out = m | ((kFlags & ZERO_SIGN) ? (m != 0 ? sign : 0) : sign);
  return a0 > kInf ? kNan : out;
}

#ifdef KERNEL_AVX2
struct Vec {
  __m256i shift, low, not_low, half, lsb, flip, max, ovf, ovf_inf, magic, emin, emin_less1, emax, cshift;
  __m256 y1, y2, q;  // q: the quantum below the smallest normal (0 where it is not a normal float32)
};

inline __m256 vf(__m256i v) { return _mm256_castsi256_ps(v); }
inline __m256i vi(__m256 v) { return _mm256_castps_si256(v); }
inline __m256i splat(int32_t v) { return _mm256_set1_epi32(v); }

Vec vec_params(const int32_t* p) {
  // C = 2^(qexp+23) = magic: q = 2^qexp, a normal float32 from qexp = −126 up
  const int32_t qexp = ((p[P_MAGIC] >> 23) & 0xFF) - 127 - 23;
  const int32_t q_bits = qexp >= -126 ? (qexp + 127) << 23 : 0;
  return Vec{splat(p[P_SHIFT]), splat(p[P_LOW]), splat(~p[P_LOW]), splat(p[P_HALF]), splat(p[P_LSB]),
             splat(p[P_FLIP]), splat(p[P_MAX]), splat(p[P_OVF]), splat(p[P_OVF_INF]), splat(p[P_MAGIC]),
             splat(p[P_EMIN_BITS]), splat(p[P_EMIN_BITS] - 1), splat(p[P_EMAX_BITS]), splat(p[P_CSHIFT]),
             vf(splat(p[P_Y1])), vf(splat(p[P_Y2])), vf(splat(q_bits))};
}

inline __m256i mix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, splat(static_cast<int32_t>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, splat(static_cast<int32_t>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// Eight elements. Lane for lane ``round1``, except where an exact shortcut gives the same value with fewer vector
// operations: |x| is not clamped to Inf or to the smallest normal first (a NaN lane is replaced by NaN at the end,
// and lanes at or above the smallest normal take ``normal`` whatever ``sub`` is), and k·q is one multiply-add where
// q is a normal float32 (exact: k < 2^M <= 2^23 and q a power of two). ``q_road``: that shortcut applies.
template <int kRounding, int kFlags>
inline __m256i round8(__m256i bits, __m256i r, const Vec& p, bool q_road) {
  const __m256i sign = _mm256_and_si256(bits, splat(INT32_MIN));
  const __m256i a0 = _mm256_and_si256(bits, splat(kAbs));
  __m256i m;
  if constexpr (kRounding == NEAREST && !(kFlags & BIT_ROUND)) {
    const __m256i e = _mm256_min_epi32(_mm256_max_epi32(_mm256_and_si256(a0, splat(kExp)), p.emin), p.emax);
    const __m256 c = vf(_mm256_add_epi32(e, p.cshift));
    m = vi(_mm256_sub_ps(_mm256_add_ps(vf(a0), c), c));
  } else {
    __m256i normal, sub;
    if constexpr (kRounding == NEAREST) {
      __m256i parity = _mm256_srav_epi32(a0, p.shift);
      if constexpr (kFlags & TIE_FLIP) parity = _mm256_xor_si256(parity, p.flip);
      const __m256i bias = _mm256_add_epi32(p.half, _mm256_and_si256(parity, p.lsb));
      normal = _mm256_and_si256(_mm256_add_epi32(a0, bias), p.not_low);
      const __m256 c = vf(p.magic);
      sub = vi(_mm256_sub_ps(_mm256_add_ps(vf(a0), c), c));
    } else {
      const __m256i cut = kRounding == STOCHASTIC ? _mm256_add_epi32(a0, _mm256_and_si256(r, p.low)) : a0;
      normal = _mm256_and_si256(cut, p.not_low);
      __m256 y = _mm256_mul_ps(vf(a0), p.y1);
      if constexpr (kFlags & WIDE_QUANTUM) y = _mm256_mul_ps(y, p.y2);
      const __m256 yi = _mm256_floor_ps(y);
      __m256 up = _mm256_setzero_ps();  // all ones where k = floor(y) takes + 1
      if constexpr (kRounding == STOCHASTIC) {
        const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
        up = _mm256_cmp_ps(_mm256_sub_ps(y, yi), u, _CMP_GT_OQ);
      }
      if (q_road) {
        const __m256 q_if_up = _mm256_and_ps(up, p.q);
#ifdef __FMA__
        sub = vi(_mm256_fmadd_ps(yi, p.q, q_if_up));
#else
        sub = vi(_mm256_add_ps(_mm256_mul_ps(yi, p.q), q_if_up));
#endif
      } else {  // q is below float32's normals: k·q formed as (C's bits + k) − C, as rounding.py does
        const __m256i k = _mm256_sub_epi32(_mm256_cvttps_epi32(yi), vi(up));  // true = −1
        sub = vi(_mm256_sub_ps(vf(_mm256_add_epi32(p.magic, k)), vf(p.magic)));
      }
    }
    m = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(a0, p.emin_less1));  // |x| >= min normal: normal
  }
  if constexpr (kFlags & SATURATES) {
    m = _mm256_min_epi32(m, p.max);
  } else {
    const __m256i special = _mm256_blendv_epi8(p.ovf, p.ovf_inf, _mm256_cmpgt_epi32(a0, splat(kInf - 1)));
    m = _mm256_blendv_epi8(m, special, _mm256_cmpgt_epi32(m, p.max));
  }
  __m256i out;
  if constexpr (kFlags & ZERO_SIGN) {
    out = _mm256_or_si256(m, _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()), sign));
  } else {
    out = _mm256_or_si256(m, sign);
  }
  return _mm256_blendv_epi8(out, splat(kNan), _mm256_cmpgt_epi32(a0, splat(kInf)));
}

inline int count(__m256i mask) { return __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(vf(mask)))); }
#endif

#if defined(KERNEL_AVX2) && defined(__AVX512F__) && defined(__AVX512DQ__)
#define KERNEL_AVX512 1
// Sixteen lanes with AVX-512 (where the compiler targets it): round8's operations lane for lane on 512-bit vectors,
// the blends and counts on mask registers. Integer, compare, floor, convert and correctly rounded float operations
// give the same bits at any width, so round16 is round8 twice (tests/quant/test_native.py builds the kernel
// without AVX-512 too and compares both roads bit for bit).
struct Vec16 {
  __m512i shift, low, not_low, half, lsb, flip, max, ovf, ovf_inf, magic, emin, emin_less1, emax, cshift;
  __m512 y1, y2, q;
};

inline __m512 wf(__m512i v) { return _mm512_castsi512_ps(v); }
inline __m512i wi(__m512 v) { return _mm512_castps_si512(v); }
inline __m512i wsplat(int32_t v) { return _mm512_set1_epi32(v); }

Vec16 vec16_params(const int32_t* p) {
  const int32_t qexp = ((p[P_MAGIC] >> 23) & 0xFF) - 127 - 23;
  const int32_t q_bits = qexp >= -126 ? (qexp + 127) << 23 : 0;
  return Vec16{wsplat(p[P_SHIFT]), wsplat(p[P_LOW]), wsplat(~p[P_LOW]), wsplat(p[P_HALF]), wsplat(p[P_LSB]),
               wsplat(p[P_FLIP]), wsplat(p[P_MAX]), wsplat(p[P_OVF]), wsplat(p[P_OVF_INF]), wsplat(p[P_MAGIC]),
               wsplat(p[P_EMIN_BITS]), wsplat(p[P_EMIN_BITS] - 1), wsplat(p[P_EMAX_BITS]), wsplat(p[P_CSHIFT]),
               wf(wsplat(p[P_Y1])), wf(wsplat(p[P_Y2])), wf(wsplat(q_bits))};
}

inline __m512i mix32(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, wsplat(static_cast<int32_t>(0x85EBCA6Bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, wsplat(static_cast<int32_t>(0xC2B2AE35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

template <int kRounding, int kFlags>
inline __m512i round16(__m512i bits, __m512i r, const Vec16& p, bool q_road) {
  const __m512i sign = _mm512_and_si512(bits, wsplat(INT32_MIN));
  const __m512i a0 = _mm512_and_si512(bits, wsplat(kAbs));
  __m512i m;
  if constexpr (kRounding == NEAREST && !(kFlags & BIT_ROUND)) {
    const __m512i e = _mm512_min_epi32(_mm512_max_epi32(_mm512_and_si512(a0, wsplat(kExp)), p.emin), p.emax);
    const __m512 c = wf(_mm512_add_epi32(e, p.cshift));
    m = wi(_mm512_sub_ps(_mm512_add_ps(wf(a0), c), c));
  } else {
    __m512i normal, sub;
    if constexpr (kRounding == NEAREST) {
      __m512i parity = _mm512_srav_epi32(a0, p.shift);
      if constexpr (kFlags & TIE_FLIP) parity = _mm512_xor_si512(parity, p.flip);
      const __m512i bias = _mm512_add_epi32(p.half, _mm512_and_si512(parity, p.lsb));
      normal = _mm512_and_si512(_mm512_add_epi32(a0, bias), p.not_low);
      const __m512 c = wf(p.magic);
      sub = wi(_mm512_sub_ps(_mm512_add_ps(wf(a0), c), c));
    } else {
      const __m512i cut = kRounding == STOCHASTIC ? _mm512_add_epi32(a0, _mm512_and_si512(r, p.low)) : a0;
      normal = _mm512_and_si512(cut, p.not_low);
      __m512 y = _mm512_mul_ps(wf(a0), p.y1);
      if constexpr (kFlags & WIDE_QUANTUM) y = _mm512_mul_ps(y, p.y2);
      const __m512 yi = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // floor
      __mmask16 up = 0;  // where k = floor(y) takes + 1
      if constexpr (kRounding == STOCHASTIC) {
        const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)), _mm512_set1_ps(0x1p-24f));
        up = _mm512_cmp_ps_mask(_mm512_sub_ps(y, yi), u, _CMP_GT_OQ);
      }
      if (q_road) {  // k·q + (q where up): both terms exact, as in round8
        sub = wi(_mm512_fmadd_ps(yi, p.q, _mm512_maskz_mov_ps(up, p.q)));
      } else {
        const __m512i k0 = _mm512_cvttps_epi32(yi);
        const __m512i k = _mm512_mask_add_epi32(k0, up, k0, wsplat(1));
        sub = wi(_mm512_sub_ps(wf(_mm512_add_epi32(p.magic, k)), wf(p.magic)));
      }
    }
    m = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a0, p.emin_less1), sub, normal);
  }
  if constexpr (kFlags & SATURATES) {
    m = _mm512_min_epi32(m, p.max);
  } else {
    const __m512i special = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a0, wsplat(kInf - 1)), p.ovf, p.ovf_inf);
    m = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(m, p.max), m, special);
  }
  __m512i out;
  if constexpr (kFlags & ZERO_SIGN) {
    out = _mm512_mask_or_epi32(m, _mm512_test_epi32_mask(m, m), m, sign);
  } else {
    out = _mm512_or_si512(m, sign);
  }
  return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a0, wsplat(kInf)), out, wsplat(kNan));
}
#endif

// What one pass over the elements needs besides the data.
struct Pass {
  const int32_t* x;
  int32_t* y;
  const int32_t* p;
  uint32_t key;     // mix32(seed ^ 0x5BD1E995): element i's random bits are mix32(i·φ + key)
  bool scaled;      // x·s is quantized and the result divided by s
  bool pow2;        // s is a power of two: dividing by s is multiplying by its exact reciprocal
  float s, inv_s;   // the scale and, for pow2, 1/s
  const float* s_each;  // one scale per element instead (kind given with a scale array; no statistics), or null
  bool stats;       // count the statistics
  float max, min_normal;
};

struct Counts {
  int64_t saturated = 0, zero = 0, subnormal = 0, nonfinite = 0;
};

// q(x·s)/s for one element and its statistics; the scalar road (and the reference for the vector one).
template <int kRounding, int kFlags>
inline void one(const Pass& w, int64_t i, Counts& c) {
  const int32_t xb = w.x[i];
  const uint32_t r = kRounding == STOCHASTIC ? mix32(static_cast<uint32_t>(i) * kPhi + w.key) : 0u;
  int32_t out;
  if (w.scaled) {
    const float s = w.s_each != nullptr ? w.s_each[i] : w.s;
    const float inv = w.s_each != nullptr ? as_f(kInvPow2Bits - as_i(s)) : w.inv_s;
    const int32_t q = round1<kRounding, kFlags>(as_i(as_f(xb) * s), r, w.p);
    out = w.pow2 ? as_i(as_f(q) * inv)
                 : as_i(static_cast<float>(static_cast<double>(as_f(q)) / static_cast<double>(s)));
  } else {
    out = round1<kRounding, kFlags>(xb, r, w.p);
  }
  w.y[i] = out;
  if (w.stats) {  // stats.py's stats_of: ax = |x| where finite, else 0
    const int32_t ax = xb & kAbs, ya = out & kAbs;
    const bool finite = ax < kInf;
    c.saturated += finite && as_f(ax) * w.s > w.max;
    c.zero += finite && ax != 0 && ya == 0;
    c.subnormal += ya != 0 && ya < kInf && as_f(ya) * w.s < w.min_normal;
    c.nonfinite += !finite;
  }
}

#ifdef KERNEL_AVX512
// Elements [i, i + 16·k) of span, sixteen at a time; returns where it stopped. Counts are added to ``c``.
template <int kRounding, int kFlags>
int64_t span16(const Pass& w, int64_t i, int64_t end, Counts& c) {
  const Vec16 p = vec16_params(w.p);
  const bool q_road = !(kFlags & WIDE_QUANTUM) && as_i(_mm512_cvtss_f32(p.q)) != 0;
  __m512 s = _mm512_set1_ps(w.s), inv = _mm512_set1_ps(w.inv_s);
  const __m512 mx = _mm512_set1_ps(w.max), mn = _mm512_set1_ps(w.min_normal);
  const __m512i inf = wsplat(kInf), zero = _mm512_setzero_si512(), one = wsplat(1);
  const __m512i step = wsplat(static_cast<int32_t>(16u * kPhi));
  __m512i h = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         wsplat(static_cast<int32_t>(kPhi))),
      wsplat(static_cast<int32_t>(static_cast<uint32_t>(i) * kPhi + w.key)));
  __m512i sat = zero, zer = zero, sub = zero, nonf = zero;  // per-lane counts
  for (; i + 16 <= end; i += 16) {
    const __m512i xb = _mm512_loadu_si512(w.x + i);
    const __m512i r = kRounding == STOCHASTIC ? mix32(h) : zero;
    __m512i out;
    if (w.scaled) {
      if (w.s_each != nullptr) {
        s = _mm512_loadu_ps(w.s_each + i);
        inv = wf(_mm512_sub_epi32(wsplat(kInvPow2Bits), wi(s)));
      }
      const __m512i q = round16<kRounding, kFlags>(wi(_mm512_mul_ps(wf(xb), s)), r, p, q_road);
      if (w.pow2) {
        out = wi(_mm512_mul_ps(wf(q), inv));
      } else {  // float64 division, rounded once to float32 (rounding.unscale)
        const __m512 qf = wf(q);
        const __m512d s_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
        const __m512d s_hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(s, 1));
        const __m256 lo = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(qf)), s_lo));
        const __m256 hi = _mm512_cvtpd_ps(_mm512_div_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(qf, 1)), s_hi));
        out = wi(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
      }
    } else {
      out = round16<kRounding, kFlags>(xb, r, p, q_road);
    }
    _mm512_storeu_si512(w.y + i, out);
    if (w.stats) {
      const __m512i ax = _mm512_and_si512(xb, wsplat(kAbs)), ya = _mm512_and_si512(out, wsplat(kAbs));
      const __mmask16 finite = _mm512_cmpgt_epi32_mask(inf, ax);
      const __m512 axs = w.scaled ? _mm512_mul_ps(wf(ax), s) : wf(ax);
      sat = _mm512_mask_add_epi32(sat, finite & _mm512_cmp_ps_mask(axs, mx, _CMP_GT_OQ), sat, one);
      zer = _mm512_mask_add_epi32(
          zer, finite & _mm512_cmpgt_epi32_mask(ax, zero) & _mm512_cmpeq_epi32_mask(ya, zero), zer, one);
      const __m512 yas = w.scaled ? _mm512_mul_ps(wf(ya), s) : wf(ya);
      const __mmask16 below = _mm512_cmpgt_epi32_mask(inf, ya) & _mm512_cmp_ps_mask(yas, mn, _CMP_LT_OQ);
      sub = _mm512_mask_add_epi32(sub, below & _mm512_test_epi32_mask(ya, ya), sub, one);
      nonf = _mm512_mask_add_epi32(nonf, static_cast<__mmask16>(~finite), nonf, one);
    }
    h = _mm512_add_epi32(h, step);
  }
  if (w.stats) {  // each lane counts at most n / 16 < 2^27 elements
    c.saturated += _mm512_reduce_add_epi32(sat);
    c.zero += _mm512_reduce_add_epi32(zer);
    c.subnormal += _mm512_reduce_add_epi32(sub);
    c.nonfinite += _mm512_reduce_add_epi32(nonf);
  }
  return i;
}
#endif

// Elements [begin, end): sixteen lanes at a time where the build has AVX-512, then eight, then one by one.
template <int kRounding, int kFlags>
void span(const Pass& w, int64_t begin, int64_t end, Counts& c) {
  int64_t i = begin;
#ifdef KERNEL_AVX512
  i = span16<kRounding, kFlags>(w, i, end, c);
#endif
#ifdef KERNEL_AVX2
  const Vec p = vec_params(w.p);
  const bool q_road = !(kFlags & WIDE_QUANTUM) && as_i(p.q[0]) != 0;
  __m256 s = _mm256_set1_ps(w.s), inv = _mm256_set1_ps(w.inv_s);
  const __m256 mx = _mm256_set1_ps(w.max), mn = _mm256_set1_ps(w.min_normal);
  const __m256i inf = splat(kInf), zero = _mm256_setzero_si256();
  const __m256i step = splat(static_cast<int32_t>(8u * kPhi));
  __m256i h = _mm256_add_epi32(
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), splat(static_cast<int32_t>(kPhi))),
      splat(static_cast<int32_t>(static_cast<uint32_t>(i) * kPhi + w.key)));
  __m256i sat = zero, zer = zero, sub = zero, nonf = zero;  // per-lane counts (negated: a true mask is −1)
  for (; i + 8 <= end; i += 8) {
    const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.x + i));
    const __m256i r = kRounding == STOCHASTIC ? mix32(h) : zero;
    __m256i out;
    if (w.scaled) {
      if (w.s_each != nullptr) {
        s = _mm256_loadu_ps(w.s_each + i);
        inv = vf(_mm256_sub_epi32(splat(kInvPow2Bits), vi(s)));
      }
      const __m256i q = round8<kRounding, kFlags>(vi(_mm256_mul_ps(vf(xb), s)), r, p, q_road);
      if (w.pow2) {
        out = vi(_mm256_mul_ps(vf(q), inv));
      } else {  // float64 division, rounded once to float32 (rounding.unscale)
        const __m256 qf = vf(q);
        const __m256d s_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(s));
        const __m256d s_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1));
        const __m128 lo = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(qf)), s_lo));
        const __m128 hi = _mm256_cvtpd_ps(_mm256_div_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(qf, 1)), s_hi));
        out = vi(_mm256_set_m128(hi, lo));
      }
    } else {
      out = round8<kRounding, kFlags>(xb, r, p, q_road);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.y + i), out);
    if (w.stats) {
      const __m256i ax = _mm256_and_si256(xb, splat(kAbs)), ya = _mm256_and_si256(out, splat(kAbs));
      const __m256i finite = _mm256_cmpgt_epi32(inf, ax);
      const __m256 axs = w.scaled ? _mm256_mul_ps(vf(ax), s) : vf(ax);
      sat = _mm256_sub_epi32(sat, _mm256_and_si256(finite, vi(_mm256_cmp_ps(axs, mx, _CMP_GT_OQ))));
      zer = _mm256_sub_epi32(zer, _mm256_and_si256(_mm256_and_si256(finite, _mm256_cmpgt_epi32(ax, zero)),
                                                   _mm256_cmpeq_epi32(ya, zero)));
      const __m256 yas = w.scaled ? _mm256_mul_ps(vf(ya), s) : vf(ya);
      const __m256i below = _mm256_and_si256(_mm256_cmpgt_epi32(inf, ya), vi(_mm256_cmp_ps(yas, mn, _CMP_LT_OQ)));
      sub = _mm256_sub_epi32(sub, _mm256_andnot_si256(_mm256_cmpeq_epi32(ya, zero), below));
      nonf = _mm256_sub_epi32(nonf, _mm256_andnot_si256(finite, splat(-1)));
    }
    h = _mm256_add_epi32(h, step);
  }
  if (w.stats) {  // each lane counts at most n / 8 < 2^28 elements
    alignas(32) int32_t lanes[4][8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), sat);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), zer);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[2]), sub);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[3]), nonf);
    for (int l = 0; l < 8; ++l) {
      c.saturated += lanes[0][l];
      c.zero += lanes[1][l];
      c.subnormal += lanes[2][l];
      c.nonfinite += lanes[3][l];
    }
  }
#endif
  for (; i < end; ++i) one<kRounding, kFlags>(w, i, c);
}

// A quantizer call's work split: one contiguous part per thread, of equal size (to 16 elements), at least kMinPart
// elements each (below that a fork costs more than it saves). Element i's bits depend on i alone (the hash counts
// elements, the counts are integers, amax a max), so any split gives the same bits.
constexpr int64_t kMinPart = 1 << 13;

int parts_for(int64_t n, int threads) {
  const int64_t most = n / kMinPart;
  const int64_t parts = most < threads ? most : threads;
  return static_cast<int>(parts < 1 ? 1 : parts);  // one part at least, whatever ``threads`` the caller passes
}

inline int64_t part_start(int64_t n, int parts, int64_t k) {
  return k >= parts ? n : (n * k / parts) & ~int64_t{15};
}

template <int kRounding, int kFlags>
void run(const Pass& w, int64_t n, int threads, Counts& total) {
  const int parts = parts_for(n, threads);
  int64_t sat = 0, zer = 0, sub = 0, nonf = 0;
#pragma omp parallel for num_threads(parts) schedule(static) reduction(+ : sat, zer, sub, nonf) if (parts > 1)
  for (int64_t k = 0; k < parts; ++k) {
    Counts c;
    span<kRounding, kFlags>(w, part_start(n, parts, k), part_start(n, parts, k + 1), c);
    sat += c.saturated;
    zer += c.zero;
    sub += c.subnormal;
    nonf += c.nonfinite;
  }
  total.saturated = sat;
  total.zero = zer;
  total.subnormal = sub;
  total.nonfinite = nonf;
}

using Runner = void (*)(const Pass&, int64_t, int, Counts&);

template <int kRounding, int... kFlags>
Runner pick(int flags, std::integer_sequence<int, kFlags...>) {
  Runner table[] = {&run<kRounding, kFlags>...};
  return table[flags];
}

// Nearest uses BIT_ROUND, TIE_FLIP, ZERO_SIGN, SATURATES (the low four flag bits); the others ZERO_SIGN, SATURATES,
// WIDE_QUANTUM. A flag a mode does not use is dropped before the lookup: 16 + 2 · 8 kernels.
Runner runner(int rounding, int flags) {
  const int cut = (flags & ZERO_SIGN ? 1 : 0) | (flags & SATURATES ? 2 : 0) | (flags & WIDE_QUANTUM ? 4 : 0);
  constexpr auto cut_flags = [](int i) {
    return (i & 1 ? ZERO_SIGN : 0) | (i & 2 ? SATURATES : 0) | (i & 4 ? WIDE_QUANTUM : 0);
  };
  switch (rounding) {
    case NEAREST:
      return pick<NEAREST>(flags & 15, std::make_integer_sequence<int, 16>{});
    case STOCHASTIC: {
      static const Runner t[8] = {&run<STOCHASTIC, cut_flags(0)>, &run<STOCHASTIC, cut_flags(1)>,
                                  &run<STOCHASTIC, cut_flags(2)>, &run<STOCHASTIC, cut_flags(3)>,
                                  &run<STOCHASTIC, cut_flags(4)>, &run<STOCHASTIC, cut_flags(5)>,
                                  &run<STOCHASTIC, cut_flags(6)>, &run<STOCHASTIC, cut_flags(7)>};
      return t[cut];
    }
    case TOWARD_ZERO: {
      static const Runner t[8] = {&run<TOWARD_ZERO, cut_flags(0)>, &run<TOWARD_ZERO, cut_flags(1)>,
                                  &run<TOWARD_ZERO, cut_flags(2)>, &run<TOWARD_ZERO, cut_flags(3)>,
                                  &run<TOWARD_ZERO, cut_flags(4)>, &run<TOWARD_ZERO, cut_flags(5)>,
                                  &run<TOWARD_ZERO, cut_flags(6)>, &run<TOWARD_ZERO, cut_flags(7)>};
      return t[cut];
    }
  }
  return nullptr;
}

// max |x| over the finite elements (scaling.finite_amax: on the bits, |x|'s pattern where it is below Inf's).
int32_t amax_bits(const int32_t* x, int64_t n, int threads) {
  const int parts = parts_for(n, threads);
  int32_t best = 0;
#pragma omp parallel for num_threads(parts) schedule(static) reduction(max : best) if (parts > 1)
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t end = part_start(n, parts, k + 1);
    int64_t i = part_start(n, parts, k);
    int32_t m = 0;
#ifdef KERNEL_AVX512
    {
      __m512i v = _mm512_setzero_si512();
      for (; i + 16 <= end; i += 16) {
        const __m512i a = _mm512_and_si512(_mm512_loadu_si512(x + i), wsplat(kAbs));
        v = _mm512_mask_max_epi32(v, _mm512_cmpgt_epi32_mask(wsplat(kInf), a), v, a);
      }
      m = _mm512_reduce_max_epi32(v);
    }
#endif
#ifdef KERNEL_AVX2
    __m256i v = _mm256_setzero_si256();
    for (; i + 8 <= end; i += 8) {
      const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), splat(kAbs));
      v = _mm256_max_epi32(v, _mm256_and_si256(a, _mm256_cmpgt_epi32(splat(kInf), a)));
    }
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
    for (int l = 0; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
#endif
    for (; i < end; ++i) {
      const int32_t a = x[i] & kAbs;
      if (a < kInf && a > m) m = a;
    }
    best = m > best ? m : best;
  }
  return best;
}

// scaling.py's scale_from_amax in float32: s = max / amax (float64 reciprocal rounded to float32, times max) where
// amax is finite and positive, else ``prev``; times 2^-margin; NaN → 1, +Inf → 2^126; clamped to [2^-126, 2^126];
// rounded down to a power of two when ``pow2``.
float scale_from(float amax, float prev, float max, float margin, bool pow2) {
  const bool valid = std::isfinite(amax) && amax > 0.0f;
  float s = valid ? static_cast<float>(1.0 / static_cast<double>(amax)) * max : prev;
  s = s * margin;
  if (std::isnan(s)) s = 1.0f;  // (±Inf: the clamp below does what nan_to_num then clamp do)
  s = s < 0x1p-126f ? 0x1p-126f : (s > 0x1p126f ? 0x1p126f : s);
  return pow2 ? as_f(as_i(s) & kExp) : s;
}

// The scale of kinds tensor (from x's amax, fallback state[0]) and delayed (from the amax history, reduced by max
// when ``reduce_max`` else its front, x's amax where that is not positive; fallback state[0]): scaling.py's
// tensor_scale and delayed_scale, read without updating the state.
float computed_scale(int kind, float amax, bool pow2, const float* consts, const float* state, const float* hist,
                     int64_t hist_len, bool reduce_max) {
  if (kind == KIND_TENSOR) return scale_from(amax, state[0], consts[0], consts[1], pow2);
  float ref = hist[0];
  if (reduce_max) {  // a NaN in the history propagates, as torch's amax does
    for (int64_t i = 1; i < hist_len && !std::isnan(ref); ++i) {
      ref = std::isnan(hist[i]) || hist[i] > ref ? hist[i] : ref;
    }
  }
  return scale_from(ref > 0.0f ? ref : amax, state[0], consts[0], consts[1], pow2);
}

// format.py's FloatFormat.ulp on the float32 bits: 2^(max(floor(log2|x|), emin) − M), the subnormal spacing
// below float32's normals, NaN where x is not finite.
inline float ulp_of(float x, int32_t emin, int32_t mbits) {
  const int32_t e32 = (as_i(x) >> 23) & 0xFF;
  const int32_t k = (e32 - 127 > emin ? e32 - 127 : emin) - mbits;
  const int32_t sub = k + 149 < 0 ? 0 : (k + 149 > 22 ? 22 : k + 149);
  const int32_t bits = k >= -126 ? (k + 127) << 23 : (1 << sub);
  return e32 == 0xFF ? std::numeric_limits<float>::quiet_NaN() : as_f(bits);
}

// What one Adam step with a stiffness S needs besides the tensors (see altgrad_stiff_adam_step).
struct Step {
  float lr_bc1, lr_wd, keep, eps, bc2, beta2, one_minus_beta2, lerp_coeff;
  bool lerp_from_end;  // torch's lerp for a weight >= 0.5: end + (w − 1)(end − start)
  float s, two_minus_m, floor;
  int32_t emin, mbits;
};

// One element of manifold_step_ (kStiff 0: pow2, 1: smooth) or relative_step_ (kStiff 2: |w|), in the operation
// order of their torch.compile'd kernels (the committed records' arithmetic): the stiffness from w before the step;
// the decay w − (lr·wd·S)·w (on the update) or w·(1 − lr·wd) with g·S (on the gradient); lerp for the first moment;
// v·β2 + (g·g)·(1 − β2) with one rounding of the add (inductor emits an FMA for addcmul); then
// w − (lr/bc1·m) / ((√v / bc2 + ε) / S).
template <int kStiff, bool kOnUpdate>
inline void stiff_adam1(const Step& c, float* w, const float* g, float* m, float* v, int64_t i) {
  const float x = w[i];
  float stiff;
  if (kStiff == 0) {
    stiff = ulp_of(x * c.s, c.emin, c.mbits) / c.s;
  } else if (kStiff == 1) {
    const float a = std::fabs(x) * c.two_minus_m;
    stiff = std::isnan(a) || a > c.floor ? a : c.floor;  // torch.maximum: NaN propagates
  } else {
    stiff = std::fabs(x);
  }
  float grad = g[i];
  float decayed;
  if (kOnUpdate) {
    decayed = x - (c.lr_wd * stiff) * x;
  } else {
    grad = grad * stiff;
    decayed = x * c.keep;
  }
  const float mi = m[i];
  const float moment = c.lerp_from_end ? grad + (grad - mi) * c.lerp_coeff : mi + (grad - mi) * c.lerp_coeff;
  const float second = std::fma(grad * grad, c.one_minus_beta2, v[i] * c.beta2);
  float denom = std::sqrt(second) / c.bc2 + c.eps;
  if (kOnUpdate) denom = denom / stiff;
  m[i] = moment;
  v[i] = second;
  w[i] = decayed - (c.lr_bc1 * moment) / denom;
}

#if defined(KERNEL_AVX2) && defined(__FMA__)  // the step's eight lanes need a fused multiply-add
#define STEP_AVX2 1
// ulp_of on eight lanes.
inline __m256 ulp8(__m256 x, const Step& c) {
  const __m256i e32 = _mm256_and_si256(_mm256_srli_epi32(vi(x), 23), splat(0xFF));
  const __m256i k = _mm256_sub_epi32(_mm256_max_epi32(_mm256_sub_epi32(e32, splat(127)), splat(c.emin)),
                                     splat(c.mbits));
  const __m256i sub = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(k, splat(149)), splat(0)), splat(22));
  const __m256i normal = _mm256_slli_epi32(_mm256_add_epi32(k, splat(127)), 23);
  const __m256i bits = _mm256_blendv_epi8(_mm256_sllv_epi32(splat(1), sub), normal,
                                          _mm256_cmpgt_epi32(k, splat(-127)));
  const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  return _mm256_blendv_ps(vf(bits), nan, vf(_mm256_cmpeq_epi32(e32, splat(0xFF))));
}

// Eight elements of stiff_adam1, the same operations lane for lane (each correctly rounded: no contraction but the
// FMA the compiled kernel has too).
template <int kStiff, bool kOnUpdate>
inline void stiff_adam8(const Step& c, float* w, const float* g, float* m, float* v, int64_t i) {
  const __m256 x = _mm256_loadu_ps(w + i);
  const __m256 abs_x = vf(_mm256_and_si256(vi(x), splat(kAbs)));
  __m256 stiff;
  if (kStiff == 0) {
    const __m256 s = _mm256_set1_ps(c.s);
    stiff = _mm256_div_ps(ulp8(_mm256_mul_ps(x, s), c), s);
  } else if (kStiff == 1) {
    const __m256 a = _mm256_mul_ps(abs_x, _mm256_set1_ps(c.two_minus_m));
    const __m256 floor = _mm256_set1_ps(c.floor);
    const __m256 take_a = _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(a, floor, _CMP_GT_OQ));
    stiff = _mm256_blendv_ps(floor, a, take_a);
  } else {
    stiff = abs_x;
  }
  __m256 grad = _mm256_loadu_ps(g + i);
  __m256 decayed;
  if (kOnUpdate) {
    decayed = _mm256_sub_ps(x, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(c.lr_wd), stiff), x));
  } else {
    grad = _mm256_mul_ps(grad, stiff);
    decayed = _mm256_mul_ps(x, _mm256_set1_ps(c.keep));
  }
  const __m256 mi = _mm256_loadu_ps(m + i);
  const __m256 step = _mm256_mul_ps(_mm256_sub_ps(grad, mi), _mm256_set1_ps(c.lerp_coeff));
  const __m256 moment = _mm256_add_ps(c.lerp_from_end ? grad : mi, step);
  const __m256 second = _mm256_fmadd_ps(_mm256_mul_ps(grad, grad), _mm256_set1_ps(c.one_minus_beta2),
                                        _mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(c.beta2)));
  __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(second), _mm256_set1_ps(c.bc2)), _mm256_set1_ps(c.eps));
  if (kOnUpdate) denom = _mm256_div_ps(denom, stiff);
  _mm256_storeu_ps(m + i, moment);
  _mm256_storeu_ps(v + i, second);
  _mm256_storeu_ps(w + i, _mm256_sub_ps(decayed, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c.lr_bc1), moment),
                                                                denom)));
}
#endif

template <int kStiff, bool kOnUpdate>
void stiff_adam(const Step& c, float* w, const float* g, float* m, float* v, int64_t n, int threads) {
  const int parts = parts_for(n, threads);  // each element's step is its own: any split gives the same bits
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
  for (int64_t k = 0; k < parts; ++k) {
    const int64_t end = part_start(n, parts, k + 1);
    int64_t i = part_start(n, parts, k);
#ifdef STEP_AVX2
    for (; i + 8 <= end; i += 8) stiff_adam8<kStiff, kOnUpdate>(c, w, g, m, v, i);
#endif
    for (; i < end; ++i) stiff_adam1<kStiff, kOnUpdate>(c, w, g, m, v, i);
  }
}
}  // namespace

extern "C" {

// The enum table this library was built with (kernel_abi.describe()): native.py checks it at load.
const char* altgrad_abi() { return kAbi; }

// Lanes of the widest vector road: 16 with AVX-512, 8 with AVX2, 1 where the build has only the scalar road.
int altgrad_lanes() {
#ifdef KERNEL_AVX2
#ifdef KERNEL_AVX512
  return 16;
#else
  return 8;
#endif
#else
  return 1;
#endif
}

// One quantizer call on n contiguous float32 values: y = q(x·s)/s (y = q(x) for kind none).
// p: rounding.py's int32 kernel parameters; rounding: 0 nearest, 1 stochastic, 2 toward zero; flags: the Variant's
// (above); seed: the stochastic stream's (rounding.random_bits). kind: 0 none, 1 tensor (s from x's amax, fallback
// state[0]), 2 delayed (s from the amax history ``hist`` of ``hist_len``, reduced by max when reduce_max else its
// front, fallback state[0]; x's amax pushed to the front), 3 given (s = state[0]). consts: [format max, 2^-margin,
// smallest normal]. pow2: s is a power of two (unscale by its reciprocal; the scale functions also round s down to
// one). update: write the new state (kinds 1, 2). stats: NULL, or the 6 STAT_NAMES values to write.
// scale_each: kind 3 with one scale per element (n of them; state and stats unused).
// Returns 0, or −1 for a bad mode or kind.
int altgrad_quant_call(const float* x, float* y, int64_t n, const int32_t* p, int rounding, int flags,
                       int32_t seed, int kind, int pow2, const float* consts, float* state, float* hist,
                       int64_t hist_len, int reduce_max, int update, float* stats, int threads,
                       const float* scale_each) {
  const Runner fn = runner(rounding, flags);
  if (fn == nullptr || kind < KIND_NONE || kind > KIND_GIVEN) return -1;
  if (scale_each != nullptr && (kind != KIND_GIVEN || stats != nullptr)) return -1;
  const int32_t* xb = reinterpret_cast<const int32_t*>(x);
  const bool need_amax = kind == KIND_TENSOR || kind == KIND_DELAYED || stats != nullptr;
  const float amax = need_amax ? as_f(amax_bits(xb, n, threads)) : 0.0f;
  float s = 1.0f;
  if (kind == KIND_TENSOR || kind == KIND_DELAYED) {
    s = computed_scale(kind, amax, pow2 != 0, consts, state, hist, hist_len, reduce_max != 0);
  } else if (kind == KIND_GIVEN && scale_each == nullptr) {
    s = state[0];
  }
  Pass w{xb, reinterpret_cast<int32_t*>(y), p, mix32(static_cast<uint32_t>(seed) ^ 0x5BD1E995u), kind != KIND_NONE,
         pow2 != 0, s, as_f(kInvPow2Bits - as_i(s)), scale_each, stats != nullptr, consts[0], consts[2]};
  Counts c;
  fn(w, n, threads < 1 ? 1 : threads, c);
  if (update && (kind == KIND_TENSOR || kind == KIND_DELAYED)) {
    if (kind == KIND_DELAYED && hist_len > 0) {
      std::memmove(hist + 1, hist, sizeof(float) * (hist_len - 1));
      hist[0] = amax;
    }
    state[0] = s;
  }
  if (stats != nullptr) {  // fractions as float64 count / n rounded to float32 (stats.py)
    const double d = static_cast<double>(n > 0 ? n : 1);
    stats[S_FRAC_SATURATED] = static_cast<float>(static_cast<double>(c.saturated) / d);
    stats[S_FRAC_ZERO] = static_cast<float>(static_cast<double>(c.zero) / d);
    stats[S_FRAC_SUBNORMAL] = static_cast<float>(static_cast<double>(c.subnormal) / d);
    stats[S_NONFINITE] = static_cast<float>(c.nonfinite);
    stats[S_AMAX] = amax;
    stats[S_SCALE] = s;
  }
  return 0;
}

// Flip sums of the flips diagnostic (diagnostics/flip_counts.py, ``segment_sums``) over n weights in segments
// [starts[k], starts[k+1]): per segment, in element order and in float32 as torch's index_add_ accumulates them,
// [flipped, intended != 0, reversed, a·b, a·a, b·b] with a = intended, b = q_after − q_before; and the new direction
// of each weight's last flip (−1/0/+1, int8). sums: n_seg × 6 floats, written.
void altgrad_flip_sums(const float* q_before, const float* q_after, const float* intended,
                       const int8_t* last_direction, int8_t* new_direction, const int64_t* starts, int64_t n_seg,
                       float* sums) {
  // The three counts are kept as integers and the loop has no branch (a flip is a coin toss to the branch predictor:
  // ≈ 5 × slower at a 50 % flip rate). A float32 sum of n ones in element order is min(n, 2^24) (at 2^24, + 1 rounds
  // back down), so each count gives the sequential float32 sum exactly; the dot products stay float32, in order.
  constexpr int64_t kFloatExact = int64_t{1} << 24;
  for (int64_t k = 0; k < n_seg; ++k) {
    int64_t flips = 0, updated = 0, reversed = 0;
    float ab = 0.0f, aa = 0.0f, bb = 0.0f;
    const int64_t end = starts[k + 1];
    for (int64_t i = starts[k]; i < end; ++i) {
      const float b = q_after[i] - q_before[i];
      const int d = static_cast<int>(b > 0.0f) - static_cast<int>(b < 0.0f);  // torch.sign(b).to(int8); NaN → 0
      const int last = last_direction[i];
      const float a = intended[i];
      const int flipped = d != 0;
      flips += flipped;
      updated += a != 0.0f;
      reversed += d * last < 0;  // flipped, against the last flip
      ab = ab + a * b;
      aa = aa + a * a;
      bb = bb + b * b;
      new_direction[i] = static_cast<int8_t>(d + (1 - flipped) * last);  // the flip's direction, else the last one
    }
    float* out = sums + 6 * k;
    out[0] = static_cast<float>(flips < kFloatExact ? flips : kFloatExact);
    out[1] = static_cast<float>(updated < kFloatExact ? updated : kFloatExact);
    out[2] = static_cast<float>(reversed < kFloatExact ? reversed : kFloatExact);
    out[3] = ab;
    out[4] = aa;
    out[5] = bb;
  }
}

// The two ends of a tensor's finite magnitudes, as diagnostics/range_use.py reads them: out[0] the largest finite
// |x| (0 where there is none), out[1] the smallest nonzero finite |x| (+inf where there is none); NaN and ±inf are
// ignored. Min and max are exact in any order, so the lanes give the torch reductions' values.
void altgrad_magnitude_range(const float* x, int64_t n, float* out) {
  const float inf = std::numeric_limits<float>::infinity();
  float hi = 0.0f, lo = inf;
  int64_t i = 0;
#ifdef KERNEL_AVX2
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(kAbs));
  const __m256 vinf = _mm256_set1_ps(inf), zero = _mm256_setzero_ps();
  __m256 vhi = zero, vlo = vinf;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    const __m256 finite = _mm256_cmp_ps(a, vinf, _CMP_LT_OQ);           // false for NaN and inf
    const __m256 nonzero = _mm256_cmp_ps(a, zero, _CMP_GT_OQ);
    vhi = _mm256_max_ps(vhi, _mm256_and_ps(a, finite));                 // non-finite → 0
    vlo = _mm256_min_ps(vlo, _mm256_blendv_ps(vinf, a, _mm256_and_ps(finite, nonzero)));  // zero, non-finite → inf
  }
  alignas(32) float h[8], l[8];
  _mm256_store_ps(h, vhi);
  _mm256_store_ps(l, vlo);
  for (int j = 0; j < 8; ++j) {
    hi = h[j] > hi ? h[j] : hi;
    lo = l[j] < lo ? l[j] : lo;
  }
#endif
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a < inf) {  // finite (NaN compares false)
      hi = a > hi ? a : hi;
      if (a > 0.0f && a < lo) lo = a;
    }
  }
  out[0] = hi;
  out[1] = lo;
}

// The bits diagnostic's elementwise pass over n weights w with their power-of-two scales s and q = Q(w·s) (on the
// grid, unscaled): idx[i] = diagnostics.flip_counts.code_index(q) (int32; INT32_MIN where q is NaN, as torch's
// float → int32 conversion gives) and log2s[i] = diagnostics.stiffness.log2_stiffness(w, s) = log2(ulp_F(w·s) / s),
// with F's emin, mantissa bits, smallest subnormal and normal (+inf without exponent bits) and rank of its max.
// With s a power of two, ulp / s is a power of two (or 0, or not finite), so its log2 is its exponent, exactly what
// torch.log2 returns for it.
void altgrad_bits_pass(const float* w, const float* s, const float* q, int64_t n, int emin, int mbits,
                       float min_subnormal, float min_normal, int32_t top, int32_t* idx, float* log2s) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const uint32_t fmask = (uint32_t{1} << mbits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    // code index: normal 2^e·(1 + f/2^M) has rank (e − emin + 1)·2^M + f, subnormal k·2^(emin−M) rank k
    const float a = std::fabs(q[i]);
    const uint32_t bits = static_cast<uint32_t>(as_i(a));
    int32_t rank;
    if (a >= min_normal) {
      const int32_t e = static_cast<int32_t>((bits >> 23) & 0xFF) - 127;
      const int32_t f = static_cast<int32_t>((bits >> (23 - mbits)) & fmask);
      rank = static_cast<int32_t>(static_cast<uint32_t>(e - emin + 1) * (uint32_t{1} << mbits) +
                                  static_cast<uint32_t>(f));
    } else {
      const float v = a / min_subnormal;  // an integer on the grid; rounded half to even as torch.round
      if (v < 2147483648.0f) {  // false for NaN and the too large: x86's conversion gives INT32_MIN, as in torch
        int32_t t = static_cast<int32_t>(v);
        const float frac = v - static_cast<float>(t);
        if (frac > 0.5f || (frac == 0.5f && (t & 1))) ++t;
        rank = t;
      } else {
        rank = INT32_MIN;
      }
    }
    const uint32_t signed_rank = q[i] < 0.0f ? 0u - static_cast<uint32_t>(rank) : static_cast<uint32_t>(rank);
    idx[i] = static_cast<int32_t>(static_cast<uint32_t>(top) + signed_rank);  // int32 arithmetic wraps, as torch's
    // log2 stiffness: ulp_F(x) = 2^(max(⌊log2|x|⌋, emin) − M) from x's float32 exponent field (FloatFormat.ulp)
    const float x = w[i] * s[i];
    const int32_t e32 = static_cast<int32_t>((static_cast<uint32_t>(as_i(x)) >> 23) & 0xFF);
    const int32_t k = std::max(e32 - 127, emin) - mbits;
    const float ulp = e32 == 0xFF ? nan
                      : k >= -126 ? as_f((k + 127) << 23) : as_f(int32_t{1} << std::min(std::max(k + 149, 0), 22));
    // ulp / s is a power of two, 0, ±inf or NaN: its log2 read off its bits (a subnormal's one set bit)
    const uint32_t y = static_cast<uint32_t>(as_i(ulp / s[i]));
    const uint32_t ey = (y >> 23) & 0xFF, my = y & 0x7FFFFF;
    log2s[i] = ey == 0xFF ? (my != 0 || (y >> 31) ? nan : inf)
               : (y >> 31) && (ey | my) != 0 ? nan  // log2 of a negative number (a negative scale)
               : ey != 0 ? static_cast<float>(static_cast<int32_t>(ey) - 127)
               : my != 0 ? static_cast<float>(__builtin_ctz(my) - 149)
                         : -inf;
  }
}

// The tracked weights of n_members tensors, end to end, into out: member k gives src[k][index[k][j]] for
// j < count[k] (index[k] null: src[k][0 .. count[k]) in order). With before non-null, also diff[i] = out[i] − before[i]
// in float32 (the flips diagnostic's intended update: the stored weights after the optimizer step less before it).
void altgrad_gather(int64_t n_members, const float* const* src, const int64_t* const* index, const int64_t* count,
                    float* out, const float* before, float* diff) {
  int64_t at = 0;
  for (int64_t k = 0; k < n_members; ++k) {
    const float* x = src[k];
    const int64_t* idx = index[k];
    const int64_t n = count[k];
    float* o = out + at;
    if (idx == nullptr) {
      for (int64_t j = 0; j < n; ++j) o[j] = x[j];
    } else {
      for (int64_t j = 0; j < n; ++j) o[j] = x[idx[j]];
    }
    at += n;
  }
  if (before != nullptr) {
    for (int64_t i = 0; i < at; ++i) diff[i] = out[i] - before[i];
  }
}

// One tensor's Adam step with stiffness S, in place on n contiguous float32 values w, g, m (first moment), v (second):
// ManifoldAdamW's ``manifold_step_`` (stiffness 0: pow2, S = ulp_F(w·s)/s; 1: smooth, S = max(|w|·2^−M, ulp_F(0)/s))
// and RelativeAdamW's ``relative_step_`` (2: S = |w|; no scale), bit for bit with their compiled kernels.
// on_update: S multiplies the step (else the gradient). hyper: float32 [lr, weight_decay, 1 − β1^t, √(1 − β2^t), ε].
// The scale s of w's grid: kind 0 none (s = 1), 1 tensor, 2 delayed, as a quantizer call computes it without
// updating (consts, state, hist as in altgrad_quant_call); emin, mbits: the format's. Returns 0, or −1 for a bad
// stiffness or kind.
int altgrad_stiff_adam_step(float* w, const float* g, float* m, float* v, int64_t n, int stiffness, int on_update,
                            const float* hyper, double beta1, double beta2, int32_t emin, int32_t mbits, int kind,
                            int pow2, const float* consts, const float* state, const float* hist, int64_t hist_len,
                            int reduce_max, int threads) {
  if (stiffness < 0 || stiffness > 2 || kind < KIND_NONE || kind > KIND_DELAYED) return -1;
  Step c{};
  c.lr_bc1 = hyper[0] / hyper[2];
  c.lr_wd = hyper[0] * hyper[1];
  c.keep = 1.0f - c.lr_wd;
  c.bc2 = hyper[3];
  c.eps = hyper[4];
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double weight = 1.0 - beta1;  // torch's lerp: start + w(end − start) for |w| < 0.5, else from the end
  c.lerp_from_end = !(std::fabs(weight) < 0.5);
  c.lerp_coeff = static_cast<float>(c.lerp_from_end ? weight - 1.0 : weight);
  c.emin = emin;
  c.mbits = mbits;
  c.s = 1.0f;
  if (stiffness != 2 && kind != KIND_NONE) {
    const float amax = as_f(amax_bits(reinterpret_cast<const int32_t*>(w), n, threads));
    c.s = computed_scale(kind, amax, pow2 != 0, consts, state, hist, hist_len, reduce_max != 0);
  }
  c.two_minus_m = std::ldexp(1.0f, -mbits);
  c.floor = ulp_of(0.0f * c.s, emin, mbits) / c.s;
  const int t = threads < 1 ? 1 : threads;
  const bool up = on_update != 0;
  if (stiffness == 0) {
    up ? stiff_adam<0, true>(c, w, g, m, v, n, t) : stiff_adam<0, false>(c, w, g, m, v, n, t);
  } else if (stiffness == 1) {
    up ? stiff_adam<1, true>(c, w, g, m, v, n, t) : stiff_adam<1, false>(c, w, g, m, v, n, t);
  } else {
    up ? stiff_adam<2, true>(c, w, g, m, v, n, t) : stiff_adam<2, false>(c, w, g, m, v, n, t);
  }
  return 0;
}

}  // extern "C"
