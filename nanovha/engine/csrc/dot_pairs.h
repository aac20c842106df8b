// The VDPBF16PS path of decode_attention.cpp, for bf16 groups of 4 to 16 query heads on a CPU with
// AVX512_BF16 (Zen 4 and later, Cooper Lake, Sapphire Rapids): both products in bf16 pairs on the
// vector unit, two multiply-adds per float lane per instruction, twice the float path's work per op
// and no widening of the rows. The plan times it against the op's default path (kernel.py).
//   scores, 8 positions at a time, the heads as the lanes: s_j[g] += (k_j[2i], k_j[2i+1]) . q_i[g],
//     the key pair broadcast to every lane, q_i (q[g][2i], q[g][2i+1]) a lane per head (zero past G)
//   softmax with the heads as the lanes (weight_pairs): pw[i] lane g holds (p_2i[g], p_2i+1[g])
//   values, the columns of d_v as the lanes: acc[g][16 e ..] += vp[e][i] . pw[i][g], the value pairs
//     of 16 columns (value_pairs) against head g's weight pair, broadcast
// The next block's rows are prefetched and its value pairs made in parts between these steps, as the
// AMX path does (amx_tiles.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/util/BFloat16.h>

#include "bf16_pairs.h"
#include "decode_common.h"

namespace nanovha {

template <int G, int D, int DV>
void attend_chunk_dot(const Chunk<c10::BFloat16, float>& c) {
  constexpr int NP = (D + 1) / 2;  // pairs of d
  constexpr int NV = (DV + 15) / 16;  // slices of 16 columns of d_v
  constexpr int U = 8;  // positions whose scores are summed at once
  constexpr int GB = std::min(G, 8);  // heads whose value accumulators are in registers at once
  constexpr int EB = NV >= 2 ? 2 : 1;  // and slices
  static_assert(G <= 16 && kPairBlock % U == 0 && G % GB == 0);
  alignas(64) __m512i qp[NP];  // [pair i]: lane g (q[g][2i], q[g][2i+1]); zeros past G
  alignas(64) c10::BFloat16 kpad[U][2 * NP] = {};  // the last rows past t1, zero-padded
  alignas(64) __m512i st[2][16];  // raw scores: st[t / 16][t % 16] is position t's, a lane per head
  alignas(64) __m512i pw[kPairBlock / 2];  // weight pairs: pw[i] lane g (p_2i[g], p_2i+1[g])
  alignas(64) __m512i vp[2][NV][kPairBlock / 2];  // two blocks' value pairs: [slice e][pair i]
  alignas(64) float acc[16][NV * 16] = {};  // head g's, columns in value_column order
  V16 m = V16{} - std::numeric_limits<float>::infinity(), l = {};  // lane g: head g's
  for (int i = 0; i < NP; ++i) {
    alignas(64) int32_t lanes[16] = {};
    for (int g = 0; g < G; ++g) {
      lanes[g] = bf16_pair(c.qT, G, g, 2 * i, D);
    }
    qp[i] = _mm512_load_si512(lanes);
  }
  const bool shared = c.v == c.k;  // MLA's: the values are the key rows, in cache once the keys are read
  // rows [r0, r1) of the block from b: K rows prefetched, V rows paired into vp[buf]
  const auto fetch = [&](int64_t b, int r0, int r1, int buf) {
    for (int x = 0; x < D; x += 32) {
      prefetch_rows(c.k + b * c.ks, c.ks, c.t1 - b, x, r0, r1, kNear);
    }
    if (!shared) {
      const int64_t nb = std::min(kPairBlock, c.t1 - b);
      value_pairs<DV>(c.v + b * c.vs, c.vs, nb, c.t1 - b, r0 / 2, r1 / 2, vp[buf]);
    }
  };
  constexpr int F = 2 + 2 + (NV + EB - 1) / EB;  // the next block in F parts, one after each step
  const auto part = [](int f) { return 2 * ((16 * f + F / 2) / F); };
  fetch(c.t0, 0, kPairBlock, 0);
  for (int64_t b0 = c.t0, cur = 0; b0 < c.t1; b0 += kPairBlock, cur ^= 1) {
    const int64_t nb = std::min(kPairBlock, c.t1 - b0);
    const bool next = b0 + kPairBlock < c.t1;
    const int64_t vb = shared ? 0 : cur;  // this block's value pairs
    for (int u0 = 0; u0 < nb; u0 += U) {  // s_(u0 + u) = sum_i (k pair i) . q_i
      const c10::BFloat16* rows = c.k + (b0 + u0) * c.ks;
      int64_t stride = c.ks;
      if (u0 + U > nb) {  // the last rows: copied, so no read passes t1
        for (int u = 0; u < U; ++u) {
          std::memset(kpad[u], 0, sizeof(kpad[u]));
          if (u0 + u < nb) {
            std::memcpy(kpad[u], rows + u * c.ks, D * sizeof(c10::BFloat16));
          }
        }
        rows = kpad[0];
        stride = 2 * NP;
      }
      __m512 a[U];
      for (int u = 0; u < U; ++u) {
        a[u] = _mm512_setzero_ps();
      }
#pragma GCC unroll 4
      for (int i = 0; i < NP; ++i) {
        const __m512bh q = (__m512bh)qp[i];
#pragma GCC unroll 8
        for (int u = 0; u < U; ++u) {
          int32_t pair;  // (k[2i], k[2i+1]) of row u0 + u, to every lane
          std::memcpy(&pair, rows + u * stride + 2 * i, sizeof(pair));
          a[u] = _mm512_dpbf16_ps(a[u], (__m512bh)_mm512_set1_epi32(pair), q);
        }
      }
      for (int u = 0; u < U; ++u) {
        st[(u0 + u) / 16][(u0 + u) % 16] = _mm512_castps_si512(a[u]);
      }
    }
    if (next) fetch(b0 + kPairBlock, part(0), part(1), cur ^ 1);
    V16 most = V16{} - std::numeric_limits<float>::infinity();  // lane g: head g's largest score
    for (int64_t t = 0; t < nb; ++t) {
      const V16 row = (V16)_mm512_castsi512_ps(st[t / 16][t % 16]);
      most = most > row ? most : row;
    }
    if (next) fetch(b0 + kPairBlock, part(1), part(2), cur ^ 1);
    weight_pairs<G, NV, NV * 16>(st, most, c.scale, pw, acc, m, l, nb, [&](int k) {
      if (next) fetch(b0 + kPairBlock, part(2 + k), part(3 + k), cur ^ 1);
    });
    if (shared) {
      value_pairs<DV>(c.v + b0 * c.vs, c.vs, nb, 0, 0, kPairBlock / 2, vp[vb]);  // rows just read
    }
    const int pairs = static_cast<int>((nb + 1) / 2);
    for (int e0 = 0; e0 < NV; e0 += EB) {  // acc[g][16 e ..] += sum_i vp[e][i] . (p_2i[g], p_2i+1[g])
      for (int g0 = 0; g0 < G; g0 += GB) {
        __m512 r[GB][EB];
        for (int g = 0; g < GB; ++g) {
          for (int e = 0; e < EB; ++e) {
            r[g][e] = _mm512_load_ps(&acc[g0 + g][16 * std::min(e0 + e, NV - 1)]);
          }
        }
        for (int i = 0; i < pairs; ++i) {
          const int32_t* w = reinterpret_cast<const int32_t*>(&pw[i]);
#pragma GCC unroll 8
          for (int g = 0; g < GB; ++g) {
            const __m512bh wg = (__m512bh)_mm512_set1_epi32(w[g0 + g]);
            for (int e = 0; e < EB; ++e) {
              const __m512bh v = (__m512bh)vp[vb][std::min(e0 + e, NV - 1)][i];
              r[g][e] = _mm512_dpbf16_ps(r[g][e], v, wg);
            }
          }
        }
        for (int g = 0; g < GB; ++g) {
          for (int e = 0; e < EB && e0 + e < NV; ++e) {
            _mm512_store_ps(&acc[g0 + g][16 * (e0 + e)], r[g][e]);
          }
        }
      }
      if (next) fetch(b0 + kPairBlock, part(4 + e0 / EB), part(5 + e0 / EB), cur ^ 1);
    }
  }
  store_chunk<G, DV, NV * 16>(c, acc, m, l);
}

}  // namespace nanovha
