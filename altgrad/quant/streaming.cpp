// quantize for large float32 tensors, writing the result with streaming stores: the same operations as rounding.py's
// kernel (``_round_bits``, ``_finish``, ``random_bits``) on the float32 bit patterns as int32, so the same bits for
// every format, rounding mode and seed. Lane for lane, except where an exact shortcut gives the same value with fewer
// vector operations (k·q as one float multiply-add; the hash key folded into the element counter).
//
// Nearest takes the one-add road (|x| + C − C, C = 2^(e+23−M), e = |x|'s binade held in [emin, emax]) or, for
// ``bit_round`` variants, the bias-and-mask road with the subnormal one-add; stochastic and toward-zero cut the
// normal region's bits and rebuild the fixed-point region below the smallest normal from k = floor(|x| / q)
// (stochastic: + 1 when frac(|x| / q) > u, u from a counter-based hash of (seed, element index)). Then saturation
// or overflow, the sign and NaN. Float adds are AVX intrinsics, so no compiler flag can reassociate (x + C) − C.
// What differs from the inductor kernel is the store: _mm256_stream_si256 writes whole cache lines to memory without
// first reading them (an ordinary store reads every line it writes: a third memory stream), so an output far larger
// than the caches costs a read and a write per element instead of two reads and a write.
// Built by inductor's C++ code cache with its flags (-O3, the machine's vector ISA, OpenMP); without AVX2
// ``streaming_lanes`` returns 0 and Python keeps the inductor kernel.
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <omp.h>
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#define ALTGRAD_AVX2 1
#endif

// Parameter slots: the order of rounding.py's _P_* constants.
enum { P_SHIFT, P_LOW, P_HALF, P_LSB, P_FLIP, P_MAX, P_OVF, P_OVF_INF, P_MAGIC, P_EMIN_BITS, P_Y1, P_Y2,
       P_EMAX_BITS, P_CSHIFT };
enum { NEAREST = 0, STOCHASTIC = 1, TOWARD_ZERO = 2 };  // rounding.py's ROUNDINGS order
// Variant flags (rounding.Variant), one bit each.
enum { BIT_ROUND = 1, TIE_FLIP = 2, ZERO_SIGN = 4, SATURATES = 8, WIDE_QUANTUM = 16 };

