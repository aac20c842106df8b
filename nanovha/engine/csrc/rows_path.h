// The path of decode_attention.cpp for one or two query heads per KV head (MHA, GQA with twice as many
// query heads as KV heads): too few heads to fill the vector lanes, so the lanes run along the head
// dimension. A position's score is q . k_j, 16 of d at a time, and the partial sums of 16 positions
// are folded into one vector of their 16 scores (sum16); the softmax then runs over positions, 16 to
// a vector, and the values are accumulated 16 of d_v at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "decode_common.h"

namespace nanovha {

// 16 consecutive values of a row, as floats (bf16 and fp16 widened, float copied)
template <typename scalar_t>
inline V16 load16(const scalar_t* p) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    V16 x;
    std::memcpy(&x, p, sizeof(V16));
    return x;
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {  // bf16 is the top half of a float
    typedef uint16_t u16 __attribute__((vector_size(32)));
    typedef uint32_t u32 __attribute__((vector_size(64)));
    u16 h;
    std::memcpy(&h, p, sizeof(u16));
    const u32 w = __builtin_convertvector(h, u32) << 16;
    V16 x;
    std::memcpy(&x, &w, sizeof(V16));
    return x;
  } else {
    alignas(64) float f[16];
    for (int i = 0; i < 16; ++i) {
      f[i] = static_cast<float>(p[i]);
    }
    V16 x;
    std::memcpy(&x, f, sizeof(V16));
    return x;
  }
}

// One chunk [t0, t1) of one KV head with G = 1 or 2 query heads, D and DV multiples of 16 ->
// m (G), l (G), acc (G x DV), not yet divided by l
template <typename scalar_t, int G, int D, int DV>
void attend_chunk_rows(const Chunk<scalar_t, float>& c) {
  constexpr int ND = D / 16, NV = DV / 16;
  alignas(64) V16 q[G][ND];
  alignas(64) float p[G][kBlock];  // a block's scores, then its weights
  alignas(64) scalar_t kpad[16 * D];  // a block's last rows past t1, zero-padded
  V16 acc[G][NV] = {};
  float m[G], l[G];
  for (int g = 0; g < G; ++g) {
    alignas(64) float row[D];
    for (int d = 0; d < D; ++d) {
      row[d] = c.qT[d * G + g] * c.scale;  // the scale folded into q
    }
    std::memcpy(q[g], row, sizeof(row));
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0;
  }
  for (int64_t b0 = c.t0; b0 < c.t1; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, c.t1 - b0);
    for (int64_t j0 = 0; j0 < nb; j0 += 16) {  // scores, 16 positions at a time
      const scalar_t* rows = c.k + (b0 + j0) * c.ks;
      int64_t stride = c.ks;
      if (j0 + 16 > nb) {  // the last rows: copied, so no read passes t1
        std::memset(kpad, 0, sizeof(kpad));
        for (int64_t u = 0; u < nb - j0; ++u) {
          std::memcpy(kpad + u * D, rows + u * c.ks, D * sizeof(scalar_t));
        }
        rows = kpad;
        stride = D;
      }
      for (int g = 0; g < G; ++g) {
        V16 t[16];
#pragma GCC unroll 16
        for (int u = 0; u < 16; ++u) {
          const scalar_t* kj = rows + u * stride;
          V16 a = q[g][0] * load16(kj);
#pragma GCC unroll 8
          for (int e = 1; e < ND; ++e) {
            a += q[g][e] * load16(kj + 16 * e);
          }
          t[u] = a;
        }
        const V16 sums = sum16(t);
        std::memcpy(p[g] + j0, &sums, sizeof(V16));
      }
    }
    typedef int32_t I16 __attribute__((vector_size(64)));
    const I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const V16 none = V16{} - std::numeric_limits<float>::infinity();
    for (int g = 0; g < G; ++g) {  // the online softmax over the block's nb positions, 16 at a time
      V16 mv = V16{} + m[g];
      for (int64_t j0 = 0; j0 < nb; j0 += 16) {
        V16 s;
        std::memcpy(&s, p[g] + j0, sizeof(V16));
        s = lane < static_cast<int32_t>(nb - j0) ? s : none;  // positions past nb: none
        mv = s > mv ? s : mv;
      }
      float mb = mv[0];
      for (int i = 1; i < 16; ++i) {
        mb = std::max(mb, mv[i]);
      }
      V16 sum = {};
      for (int64_t j0 = 0; j0 < nb; j0 += 16) {
        V16 s;
        std::memcpy(&s, p[g] + j0, sizeof(V16));
        s = lane < static_cast<int32_t>(nb - j0) ? Lanes<16>::exp_le0(s - mb) : V16{};
        std::memcpy(p[g] + j0, &s, sizeof(V16));
        sum += s;
      }
      const float alpha = std::exp(m[g] - mb);
      float total = 0;
      for (int i = 0; i < 16; ++i) {
        total += sum[i];
      }
      m[g] = mb;
      l[g] = l[g] * alpha + total;
      for (int e = 0; e < NV; ++e) {
        acc[g][e] *= alpha;
      }
    }
    for (int64_t j = 0; j < nb; ++j) {  // values: acc += p_j v_j
      const scalar_t* vj = c.v + (b0 + j) * c.vs;
      for (int e = 0; e < NV; ++e) {
        const V16 v16 = load16(vj + 16 * e);
        for (int g = 0; g < G; ++g) {
          acc[g][e] += p[g][j] * v16;
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    c.m[g] = m[g];
    c.l[g] = l[g];
    std::memcpy(c.acc + g * DV, acc[g], DV * sizeof(float));
  }
}

}  // namespace nanovha
