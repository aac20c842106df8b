// The AMX path of decode_attention.cpp, compiled where this CPU has AMX tiles and AVX512_BF16.
//
// bf16 on a CPU with AMX (Sapphire Rapids and later), up to 16 query heads per KV head (fewer are
// padded with heads of zeros): both products on the tile unit, every tile 16 rows of 64 bytes.
//   scores, 16 positions at a time: C (positions x heads) += 16 K rows' 32 of d times q's pairs (16
//     pair-rows x heads), for each 32 of d. Rows of 64 values or more are read by the tile in place;
//     narrower ones are copied by vector loads first (copy_keys), which stream them faster.
//   softmax over positions: for up to 8 heads, C turned over (turn16) into a row per head, 16
//     positions to a vector (softmax_heads); for more, the heads as the lanes (softmax_positions)
//   values, 32 positions at a time: C (heads x 16 of d_v) += p (heads x 32 positions, bf16 pairs)
//     times the value rows interleaved in pairs (16 pair-rows x 16 of d_v: value_pairs, one unpack per
//     slice, whose columns come in lane order and are put back in order at the end: value_column)
// The next block's rows are read while this one is worked on: its K rows copied and its V rows paired
// in parts, one after each step here (and each 16 positions of softmax_positions), so the loads from
// memory overlap the tile products and the softmax.
// Tiles: scores 0 and 1 (16 positions each), q and the keys in 4, 5, 6 and 7, 2, 3 by turns; values 0 and
// 1 (two slices of d_v), the weights in 4 (heads x 16 pairs of positions), the value pairs in 2 and 3.
// A block is kPairBlock = 32 positions and the weights are rounded to bf16 (bf16_pairs.h); K and V are
// prefetched well ahead into L2 and just ahead into L1.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/util/BFloat16.h>

#include "bf16_pairs.h"
#include "decode_common.h"

namespace nanovha {

// K rows u0..u1-1 from `row`, 32 of d from column 32 kk, copied to `to`, prefetching kNear rows ahead:
// zeros past D and for the rows from n on, which are not read
template <int D>
inline void copy_keys(const c10::BFloat16* row, int64_t ks, int64_t n, int64_t left, int kk,
                      c10::BFloat16 (*to)[32], int u0, int u1) {
  const int width = std::min(32, D - 32 * kk);
  const __mmask32 cols = width == 32 ? ~0u : (1u << width) - 1;
  prefetch_rows(row, ks, left, 32 * kk, u0, u1, kNear);
  for (int u = u0; u < u1; ++u) {
    const c10::BFloat16* k = row + u * ks + 32 * kk;
    _mm512_store_si512(to[u], u < n ? _mm512_maskz_loadu_epi16(cols, k) : _mm512_setzero_si512());
  }
}

// 16 registers of 16 int32, r[i][j] -> r[j][i]: the off-diagonal blocks of size s swapped, s = 8, 4,
// 2, 1. Only the first N rows of the result (N a power of two) are made: stage s needs rows < max(N, s)
template <int N = 16>
inline void turn16(__m512i* r) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 4  // unrolled whole, so the 16 rows stay in registers (a loop kept them in memory)
  for (int s = 8; s >= 1; s /= 2) {
    const int rows = std::max(N, s);
    const __mmask16 upper = _mm512_test_epi32_mask(lane, _mm512_set1_epi32(s));  // lanes j with bit s
    // row i keeps its lanes without bit s and takes row i+s's lanes below; row i+s the reverse
    const __m512i lo = _mm512_mask_add_epi32(lane, upper, lane, _mm512_set1_epi32(16 - s));
    const __m512i hi = _mm512_mask_add_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(s)), upper, lane,
                                             _mm512_set1_epi32(16));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
      if (i & s) continue;
      const __m512i a = r[i], b = r[i + s];
      r[i] = _mm512_permutex2var_epi32(a, lo, b);
      if (i + s < rows) {
        r[i + s] = _mm512_permutex2var_epi32(a, hi, b);
      }
    }
  }
}