#ifdef ALTGRAD_AVX2
namespace {

constexpr int32_t kAbs = 0x7FFFFFFF, kInf = 0x7F800000, kNan = 0x7FC00000, kExp = 0x7F800000;

struct Params {
  __m256i shift, low, not_low, half, lsb, flip, max, ovf, ovf_inf, magic, emin, emin_less1, emax, cshift;
  __m256 y1, y2, q;  // q: the quantum below the smallest normal (0 where it is not a normal float32)
};

inline __m256 as_float(__m256i v) { return _mm256_castsi256_ps(v); }
inline __m256i as_int(__m256 v) { return _mm256_castps_si256(v); }
inline __m256i splat(int32_t v) { return _mm256_set1_epi32(v); }

// murmur3's fmix32 on 8 lanes (``rounding._mix32``: its masked arithmetic shifts are logical shifts).
inline __m256i mix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, splat(static_cast<int32_t>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, splat(static_cast<int32_t>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// 8 results from 8 inputs; ``r``: the random bits of these elements (stochastic only).
template <int kRounding, int kFlags>
inline __m256i round8(__m256i bits, __m256i r, const Params& p) {
  const __m256i sign = _mm256_and_si256(bits, splat(INT32_MIN));
  const __m256i a0 = _mm256_and_si256(bits, splat(kAbs));
  const __m256i inf = splat(kInf);
  __m256i m;
  if constexpr (kRounding == NEAREST && !(kFlags & BIT_ROUND)) {
    // C = 2^(e+23−M): in [C, 2C) float32's spacing is the format's quantum, so + C rounds to nearest-even there.
    const __m256i e = _mm256_min_epi32(_mm256_max_epi32(_mm256_and_si256(a0, splat(kExp)), p.emin), p.emax);
    const __m256 c = as_float(_mm256_add_epi32(e, p.cshift));
    m = as_int(_mm256_sub_ps(_mm256_add_ps(as_float(a0), c), c));
  } else {
    // rounding.py first clamps |x| to Inf (a NaN payload would overflow its adds); a NaN lane's result is replaced
    // by NaN at the end whatever it is, so the roads below take a0 unclamped (one vector operation fewer)
    __m256i normal, sub;
    if constexpr (kRounding == NEAREST) {
      __m256i parity = _mm256_srav_epi32(a0, p.shift);
      if constexpr (kFlags & TIE_FLIP) parity = _mm256_xor_si256(parity, p.flip);
      const __m256i bias = _mm256_add_epi32(p.half, _mm256_and_si256(parity, p.lsb));
      normal = _mm256_and_si256(_mm256_add_epi32(a0, bias), p.not_low);
      const __m256 c = as_float(p.magic);  // below the smallest normal: fixed point at quantum q
      sub = as_int(_mm256_sub_ps(_mm256_add_ps(as_float(a0), c), c));
    } else {
      const __m256i cut = kRounding == STOCHASTIC ? _mm256_add_epi32(a0, _mm256_and_si256(r, p.low)) : a0;
      normal = _mm256_and_si256(cut, p.not_low);
      // y = |x| / q as two exact power-of-two multiplies, k = floor(y) (+ 1 with probability frac(y)). rounding.py
      // clamps |x| to the smallest normal first; lanes at or above it take ``normal`` below whatever y is, so the
      // clamp is left out here too (measured with the one above: 4 % less time for stochastic rounding)
      __m256 y = _mm256_mul_ps(as_float(a0), p.y1);
      if constexpr (kFlags & WIDE_QUANTUM) y = _mm256_mul_ps(y, p.y2);
      const __m256 yi = _mm256_floor_ps(y);
      __m256 up = _mm256_setzero_ps();  // all ones where k = floor(y) takes + 1
      if constexpr (kRounding == STOCHASTIC) {
        const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
        up = _mm256_cmp_ps(_mm256_sub_ps(y, yi), u, _CMP_GT_OQ);
      }
      if constexpr (kFlags & WIDE_QUANTUM) {  // q is below float32's normals: k·q as rounding.py forms it
        const __m256i k = _mm256_sub_epi32(_mm256_cvttps_epi32(yi), as_int(up));  // true = −1
        sub = as_int(_mm256_sub_ps(as_float(_mm256_add_epi32(p.magic, k)), as_float(p.magic)));
      } else {
        // k·q straight from the float k: exact (k < 2^M ≤ 2^23 and q a normal power of two), so the same value as
        // rounding.py's C + k·q − C, in two vector operations fewer
        const __m256 q_if_up = _mm256_and_ps(up, p.q);
#ifdef __FMA__
        sub = as_int(_mm256_fmadd_ps(yi, p.q, q_if_up));
#else
        sub = as_int(_mm256_add_ps(_mm256_mul_ps(yi, p.q), q_if_up));
#endif
      }
    }
    m = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(a0, p.emin_less1));  // |x| ≥ min normal: normal
  }
  if constexpr (kFlags & SATURATES) {
    m = _mm256_min_epi32(m, p.max);
  } else {
    const __m256i special = _mm256_blendv_epi8(p.ovf, p.ovf_inf, _mm256_cmpgt_epi32(a0, splat(kInf - 1)));
    m = _mm256_blendv_epi8(m, special, _mm256_cmpgt_epi32(m, p.max));
  }
  __m256i out;
  if constexpr (kFlags & ZERO_SIGN) {  // a zero result drops its sign
    out = _mm256_or_si256(m, _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()), sign));
  } else {
    out = _mm256_or_si256(m, sign);
  }
  return _mm256_blendv_epi8(out, splat(kNan), _mm256_cmpgt_epi32(a0, inf));
}

