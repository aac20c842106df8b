// What the two bf16 paths of decode_attention.cpp share (AMX tiles, amx_tiles.h, and VDPBF16PS,
// dot_pairs.h), compiled where this CPU has AVX512_BF16: q as bf16 pairs, the prefetch of rows, the
// online softmax's weights with the heads as the lanes, and the value rows interleaved in pairs of
// positions. Both paths take a block of kPairBlock positions at a time, and both products multiply
// pairs: a lane holds (x_2i, x_2i+1) and meets its partner pair in one multiply-add of two products.
// The weights p are rounded to bf16 for their product, as PyTorch's flash kernel rounds them; the
// scores are exact products summed in float.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/util/BFloat16.h>

#include "decode_common.h"

namespace nanovha {

// A block of 32 positions: its rows, the next block's on their way in and the value pairs stay in L1
// for rows up to 144 wide, which a block of 64 overflowed (docs/benchmarks.md)
constexpr int64_t kPairBlock = 32;
constexpr int64_t kAhead = 512;  // rows a prefetch into L2 runs ahead of the row read
constexpr int64_t kNear = 32;  // and one into L1

// (q[g][d], q[g][d + 1]) of qT (D, G) floats as a bf16 pair, zero past D: exact, as q came from bf16
inline int32_t bf16_pair(const float* qT, int G, int g, int d, int D) {
  uint32_t lo, hi = 0;
  std::memcpy(&lo, qT + d * G + g, 4);
  if (d + 1 < D) {
    std::memcpy(&hi, qT + (d + 1) * G + g, 4);
  }
  return static_cast<int32_t>((lo >> 16) | (hi & 0xffff0000u));
}

// The 64 bytes from column x of rows u0..u1-1 from `row` (stride rs), of which `left` are before the
// chunk's end: prefetched into L1 `near` rows ahead and into L2 kAhead rows ahead (none near the end).
// Always inlined: GCC counts a function that only prefetches as free of side effects and may drop its call.
__attribute__((always_inline)) inline void prefetch_rows(const c10::BFloat16* row, int64_t rs, int64_t left, int x,
                                                         int64_t u0, int64_t u1, int64_t near) {
  for (int64_t u = u0; u < u1 && u + kAhead < left; ++u) {
    __builtin_prefetch(row + (u + kAhead) * rs + x, 0, 1);
    __builtin_prefetch(row + (u + near) * rs + x, 0, 3);
  }
}

// 2^t for finite t <= 0, to 7.5e-5 relative: below the bf16 rounding (4e-3) the weights get for their
// product. 2^n 2^f with n = floor(t), f = t - n in [0, 1) (one VREDUCEPS), and 2^f by the cubic of
// least relative error there; VSCALEFPS multiplies by 2^floor(t)
inline __m512 exp2_weights(__m512 t) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 e = _mm512_fmadd_ps(f, _mm512_set1_ps(7.8023702e-2f), _mm512_set1_ps(2.2606678e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.9583452e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(9.9992502e-1f));
  return _mm512_scalef_ps(e, t);
}

// m' = max(m, most), lane by lane (a head each), and e^(scale (m - m')), by which the head's running
// sum and accumulators are scaled
inline V16 raise_max(V16& m, const V16& most, float scale) {
  const V16 m_old = m;
  m = m_old > most ? m_old : most;
  return Lanes<16>::exp_le0((m_old - m) * scale);
}

// acc[g] *= alpha[g] for the heads g < G whose maximum moved (most blocks move few or none)
template <int G, int NV, int PS>
inline void rescale_rows(float (*acc)[PS], const V16& alpha) {
  for (int g = 0; g < G; ++g) {
    for (int e = 0; e < NV && alpha[g] != 1.0f; ++e) {
      const __m512 scaled = _mm512_mul_ps(_mm512_load_ps(&acc[g][16 * e]), _mm512_set1_ps(alpha[g]));
      _mm512_store_ps(&acc[g][16 * e], scaled);
    }
  }
}

// The weights of a block with the heads as the lanes: st[j][u] holds the raw scores (q . k, before
// the scale > 0) of position 16 j + u, a lane per head, whose largest are `most`; lane g of m and l is
// head g's:
//   m' = max(m, most),  p = e^(scale (s - m')),  l = l e^(scale (m - m')) + sum p
// each head's accumulator row (NV registers) scaled by e^(scale (m - m')). pairs[i] gets the weights of
// positions 2i and 2i+1 as bf16 pairs, lane g (p_2i[g], p_2i+1[g]); zeros past nb. m stays in raw
// units. then(k) runs after each 16 positions k (the caller's fetch).
template <int G, int NV, int PS, typename Then>
inline void weight_pairs(const __m512i (*st)[16], const V16& most, float scale, __m512i* pairs,
                         float (*acc)[PS], V16& m, V16& l, int64_t nb, Then then) {
  alignas(64) static const int16_t order[32] = {  // (w_2i[g], w_2i+1[g]) for g = 0..15
      0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
      15, 31};
  const __m512i pairs_of_heads = _mm512_load_si512(order);
  const V16 alpha = raise_max(m, most, scale);
  const float to2 = scale * 1.44269504f;  // e^(scale x) = 2^(to2 x)
  const __m512 by = _mm512_set1_ps(to2), top = _mm512_mul_ps((__m512)m, by);
  const bool full = nb == kPairBlock;
  const auto weights = [&](int64_t t) {  // position t's weights, a lane per head; none past nb
    const __m512 w = exp2_weights(_mm512_fmsub_ps(_mm512_castsi512_ps(st[t / 16][t % 16]), by, top));
    return full ? w : _mm512_maskz_mov_ps(t < nb ? 0xffff : 0, w);
  };
  __m512 sum = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int i = 0; i < kPairBlock / 2; ++i) {
    const __m512 w0 = weights(2 * i), w1 = weights(2 * i + 1);
    sum = _mm512_add_ps(sum, _mm512_add_ps(w0, w1));
    pairs[i] = _mm512_permutexvar_epi16(pairs_of_heads, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
    if (i % 8 == 7) {
      then(i / 8);
    }
  }
  l = l * alpha + (V16)sum;
  rescale_rows<G, NV, PS>(acc, alpha);
}

// The column of d_v that slot x of slice e of the value pairs holds (value_pairs' order): each 32
// columns are interleaved by 128-bit lanes, 4 of each 8 columns to a slice
template <int DV>
constexpr int value_column(int e, int x) {
  constexpr int NV = (DV + 15) / 16;
  const int base = 16 * (e & ~1), lane = x / 4, w = x % 4;
  if (NV % 2 == 1 && e == NV - 1) {  // a last slice of its own: 16 columns, two lanes of 8
    return base + 8 * (lane % 2) + 4 * (lane / 2) + w;
  }
  return base + 8 * lane + 4 * (e & 1) + w;
}

// The value rows of positions 2i and 2i+1 of a block (rows past nb read as zeros) interleaved, 16
// columns of d_v to a register, for the pairs i0 <= i < i1: vp[e][i] holds (v_2i[c],
// v_2i+1[c]) for the 16 columns c = value_column(e, x), x = 0..15, made by one unpack each. Rows ahead
// are prefetched as prefetch_rows does (left 0: none)
template <int DV>
inline void value_pairs(const c10::BFloat16* v, int64_t vs, int64_t nb, int64_t left, int i0, int i1,
                        __m512i (*vp)[kPairBlock / 2]) {
  constexpr int NV = (DV + 15) / 16;
  for (int64_t i = std::max<int64_t>(i0, (nb + 1) / 2); i < i1; ++i) {  // past nb
    for (int e = 0; e < NV; ++e) {
      vp[e][i] = _mm512_setzero_si512();
    }
  }
  for (int64_t i = i0; i < std::min<int64_t>(i1, (nb + 1) / 2); ++i) {
    const c10::BFloat16* v0 = v + 2 * i * vs;
    const c10::BFloat16* v1 = v0 + vs;
    const bool odd = 2 * i + 1 < nb;
    for (int x = 0; x < DV; x += 32) {  // each 64 bytes of both rows
      prefetch_rows(v, vs, left, x, 2 * i, 2 * i + 2, kNear);
    }
#pragma GCC unroll 8
    for (int e = 0; e + 1 < NV; e += 2) {  // 32 columns: two slices
      const int width = std::min(32, DV - 16 * e);
      const __mmask32 cols = width == 32 ? ~0u : (1u << width) - 1;
      const __m512i a = _mm512_maskz_loadu_epi16(cols, v0 + 16 * e);
      const __m512i b = odd ? _mm512_maskz_loadu_epi16(cols, v1 + 16 * e) : _mm512_setzero_si512();
      vp[e][i] = _mm512_unpacklo_epi16(a, b);
      vp[e + 1][i] = _mm512_unpackhi_epi16(a, b);
    }
    if constexpr (NV % 2 == 1) {  // the last 16 columns or fewer
      const int width = DV - 16 * (NV - 1);
      const __mmask16 cols = width == 16 ? 0xffff : (1u << width) - 1;
      const __m256i a = _mm256_maskz_loadu_epi16(cols, v0 + 16 * (NV - 1));
      const __m256i b = odd ? _mm256_maskz_loadu_epi16(cols, v1 + 16 * (NV - 1)) : _mm256_setzero_si256();
      __m256i* row = reinterpret_cast<__m256i*>(&vp[NV - 1][i]);
      _mm256_store_si256(row, _mm256_unpacklo_epi16(a, b));
      _mm256_store_si256(row + 1, _mm256_unpackhi_epi16(a, b));
    }
  }
}

// A chunk's results into c: m in the units of the scaled scores (as the other paths), l, and each head's
// accumulator row (PS floats, slices in value_pairs' column order) back in the columns of d_v
template <int G, int DV, int PS>
inline void store_chunk(const Chunk<c10::BFloat16, float>& c, const float (*acc)[PS], const V16& m,
                        const V16& l) {
  constexpr int NV = (DV + 15) / 16;
  for (int g = 0; g < G; ++g) {
    c.m[g] = m[g] * c.scale;
    c.l[g] = l[g];
    for (int e = 0; e < NV; ++e) {
      for (int x = 0; x < 16; ++x) {
        const int col = value_column<DV>(e, x);
        if (col < DV) {
          c.acc[g * DV + col] = acc[g][16 * e + x];
        }
      }
    }
  }
}

}  // namespace nanovha
