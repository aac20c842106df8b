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

// Rows [b, b + kBlock) of K and V on their way into the cache while the block before them is read
template <typename scalar_t, typename acc_t>
inline void prefetch_block(const Chunk<scalar_t, acc_t>& c, int64_t b) {
  const int64_t kbytes = c.D * sizeof(scalar_t), vbytes = c.DV * sizeof(scalar_t);
  for (int64_t j = b; j < std::min(b + kBlock, c.t1); ++j) {
    for (int64_t x = 0; x < kbytes; x += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(c.k + j * c.ks) + x);
    }
    for (int64_t x = 0; x < vbytes; x += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(c.v + j * c.vs) + x);
    }
  }
}

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

}  // namespace nanovha
