// The AMX path of decode_attention.cpp, compiled where this CPU has AMX tiles and AVX512_BF16.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include <c10/util/BFloat16.h>

#include "decode_common.h"

namespace nanovha {

// bf16 on a CPU with AMX (Sapphire Rapids and later), up to 16 query heads per KV head (fewer are
// padded with heads of zeros): both products on the tile unit, every tile 16 rows of 64 bytes.
//   scores, 16 positions at a time: C (positions x heads) += K rows (positions x 32 of d, read in
//     place) times q's pairs (16 pair-rows x heads)
//   values, 32 positions at a time: C (heads x 16 of d_v) += p (heads x 32 positions: the block's
//     weights turned over) times the value rows interleaved in pairs (16 pair-rows x 16 of d_v)
// Tiles: 0 the sums, 1 the left operand, 2..5 q, 6 the value pairs. The softmax between the two
// products is the vector one of decode_common.h; p is rounded to bf16 for its product, as
// PyTorch's flash kernel rounds it.
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

template <int D>
inline void load_q_tiles(const int32_t (*qb)[16][16]) {
  _tile_loadd(2, qb[0], 64);
  if constexpr (D > 32) _tile_loadd(3, qb[1], 64);
  if constexpr (D > 64) _tile_loadd(4, qb[2], 64);
  if constexpr (D > 96) _tile_loadd(5, qb[3], 64);
}

// 16 rows of K (row stride ks) at column 32 kk, times q's tile kk, into tile 0
template <int D>
inline void score_tiles(const c10::BFloat16* k, int64_t ks) {
  _tile_loadd(1, k, ks * 2);
  _tile_dpbf16ps(0, 1, 2);
  if constexpr (D > 32) {
    _tile_loadd(1, k + 32, ks * 2);
    _tile_dpbf16ps(0, 1, 3);
  }
  if constexpr (D > 64) {
    _tile_loadd(1, k + 64, ks * 2);
    _tile_dpbf16ps(0, 1, 4);
  }
  if constexpr (D > 96) {
    _tile_loadd(1, k + 96, ks * 2);
    _tile_dpbf16ps(0, 1, 5);
  }
}

template <int G, int D, int DV>
void attend_chunk_amx(const Chunk<c10::BFloat16, float>& c) {
  using VG = typename Lanes<kAmxHeads>::f;
  constexpr int NV = DV / 16;
  static const TileConfig config;
  alignas(64) int32_t qb[D / 32][16][16];  // [kk][pair r][head]: (q[g][32kk + 2r], q[g][32kk + 2r + 1])
  alignas(64) c10::BFloat16 kpad[16 * D] = {};  // a block's last rows past t1, zero-padded
  alignas(64) VG s[kBlock];  // scores, then weights: s[j][g]
  alignas(64) int32_t pairs[16][16];  // [pair i][head]: (p[2i][g], p[2i+1][g]), before turning over
  alignas(64) int32_t pt[2][16][16];  // [half][head][pair i]: the weights as the left operand
  alignas(64) __m512i vp[2][NV][16];  // [half][slice][pair i]: (v_2i[e], v_2i+1[e]) for 16 e
  alignas(64) float acc[kAmxHeads][DV] = {};
  for (int kk = 0; kk < D / 32; ++kk) {
    for (int r = 0; r < 16; ++r) {
      for (int g = 0; g < kAmxHeads; ++g) {  // heads past G: zeros (their lanes are computed, not kept)
        uint32_t lo = 0, hi = 0;
        if (g < G) {
          std::memcpy(&lo, c.qT + (32 * kk + 2 * r) * G + g, 4);
          std::memcpy(&hi, c.qT + (32 * kk + 2 * r + 1) * G + g, 4);
        }
        qb[kk][r][g] = static_cast<int32_t>((lo >> 16) | (hi & 0xffff0000u));  // exact: q came from bf16
      }
    }
  }
  alignas(64) int16_t order[32];  // 0, 16, 1, 17, ...: interleaves the halves of a register
  for (int e = 0; e < 16; ++e) {
    order[2 * e] = e;
    order[2 * e + 1] = 16 + e;
  }
  const __m512i interleave = _mm512_load_si512(order);
  const c10::BFloat16 zero_row[DV] = {};
  _tile_loadconfig(&config);
  load_q_tiles<D>(qb);
  VG m = VG{} - std::numeric_limits<float>::infinity();
  VG l = {};
  for (int64_t b0 = c.t0; b0 < c.t1; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, c.t1 - b0);
    prefetch_block(c, b0 + kBlock);
    for (int64_t j = 0; j < nb; j += 16) {  // scores of 16 positions
      const c10::BFloat16* rows = c.k + (b0 + j) * c.ks;
      int64_t stride = c.ks;
      if (j + 16 > nb) {  // the last rows: copied, so no read passes t1
        std::fill(kpad, kpad + 16 * D, c10::BFloat16(0));
        for (int64_t u = 0; u < nb - j; ++u) {
          std::memcpy(kpad + u * D, rows + u * c.ks, D * 2);
        }
        rows = kpad;
        stride = D;
      }
      _tile_zero(0);
      score_tiles<D>(rows, stride);
      _tile_stored(0, &s[j], 64);
    }
    for (int64_t j = 0; j < nb; ++j) {
      s[j] *= c.scale;
    }
    const VG alpha = Lanes<kAmxHeads>::softmax_block(s, nb, m, l);
    for (int64_t j = nb; j < kBlock; ++j) {  // weights past nb: none
      s[j] = VG{};
    }
    for (int g = 0; g < kAmxHeads; ++g) {
      for (int e = 0; e < NV; ++e) {
        _mm512_store_ps(&acc[g][16 * e], _mm512_mul_ps(_mm512_load_ps(&acc[g][16 * e]), _mm512_set1_ps(alpha[g])));
      }
    }
    const int halves = static_cast<int>((nb + 31) / 32);
    for (int h = 0; h < halves; ++h) {
      for (int i = 0; i < 16; ++i) {  // weights to bf16 pairs, then turned over: rows are heads
        const int64_t j = 32 * h + 2 * i;
        __m512 a, b;
        std::memcpy(&a, &s[j], 64);
        std::memcpy(&b, &s[j + 1], 64);
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        _mm512_store_si512(pairs[i], _mm512_permutexvar_epi16(interleave, both));
        const c10::BFloat16* v0 = j < nb ? c.v + (b0 + j) * c.vs : zero_row;
        const c10::BFloat16* v1 = j + 1 < nb ? c.v + (b0 + j + 1) * c.vs : zero_row;
        for (int e = 0; e < NV; ++e) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v0 + 16 * e));
          const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v1 + 16 * e));
          vp[h][e][i] = _mm512_permutexvar_epi16(interleave, _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1));
        }
      }
      for (int g = 0; g < kAmxHeads; ++g) {
        for (int i = 0; i < 16; ++i) {
          pt[h][g][i] = pairs[i][g];
        }
      }
      _tile_loadd(1, pt[h], 64);
      for (int e = 0; e < NV; ++e) {
        _tile_loadd(0, &acc[0][16 * e], DV * 4);
        _tile_loadd(6, vp[h][e], 64);
        _tile_dpbf16ps(0, 1, 6);
        _tile_stored(0, &acc[0][16 * e], DV * 4);
      }
    }
  }
  _tile_release();
  for (int g = 0; g < G; ++g) {
    c.m[g] = m[g];
    c.l[g] = l[g];
    std::memcpy(c.acc + g * DV, acc[g], DV * sizeof(float));
  }
}

}  // namespace nanovha
