// One decoded token's attention over a KV cache, on the CPU (nanovha/decode_kernel.py builds it).
//
//   out[b, h, g] = sum_t softmax_t(q[b, h, g] . k[b, h, t] * scale) v[b, h, t],  t = 0 .. pos
//
// q (B, H, G, D): the G query heads that share KV head h, as rows; k (B, H, T, D), v (B, H, T, DV):
// the cache, rows contiguous, positions after pos not read. Every KV head's K and V are read once
// for its whole group, the context cut into chunks when there are more threads than heads
// (flash-decoding), and each chunk streams through blocks of kBlock positions that stay in L1:
//
//   s[j, :]  = q^T k_j                   (one vector over the group per position j)
//   m'       = max(m, max_j s[j, :]),    p[j, :] = exp(s[j, :] - m'),   l = l e^(m - m') + sum_j p[j, :]
//   acc[g]   = acc[g] e^(m - m') + sum_j p[j, g] v_j
//
// in float (double for double), with the chunks merged by their (m, l) at the end. Two ways to do
// the products, chosen at compile time for this CPU (-march=native) and the shape:
//   - the group as the vector lane (any CPU, float32 or bf16 or fp16 converted to float): G query
//     heads make one SIMD register per position, and a few heads' accumulators stay in registers over
//     a block, so the work per byte of cache grows with G without a small matrix product per block;
//   - bf16 on AMX: both products as tile multiplies (attend_chunk_amx), the softmax in vectors.
// Shapes without a compiled-in case take a scalar loop (and float64 always: the tests' reference).
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define NANOVHA_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;  // positions per block
constexpr int64_t kMinChunk = 256;  // fewest positions a thread's chunk gets

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

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }

// rows [t0, t1) of a (T, width) cache with row stride `stride` -> float rows, width apart
template <typename scalar_t>
inline void rows_to_float(const scalar_t* src, int64_t stride, int64_t n, int64_t width, float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    const scalar_t* row = src + j * stride;
    float* out = dst + j * width;
    for (int64_t i = 0; i < width; ++i) {
      out[i] = to_float(row[i]);
    }
  }
}

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

