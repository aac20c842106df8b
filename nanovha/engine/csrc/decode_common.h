// What the paths of decode_attention.cpp share: the task a thread is given (Chunk) and the lane-wise
// math of the online softmax (Lanes), in GCC's vector extension.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace nanovha {

constexpr int64_t kBlock = 64;  // positions per block

// One task: rows [t0, t1) of one KV head's cache (k rows ks apart, v rows vs apart), its G query
// rows as qT (D, G), unscaled -> m (G), l (G) and acc (G, DV), not yet divided by l
template <typename scalar_t, typename acc_t>
struct Chunk {
  const acc_t* qT;
  int64_t G, D, DV;
  acc_t scale;
  const scalar_t* k;
  int64_t ks;
  const scalar_t* v;
  int64_t vs;
  int64_t t0, t1;
  acc_t* m;
  acc_t* l;
  acc_t* acc;
};

// N float lanes (and int32 lanes of the same width): one SIMD register or a few, in GCC's vector
// extension, and the lane-wise math the kernels share
template <int N>
struct Lanes {
  typedef float f __attribute__((vector_size(N * 4)));
  typedef int32_t i __attribute__((vector_size(N * 4)));

  // exp(x) for x <= 0 (lanes below -87 give about 1e-38): 2^n e^r with n = round(x / ln 2) and e^r by
  // Cephes' degree-6 polynomial on |r| <= ln 2 / 2, within 2 ulp of expf
  static f exp_le0(f x) {
    const f lo = f{} - 87.0f;
    x = x < lo ? lo : x;
    // round to nearest: 1.5 * 2^23 + n holds the integer n in its low mantissa bits
    const f shifted = x * 1.44269504088896341f + 12582912.0f;
    const f n = shifted - 12582912.0f;
    f r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    f p = f{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i bits;
    std::memcpy(&bits, &shifted, sizeof(f));
    bits = (bits - 0x4B400000 + 127) << 23;
    f two_n;
    std::memcpy(&two_n, &bits, sizeof(f));
    return p * two_n;
  }

  // the online softmax over one block of scores s[0..nb) (each a vector over the group): m becomes
  // the running max, s[j] becomes p[j] = e^(s[j] - m), l the running sum; returns e^(m_old - m), by
  // which the accumulators are rescaled
  static f softmax_block(f* s, int64_t nb, f& m, f& l) {
    f mb = m;
    for (int64_t j = 0; j < nb; ++j) {
      mb = s[j] > mb ? s[j] : mb;
    }
    const f alpha = exp_le0(m - mb);
    m = mb;
    f sum = {};
    for (int64_t j = 0; j < nb; ++j) {
      s[j] = exp_le0(s[j] - m);
      sum += s[j];
    }
    l = l * alpha + sum;
    return alpha;
  }
};

using V16 = Lanes<16>::f;

// t[0..15] -> r with r[i] = sum of t[i]'s 16 lanes: four rounds, each adding the lanes it pairs up
inline V16 sum16(const V16* t) {
  typedef int32_t M __attribute__((vector_size(64)));
  const M even = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  const M odd = even + 1;
  const M even2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const M odd2 = even2 + 2;
  const M even4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  const M odd4 = even4 + 4;
  const M even8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const M odd8 = even8 + 8;
  V16 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) {  // lane 2m: t[2i] summed over lanes 2m, 2m+1; lane 2m+1: t[2i+1]
    a[i] = __builtin_shuffle(t[2 * i], t[2 * i + 1], even) + __builtin_shuffle(t[2 * i], t[2 * i + 1], odd);
  }
  for (int i = 0; i < 4; ++i) {
    b[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], even2) + __builtin_shuffle(a[2 * i], a[2 * i + 1], odd2);
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1], even4) + __builtin_shuffle(b[2 * i], b[2 * i + 1], odd4);
  }
  return __builtin_shuffle(c[0], c[1], even8) + __builtin_shuffle(c[0], c[1], odd8);
}

}  // namespace nanovha