// The online softmax of heads g < G over a block of nb raw scores s[g][0..nb) (q . k, before the
// scale > 0), whose largest are `most`; lane g of m, l and most is head g's:
//   m' = max(m, most),  p = e^(scale (s - m')),  l = l e^(scale (m - m')) + sum p
// each head's accumulator row (NV registers) scaled by e^(scale (m - m')), and its weights written as
// bf16 pairs of positions (p_2i, p_2i+1) in p[g] (zeros past nb). m stays in raw units.
template <int G, int NV, int PS>
inline void softmax_heads(const float (*s)[kPairBlock], const V16& most, float scale, int32_t (*p)[kPairBlock / 2],
                          float (*acc)[PS], V16& m, V16& l, int64_t nb) {
  __mmask16 valid[kPairBlock / 16];  // the positions of each 16 that are before nb
  for (int v = 0; v < kPairBlock / 16; ++v) {
    const int64_t n = std::clamp<int64_t>(nb - 16 * v, 0, 16);
    valid[v] = static_cast<__mmask16>((1u << n) - 1);
  }
  alignas(64) V16 part[16];  // head g's sums of weights, lane by lane
  const V16 alpha = raise_max(m, most, scale);
  const float to2 = scale * 1.44269504f;  // e^(scale x) = 2^(to2 x)
  const __m512 by = _mm512_set1_ps(to2);
  const bool full = nb == kPairBlock;
  for (int g = 0; g < 16; ++g) {
    __m512 sum = _mm512_setzero_ps();
    if (g < G) {  // the block's 32 weights -> 16 bf16 pairs; none past nb
      const __m512 top = _mm512_set1_ps(m[g] * to2);
      __m512 lo = exp2_weights(_mm512_fmsub_ps(_mm512_load_ps(&s[g][0]), by, top));
      __m512 hi = exp2_weights(_mm512_fmsub_ps(_mm512_load_ps(&s[g][16]), by, top));
      if (!full) {
        lo = _mm512_maskz_mov_ps(valid[0], lo);
        hi = _mm512_maskz_mov_ps(valid[1], hi);
      }
      sum = _mm512_add_ps(lo, hi);
      _mm512_store_si512(&p[g][0], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    part[g] = (V16)sum;
  }
  l = l * alpha + sum16(part);
  rescale_rows<G, NV, PS>(acc, alpha);
}

// The same softmax with the heads as the lanes, for groups of more than 8, where a row per head costs
// more than it saves: the block's weight pairs (weight_pairs, a row per pair of positions) turned over
// into a row per head, p[g]; rows of heads past G are not kept. then(k) runs after each 16 positions k.
template <int G, int NV, int PS, typename Then>
inline void softmax_positions(const __m512i (*st)[16], const V16& most, float scale, int32_t (*p)[kPairBlock / 2],
                              float (*acc)[PS], V16& m, V16& l, int64_t nb, Then then) {
  __m512i pairs[16];
  weight_pairs<G, NV, PS>(st, most, scale, pairs, acc, m, l, nb, then);
  turn16<16>(pairs);
  for (int g = 0; g < G; ++g) {
    _mm512_store_si512(&p[g][0], pairs[g]);
  }
}

constexpr int kAmxHeads = 16;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

inline bool amx_allowed() {  // Linux lends the tile registers to a process that asks
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

template <int G, int D, int DV>
void attend_chunk_amx(const Chunk<c10::BFloat16, float>& c) {
  constexpr int NK = (D + 31) / 32;
  constexpr int NV = (DV + 15) / 16;
  constexpr bool kInPlace = D >= 64;
  static_assert(G <= kAmxHeads, "heads in a tile's 16 rows");
  static_assert(kPairBlock == 32, "a block: two score tiles of 16 positions, one weight tile of 16 pairs");
  static const TileConfig config;
  alignas(64) int32_t qb[NK][16][kAmxHeads] = {};  // [piece kk][pair i][head g]: q[g][32 kk + 2i], its next
  alignas(64) c10::BFloat16 kc[NK][2][16][32];  // 16 K rows' pieces, copied: zeros past nb and D
  alignas(64) __m512i st[2][16];  // the scores of 16 positions x 16 heads, then turned over
  alignas(64) float s[kAmxHeads][kPairBlock];  // scores, then weights, one row per head
  alignas(64) int32_t p[kAmxHeads][kPairBlock / 2] = {};  // weights as bf16 pairs; heads past G stay zero
  alignas(64) __m512i vp[2][NV][kPairBlock / 2];  // two blocks' value pairs: [slice e][pair i]
  alignas(64) float acc[kAmxHeads][NV * 16] = {};
  V16 m = V16{} - std::numeric_limits<float>::infinity(), l = {};  // lane g: head g's
  for (int g = 0; g < G; ++g) {
    for (int i = 0; 2 * i < D; ++i) {
      qb[i / 16][i % 16][g] = bf16_pair(c.qT, G, g, 2 * i, D);
    }
  }
  // whether the tile reads piece kk of the 16 K rows from 16 j of a block of nb in place
  const auto in_place = [](int64_t nb, int j, int kk) {
    return kInPlace && 16 * j + 16 <= nb && 32 * kk + 32 <= D;
  };
  const bool shared = c.v == c.k;  // MLA's: the values are the key rows, in cache once the keys are read
  // rows [r0, r1) of the block from b: K rows copied into kc (prefetched, where read in place), V rows paired
  const auto fetch = [&](int64_t b, int r0, int r1, int buf) {
    const int64_t nb = std::min(kPairBlock, c.t1 - b);
    for (int j = r0 / 16; j < (r1 + 15) / 16 && 16 * j < nb; ++j) {
      const int u0 = std::max(r0 - 16 * j, 0), u1 = std::min(r1 - 16 * j, 16);
      for (int kk = 0; kk < NK; ++kk) {
        const c10::BFloat16* rows = c.k + (b + 16 * j) * c.ks;
        if (in_place(nb, j, kk)) {
          prefetch_rows(rows, c.ks, c.t1 - b - 16 * j, 32 * kk, u0, u1, 0);  // the rows themselves into L1
        } else {
          copy_keys<D>(rows, c.ks, nb - 16 * j, c.t1 - b - 16 * j, kk, kc[kk][j], u0, u1);
        }
      }
    }
    if (!shared) {
      value_pairs<DV>(c.v + b * c.vs, c.vs, nb, c.t1 - b, r0 / 2, r1 / 2, vp[buf]);
    }
  };
  // the next block is fetched in F parts, one after each step below: part f is its rows [part(f), part(f + 1))
  constexpr int S = G > 8 ? 2 : 1;  // parts in the softmax: after each 16 positions of softmax_positions
  constexpr int F = 2 + S + (NV + 1) / 2;
  const auto part = [](int f) { return 2 * ((16 * f + F / 2) / F); };
  fetch(c.t0, 0, kPairBlock, 0);
  _tile_loadconfig(&config);
  // Each part of the next block is fetched once this block has read what it overwrites (kc once the score
  // tiles are loaded; vp is two buffers, or one for MLA's, paired from the rows this block just read), so
  // the loads from memory stay in flight under this block's work
  for (int64_t b0 = c.t0, cur = 0; b0 < c.t1; b0 += kPairBlock, cur ^= 1) {
    const int64_t nb = std::min(kPairBlock, c.t1 - b0);
    const int groups = static_cast<int>((nb + 15) / 16);
    const bool next = b0 + kPairBlock < c.t1;
    const int64_t vb = shared ? 0 : cur;  // this block's value pairs
    _tile_zero(0);
    _tile_zero(1);
    for (int kk = 0; kk < NK; ++kk) {  // s^T[16 j + x, g] += k_(16 j + x) . q[g], 32 of d at a time
      const c10::BFloat16* keys[2];  // each 16 rows' piece: in place, or copied
      int64_t stride[2];
      for (int j = 0; j < groups; ++j) {
        keys[j] = in_place(nb, j, kk) ? c.k + (b0 + 16 * j) * c.ks + 32 * kk : kc[kk][j][0];
        stride[j] = in_place(nb, j, kk) ? c.ks * 2 : 64;
      }
      if (kk % 2 == 0) {  // q and the keys alternate between two sets of tiles, so no load waits for the
        _tile_loadd(4, qb[kk], 64);  // product before it to read its tile
        _tile_loadd(5, keys[0], stride[0]);  // each 16 keys in a tile of their own
        _tile_dpbf16ps(0, 5, 4);
        if (groups > 1) {
          _tile_loadd(6, keys[1], stride[1]);
          _tile_dpbf16ps(1, 6, 4);
        }
      } else {
        _tile_loadd(7, qb[kk], 64);
        _tile_loadd(2, keys[0], stride[0]);
        _tile_dpbf16ps(0, 2, 7);
        if (groups > 1) {
          _tile_loadd(3, keys[1], stride[1]);
          _tile_dpbf16ps(1, 3, 7);
        }
      }
    }
    if (next) fetch(b0 + kPairBlock, part(0), part(1), cur ^ 1);
    _tile_stored(0, st[0], 64);
    _tile_stored(1, st[1], 64);
    V16 most = V16{} - std::numeric_limits<float>::infinity();  // lane g: head g's largest score
    for (int64_t t = 0; t < nb; ++t) {
      const V16 row = (V16)_mm512_castsi512_ps(st[t / 16][t % 16]);
      most = most > row ? most : row;
    }
    if (next) fetch(b0 + kPairBlock, part(1), part(2), cur ^ 1);
    if constexpr (G > 8) {
      softmax_positions<G, NV, NV * 16>(st, most, c.scale, p, acc, m, l, nb, [&](int k) {
        if (next) fetch(b0 + kPairBlock, part(2 + k), part(3 + k), cur ^ 1);
      });
    } else {
      for (int j = 0; j < groups; ++j) {  // turned over: a row of 16 positions per head
        turn16<(G > 4 ? 8 : G > 2 ? 4 : G > 1 ? 2 : 1)>(st[j]);
        for (int g = 0; g < G; ++g) {
          _mm512_store_si512(&s[g][16 * j], st[j][g]);
        }
      }
      if (next) fetch(b0 + kPairBlock, part(2), part(3), cur ^ 1);
      softmax_heads<G, NV, NV * 16>(s, most, c.scale, p, acc, m, l, nb);
    }
    if (shared) {
      value_pairs<DV>(c.v + b0 * c.vs, c.vs, nb, 0, 0, kPairBlock / 2, vp[vb]);  // rows just read: no prefetch
    }
    _tile_loadd(4, &p[0][0], kPairBlock * 2);  // the weights: heads x 16 pairs of positions
    for (int e = 0; e < NV; e += 2) {  // acc[:, 16 e ..] += p times the value pairs, two slices at a time,
      const bool two = e + 1 < NV;     // each operand in a tile of its own
      _tile_loadd(0, &acc[0][16 * e], NV * 64);
      _tile_loadd(2, vp[vb][e], 64);
      _tile_dpbf16ps(0, 4, 2);
      if (two) {
        _tile_loadd(1, &acc[0][16 * e + 16], NV * 64);
        _tile_loadd(3, vp[vb][e + 1], 64);
        _tile_dpbf16ps(1, 4, 3);
      }
      _tile_stored(0, &acc[0][16 * e], NV * 64);
      if (two) {
        _tile_stored(1, &acc[0][16 * e + 16], NV * 64);
      }
      if (next) fetch(b0 + kPairBlock, part(2 + S + e / 2), part(3 + S + e / 2), cur ^ 1);
    }
  }
  _tile_release();
  store_chunk<G, DV, NV * 16>(c, acc, m, l);
}

}  // namespace nanovha