// One chunk [t0, t1) of one KV head, G query heads (the vector lanes), row widths D and DV known at
// compile time -> m (G), l (G), acc (G x DV), not yet divided by l.
template <typename scalar_t, int G, int D, int DV>
void attend_chunk(const Chunk<scalar_t, float>& c) {
  using VG = typename Lanes<G>::f;
  using V16 = typename Lanes<16>::f;
  constexpr int NV = (DV + 15) / 16;  // 16-float vectors per value row
  constexpr int GB = std::max(1, std::min(G, 16 / NV));  // heads whose accumulators stay in registers
  alignas(64) float kf[kBlock * D] = {};
  alignas(64) float vf[kBlock * NV * 16] = {};
  alignas(64) VG s[kBlock];
  alignas(64) VG q[D];
  alignas(64) V16 acc[G][NV] = {};
  for (int d = 0; d < D; ++d) {
    std::memcpy(&q[d], c.qT + d * G, sizeof(VG));
  }
  VG m = VG{} - std::numeric_limits<float>::infinity();
  VG l = {};
  for (int64_t b0 = c.t0; b0 < c.t1; b0 += kBlock) {
    const int64_t nb = std::min(kBlock, c.t1 - b0);
    rows_to_float(c.k + b0 * c.ks, c.ks, nb, D, kf);
    // s[j] = q^T k_j: D multiply-adds of one vector over the group, 8 positions at a time (8 chains
    // of adds in flight; rows past nb hold stale values and their scores are not read)
    for (int64_t j = 0; j < nb; j += 8) {
      VG a[8] = {};
      const float* kj = kf + j * D;
#pragma GCC unroll 4
      for (int d = 0; d < D; ++d) {
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
          a[u] += q[d] * kj[u * D + d];
        }
      }
      for (int u = 0; u < 8; ++u) {
        s[j + u] = a[u] * c.scale;
      }
    }
    const VG alpha = Lanes<G>::softmax_block(s, nb, m, l);
    for (int64_t j = 0; j < nb; ++j) {  // value rows, padded to whole vectors with zeros
      const scalar_t* row = c.v + (b0 + j) * c.vs;
      for (int i = 0; i < DV; ++i) {
        vf[j * NV * 16 + i] = to_float(row[i]);
      }
    }
    for (int g0 = 0; g0 < G; g0 += GB) {
      V16 r[GB][NV];
      for (int g = 0; g < GB; ++g) {
        for (int e = 0; e < NV; ++e) {
          r[g][e] = acc[g0 + g][e] * alpha[g0 + g];
        }
      }
      for (int64_t j = 0; j < nb; ++j) {
        const V16* vj = reinterpret_cast<const V16*>(vf + j * NV * 16);
        for (int g = 0; g < GB; ++g) {
          const float p = s[j][g0 + g];
          for (int e = 0; e < NV; ++e) {
            r[g][e] += vj[e] * p;
          }
        }
      }
      for (int g = 0; g < GB; ++g) {
        for (int e = 0; e < NV; ++e) {
          acc[g0 + g][e] = r[g][e];
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    c.m[g] = m[g];
    c.l[g] = l[g];
    std::memcpy(c.acc + g * DV, &acc[g][0], DV * sizeof(float));
  }
}

#ifdef NANOVHA_AMX
// bf16 on a CPU with AMX (Sapphire Rapids and later), up to 16 query heads per KV head (fewer are
// padded with heads of zeros): both products on the tile unit, every tile 16 rows of 64 bytes.
//   scores, 16 positions at a time: C (positions x heads) += K rows (positions x 32 of d, read in
//     place) times q's pairs (16 pair-rows x heads)
//   values, 32 positions at a time: C (heads x 16 of d_v) += p (heads x 32 positions: the block's
//     weights turned over) times the value rows interleaved in pairs (16 pair-rows x 16 of d_v)
// Tiles: 0 the sums, 1 the left operand, 2..5 q, 6 the value pairs. The softmax between the two
// products is the vector one above; p is rounded to bf16 for its product, as PyTorch's flash kernel
// rounds it.
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
#endif

// The same for any G, D and DV, in acc_t (double for double inputs): the reference the tests read in
// float64, and the path of shapes without a compiled-in case.
template <typename scalar_t, typename acc_t>
void attend_chunk_any(const Chunk<scalar_t, acc_t>& c) {
  std::vector<acc_t> m(c.G, -std::numeric_limits<acc_t>::infinity()), l(c.G, 0);
  std::fill(c.acc, c.acc + c.G * c.DV, acc_t(0));
  for (int64_t t = c.t0; t < c.t1; ++t) {
    const scalar_t* kt = c.k + t * c.ks;
    const scalar_t* vt = c.v + t * c.vs;
    for (int64_t g = 0; g < c.G; ++g) {
      acc_t a = 0;
      for (int64_t d = 0; d < c.D; ++d) {
        a += c.qT[d * c.G + g] * static_cast<acc_t>(kt[d]);
      }
      a *= c.scale;
      const acc_t mg = std::max(m[g], a);
      const acc_t alpha = std::exp(m[g] - mg);
      const acc_t p = std::exp(a - mg);
      m[g] = mg;
      l[g] = l[g] * alpha + p;
      acc_t* out = c.acc + g * c.DV;
      for (int64_t e = 0; e < c.DV; ++e) {
        out[e] = out[e] * alpha + p * static_cast<acc_t>(vt[e]);
      }
    }
  }
  std::copy(m.begin(), m.end(), c.m);
  std::copy(l.begin(), l.end(), c.l);
}

template <typename scalar_t, typename acc_t, int G, int D, int DV>
bool run_fixed(const Chunk<scalar_t, acc_t>& c) {
  if constexpr (std::is_same_v<acc_t, float>) {
    if (c.G == G && c.D == D && c.DV == DV) {
#ifdef NANOVHA_AMX
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && G <= kAmxHeads && D % 32 == 0 && DV % 16 == 0) {
        if (amx_allowed()) {
          attend_chunk_amx<G, D, DV>(c);
          return true;
        }
      }
#endif
      attend_chunk<scalar_t, G, D, DV>(c);
      return true;
    }
  }
  return false;
}

// the shapes compiled in: groups of 4, 8 and 16 query heads over rows of 16 to 128 (MLA's
// latent rows [c_kv ; k_R] are keys and values at once); others take the scalar path
template <typename scalar_t, typename acc_t>
void attend(const Chunk<scalar_t, acc_t>& c) {
#define NANOVHA_CASE(G, D, DV) \
  if (run_fixed<scalar_t, acc_t, G, D, DV>(c)) return;
#define NANOVHA_HEADS(G) \
  NANOVHA_CASE(G, 16, 16) NANOVHA_CASE(G, 32, 32) NANOVHA_CASE(G, 64, 64) NANOVHA_CASE(G, 128, 128)
  NANOVHA_HEADS(4)
  NANOVHA_HEADS(8)
  NANOVHA_HEADS(16)
#undef NANOVHA_HEADS
#undef NANOVHA_CASE
  attend_chunk_any<scalar_t, acc_t>(c);
}

template <typename scalar_t>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n,
                           double scale, at::Tensor& out) {
  using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), DV = v.size(3);
  // chunks per head: every thread busy, no chunk under kMinChunk positions
  const int64_t threads = at::get_num_threads();
  const int64_t S = std::max<int64_t>(1, std::min((threads + B * H - 1) / (B * H), n / kMinChunk));
  const int64_t len = (n + S - 1) / S;
  std::vector<acc_t> qT(B * H * D * G), m(B * H * S * G), l(B * H * S * G), acc(B * H * S * G * DV);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  for (int64_t bh = 0; bh < B * H; ++bh) {  // (B*H, D, G): each position's products across the lanes
    const int64_t b = bh / H, h = bh % H;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t d = 0; d < D; ++d) {
        const scalar_t x = qp[b * q.stride(0) + h * q.stride(1) + g * q.stride(2) + d * q.stride(3)];
        qT[(bh * D + d) * G + g] = static_cast<acc_t>(x);
      }
    }
  }
  at::parallel_for(0, B * H * S, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / S, part = task % S, b = bh / H, h = bh % H;
      Chunk<scalar_t, acc_t> c;
      c.qT = qT.data() + bh * D * G;
      c.G = G;
      c.D = D;
      c.DV = DV;
      c.scale = static_cast<acc_t>(scale);
      c.k = k.data_ptr<scalar_t>() + b * k.stride(0) + h * k.stride(1);
      c.ks = k.stride(2);
      c.v = v.data_ptr<scalar_t>() + b * v.stride(0) + h * v.stride(1);
      c.vs = v.stride(2);
      c.t0 = part * len;
      c.t1 = std::min(n, (part + 1) * len);
      c.m = m.data() + task * G;
      c.l = l.data() + task * G;
      c.acc = acc.data() + task * G * DV;
      attend<scalar_t, acc_t>(c);
    }
  });
  // merge the chunks: out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c
  scalar_t* op = out.data_ptr<scalar_t>();
  std::vector<acc_t> o(DV);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t g = 0; g < G; ++g) {
      acc_t M = -std::numeric_limits<acc_t>::infinity();
      for (int64_t part = 0; part < S; ++part) {
        M = std::max(M, m[(bh * S + part) * G + g]);
      }
      acc_t L = 0;
      std::fill(o.begin(), o.end(), acc_t(0));
      for (int64_t part = 0; part < S; ++part) {
        const int64_t i = (bh * S + part) * G + g;
        if (l[i] == 0) {  // a chunk past the written positions
          continue;
        }
        const acc_t w = std::exp(m[i] - M);
        L += w * l[i];
        for (int64_t e = 0; e < DV; ++e) {
          o[e] += w * acc[i * DV + e];
        }
      }
      for (int64_t e = 0; e < DV; ++e) {
        op[(bh * G + g) * DV + e] = static_cast<scalar_t>(o[e] / L);
      }
    }
  }
}

// q (B, H, G, D), k (B, H, T, D), v (B, H, T, DV), pos (1,) int64: positions 0..pos are read
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "nanovha::decode_attention: q, k, v must be 4-D");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1, "nanovha::decode_attention: cache rows must be contiguous");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "nanovha::decode_attention: q, k, v must share a dtype");
  const int64_t n = std::min<int64_t>(pos.item<int64_t>() + 1, k.size(2));
  TORCH_CHECK(n >= 1, "nanovha::decode_attention: pos must be >= 0");
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    decode_attention_impl<scalar_t>(q, k, v, n, scale, out);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(nanovha, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor pos, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(nanovha, CPU, m) {
  m.impl("decode_attention", &decode_attention);
}