// r of element i: fmix32(i·φ + key), φ = 0x9E3779B1 (``rounding.random_bits``); h holds i·φ + key for lanes
// i .. i + 7 (the key folded into the counter: one vector operation fewer per 8 elements).
template <int kRounding>
inline __m256i random8(__m256i h) {
  if constexpr (kRounding == STOCHASTIC) return mix32(h);
  return _mm256_setzero_si256();
}

constexpr uint32_t kPhi = 0x9E3779B1u;
// How far ahead of the loads a span asks for its input: 32 cache lines. The hardware prefetcher alone leaves this
// loop ≈ 20 % slower than a streaming copy (measured 1, 2, 4 and 8 KiB ahead: 2 and 4 KiB reach the copy's time).
constexpr int kPrefetchBytes = 2048;

// Elements 8·begin .. 8·end − 1; h holds the counters of the first 8, ``step`` advances them by 8 elements.
template <int kRounding, int kFlags, bool kStream>
inline void span(const int32_t* x, int32_t* y, int64_t begin, int64_t end, __m256i h, __m256i step, const Params& p) {
  const auto one = [&](int64_t v) {
    const __m256i out = round8<kRounding, kFlags>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * v)),
                                                  random8<kRounding>(h), p);
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(y + 8 * v), out);
    } else {
      _mm256_store_si256(reinterpret_cast<__m256i*>(y + 8 * v), out);
    }
    h = _mm256_add_epi32(h, step);
  };
  int64_t v = begin;
  for (; v + 1 < end; v += 2) {  // two vectors = one 64-byte line of input per prefetch (a hint: never faults)
    _mm_prefetch(reinterpret_cast<const char*>(x + 8 * v) + kPrefetchBytes, _MM_HINT_T0);
    one(v);
    one(v + 1);
  }
  if (v < end) one(v);
}

template <int kRounding, int kFlags>
void run(const int32_t* x, int32_t* y, int64_t n, const Params& p, uint32_t key32, bool stream, int threads) {
  const int64_t vecs = n / 8;
  const __m256i lanes = _mm256_add_epi32(  // i·φ + key for i = 0 .. 7
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), splat(static_cast<int32_t>(kPhi))),
      splat(static_cast<int32_t>(key32)));
  const __m256i step = splat(static_cast<int32_t>(8u * kPhi));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = vecs * t / nt, end = vecs * (t + 1) / nt;  // one contiguous span per thread
    const __m256i h = _mm256_add_epi32(lanes, splat(static_cast<int32_t>(static_cast<uint32_t>(8 * begin) * kPhi)));
    if (stream) {
      span<kRounding, kFlags, true>(x, y, begin, end, h, step, p);
      _mm_sfence();  // streaming stores are weakly ordered: make them visible before the tensor is read
    } else {  // a freshly mapped output: its page faults bring each page into the cache zeroed, so plain stores
      span<kRounding, kFlags, false>(x, y, begin, end, h, step, p);
    }
  }
  if (const int64_t done = vecs * 8; done < n) {  // the last n mod 8 elements, padded to a vector
    alignas(32) int32_t buf[8] = {0};
    std::memcpy(buf, x + done, sizeof(int32_t) * (n - done));
    const __m256i h = _mm256_add_epi32(lanes, splat(static_cast<int32_t>(static_cast<uint32_t>(done) * kPhi)));
    const __m256i out = round8<kRounding, kFlags>(_mm256_load_si256(reinterpret_cast<const __m256i*>(buf)),
                                                  random8<kRounding>(h), p);
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf), out);
    std::memcpy(y + done, buf, sizeof(int32_t) * (n - done));
  }
}

using Kernel = void (*)(const int32_t*, int32_t*, int64_t, const Params&, uint32_t, bool, int);

template <int kRounding, int... kFlags>
constexpr std::array<Kernel, sizeof...(kFlags)> table(std::integer_sequence<int, kFlags...>) {
  return {&run<kRounding, kFlags>...};
}

// Nearest uses BIT_ROUND, TIE_FLIP, ZERO_SIGN, SATURATES (the low four flag bits index its table); the others
// ZERO_SIGN, SATURATES, WIDE_QUANTUM. A flag a mode does not use is dropped before the lookup: 16 + 2 · 8 kernels.
constexpr auto kNearest = table<NEAREST>(std::make_integer_sequence<int, 16>{});
template <int kRounding, int... kI>
constexpr std::array<Kernel, 8> cut_table(std::integer_sequence<int, kI...>) {
  return {&run<kRounding, (kI & 1 ? ZERO_SIGN : 0) | (kI & 2 ? SATURATES : 0) | (kI & 4 ? WIDE_QUANTUM : 0)>...};
}
constexpr auto kStochastic = cut_table<STOCHASTIC>(std::make_integer_sequence<int, 8>{});
constexpr auto kTowardZero = cut_table<TOWARD_ZERO>(std::make_integer_sequence<int, 8>{});

}  // namespace
#endif

extern "C" {

// Lanes of the streaming kernel (8), or 0 where it was built without AVX2 (then it must not be called).
int streaming_lanes() {
#ifdef ALTGRAD_AVX2
  return 8;
#else
  return 0;
#endif
}

// y[i] = the rounding of x[i] for i < n; y must be 32-byte aligned. ``p``: the kernel's int32 parameters
// (rounding._params); ``rounding``: 0 nearest, 1 stochastic, 2 toward zero; ``flags``: the Variant's, as above;
// ``seed``: the stochastic stream's seed (rounding.random_bits), unused otherwise; ``stream``: streaming stores (else
// ordinary ones). Returns 0, or −1 for a bad mode.
int quantize_streaming(const int32_t* x, int32_t* y, int64_t n, const int32_t* p, int rounding, int flags,
                       int32_t seed, int stream, int threads) {
#ifdef ALTGRAD_AVX2
  // C = 2^(qexp+23) = magic: q = 2^qexp, a normal float32 from qexp = −126 up
  const int32_t qexp = ((p[P_MAGIC] >> 23) & 0xFF) - 127 - 23;
  const int32_t q_bits = qexp >= -126 ? (qexp + 127) << 23 : 0;
  const Params params{splat(p[P_SHIFT]), splat(p[P_LOW]), splat(~p[P_LOW]), splat(p[P_HALF]), splat(p[P_LSB]),
                      splat(p[P_FLIP]), splat(p[P_MAX]), splat(p[P_OVF]), splat(p[P_OVF_INF]), splat(p[P_MAGIC]),
                      splat(p[P_EMIN_BITS]), splat(p[P_EMIN_BITS] - 1), splat(p[P_EMAX_BITS]), splat(p[P_CSHIFT]),
                      as_float(splat(p[P_Y1])), as_float(splat(p[P_Y2])), as_float(splat(q_bits))};
  const uint32_t key = mix32(static_cast<uint32_t>(seed) ^ 0x5BD1E995u);
  // a subnormal q takes the magic-number road of the WIDE_QUANTUM kernels (there y2 = 1, an exact multiply)
  const bool magic_road = (flags & WIDE_QUANTUM) || q_bits == 0;
  const int cut = (flags & ZERO_SIGN ? 1 : 0) | (flags & SATURATES ? 2 : 0) | (magic_road ? 4 : 0);
  switch (rounding) {
    case NEAREST:
      kNearest[flags & (BIT_ROUND | TIE_FLIP | ZERO_SIGN | SATURATES)](x, y, n, params, key, stream != 0, threads);
      return 0;
    case STOCHASTIC:
      kStochastic[cut](x, y, n, params, key, stream != 0, threads);
      return 0;
    case TOWARD_ZERO:
      kTowardZero[cut](x, y, n, params, key, stream != 0, threads);
      return 0;
  }
#else
  (void)x, (void)y, (void)n, (void)p, (void)flags, (void)seed, (void)stream, (void)threads, (void)rounding;
#endif
  return -1;
}

}  // extern "C"
