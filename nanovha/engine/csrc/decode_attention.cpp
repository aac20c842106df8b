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
// in float (double for double), with the chunks merged by their (m, l) at the end. The ways to do the
// products, compiled in for this CPU (-march=native) and chosen by the shape (run_fixed):
//   - the group as the vector lane (any CPU, float32 or bf16 or fp16 converted to float): G query
//     heads make one SIMD register per position, and a few heads' accumulators stay in registers over
//     a block, so the work per byte of cache grows with G without a small matrix product per block;
//   - lanes along the head dimension, for groups too small to fill the lanes (rows_path.h);
//   - bf16 on AMX, groups of 4 to 16: both products as tile multiplies (amx_tiles.h), the softmax
//     in vectors over positions.
// and one asked for by the caller (path 1, "dot"), which the plan times against those: bf16 groups of
// 4 to 16 by VDPBF16PS on a CPU with AVX512_BF16 (dot_pairs.h).
// Shapes without a compiled-in case take a scalar loop (and float64 always: the tests' reference).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "decode_common.h"
#include "rows_path.h"
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define NANOVHA_DOT 1
#include "dot_pairs.h"
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define NANOVHA_AMX 1
#include "amx_tiles.h"
#endif

namespace nanovha {

constexpr int64_t kMinChunk = 256;  // fewest positions a thread's chunk gets

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

// Which path a group takes, by what streamed the cache fastest on the CPUs measured (docs/benchmarks.md:
// our op's paths): bf16 groups of 4 to 16 on AMX where the CPU has it; lanes along the head dimension
// (rows_path.h) up to 4 heads, and 8 in bf16; the group as the lanes otherwise. Asked for the dot path
// (dot), bf16 groups of 4 to 16 take VDPBF16PS where the CPU has it.
template <int G>
constexpr bool kPairs = G >= 4 && G <= 16;

template <typename scalar_t, int G>
constexpr bool kRows = G <= 4 || (G == 8 && std::is_same_v<scalar_t, c10::BFloat16>);

// The path of a chunk of this shape, run where `run` -> its name, or nullptr for another shape
template <typename scalar_t, typename acc_t, int G, int D, int DV>
const char* run_fixed(const Chunk<scalar_t, acc_t>& c, bool dot, bool run) {
  if constexpr (std::is_same_v<acc_t, float> && !std::is_same_v<scalar_t, c10::Half>) {  // float16: scalar
    if (c.G == G && c.D == D && c.DV == DV) {
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && kPairs<G>) {
#ifdef NANOVHA_DOT
        if (dot) {
          if (run) attend_chunk_dot<G, D, DV>(c);
          return "dot";
        }
#endif
#ifdef NANOVHA_AMX
        if (amx_allowed()) {
          if (run) attend_chunk_amx<G, D, DV>(c);
          return "amx";
        }
#endif
      }
      if constexpr (kRows<scalar_t, G>) {
        if (run) attend_chunk_rows<scalar_t, G, D, DV>(c);
        return "rows";
      } else {
        if (run) attend_chunk<scalar_t, G, D, DV>(c);
        return "lanes";
      }
    }
  }
  return nullptr;
}

// the shapes compiled in: groups of 1, 2, 4, 8 and 16 query heads over rows of 16 to 128, and MLA's
// latent rows [c_kv ; k_R] of 128 + 16 (keys and values at once); others take the scalar path.
// Returns the name of the path (run or not, as `run` says).
template <typename scalar_t, typename acc_t>
const char* attend(const Chunk<scalar_t, acc_t>& c, bool dot, bool run) {
#define NANOVHA_CASE(G, D, DV) \
  if (const char* path = run_fixed<scalar_t, acc_t, G, D, DV>(c, dot, run)) return path;
#define NANOVHA_HEADS(G) \
  NANOVHA_CASE(G, 16, 16) NANOVHA_CASE(G, 32, 32) NANOVHA_CASE(G, 64, 64) NANOVHA_CASE(G, 128, 128)
  NANOVHA_HEADS(1)
  NANOVHA_HEADS(2)
  NANOVHA_HEADS(4)
  NANOVHA_HEADS(8)
  NANOVHA_HEADS(16)
  NANOVHA_CASE(16, 144, 144)
#undef NANOVHA_HEADS
#undef NANOVHA_CASE
  if (run) attend_chunk_any<scalar_t, acc_t>(c);
  return "scalar";
}

template <typename scalar_t>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n,
                           double scale, bool dot, at::Tensor& out) {
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
      attend<scalar_t, acc_t>(c, dot, true);
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

// Every shape, dtype and device is checked first, with a message naming them: nothing is read out of
// bounds. path 0 is the default, 1 asks for the dot path where it is compiled in (run_fixed).
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                  int64_t path) {
  const auto got = [&] {
    std::ostringstream s;
    s << "; got q " << q.sizes() << " " << q.scalar_type() << ", k " << k.sizes() << " " << k.scalar_type()
      << ", v " << v.sizes() << " " << v.scalar_type() << ", pos " << pos.sizes() << " " << pos.scalar_type();
    return s.str();
  };
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() && pos.device().is_cpu(),
              "nanovha::decode_attention runs on CPU tensors", got());
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "nanovha::decode_attention: q (B, H, G, D), k (B, H, T, D) and v (B, H, T, DV) are 4-D", got());
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) && v.size(1) == q.size(1),
              "nanovha::decode_attention: q, k and v must share B and the KV heads H (q grouped per KV head)",
              got());
  TORCH_CHECK(k.size(3) == q.size(3), "nanovha::decode_attention: q and k must share the head size D", got());
  TORCH_CHECK(v.size(2) == k.size(2), "nanovha::decode_attention: v must hold as many positions T as k", got());
  TORCH_CHECK(q.numel() > 0 && k.numel() > 0 && v.numel() > 0, "nanovha::decode_attention: an empty tensor", got());
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1 && k.stride(2) >= k.size(3) && v.stride(2) >= v.size(3),
              "nanovha::decode_attention: the cache rows (last dimension) must be contiguous", got());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "nanovha::decode_attention: q, k and v must share a dtype", got());
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf,
              "nanovha::decode_attention takes float32, float64, bfloat16 or float16", got());
  TORCH_CHECK(pos.numel() == 1 && pos.scalar_type() == at::kLong,
              "nanovha::decode_attention: pos is one int64 position", got());
  TORCH_CHECK(path == 0 || path == 1, "nanovha::decode_attention: path is 0 (the default) or 1 (dot), got ", path);
}

// q (B, H, G, D), k (B, H, T, D), v (B, H, T, DV), pos (1,) int64: positions 0..pos are read
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& pos,
                            double scale, int64_t path) {
  check_inputs(q, k, v, pos, path);
  TORCH_CHECK(scale > 0 && std::isfinite(scale), "nanovha::decode_attention: scale must be positive and finite, got ",
              scale);
  const int64_t p = pos.item<int64_t>();
  TORCH_CHECK(p >= 0 && p < k.size(2), "nanovha::decode_attention: pos must be in [0, T) = [0, ", k.size(2),
              "), got ", p);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention", [&] {
    decode_attention_impl<scalar_t>(q, k, v, p + 1, scale, path == 1, out);
  });
  return out;
}

// The name of the path decode_attention takes for these inputs and path: "amx", "dot", "rows",
// "lanes" or "scalar" (the paths above), nothing run
std::string decode_attention_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& pos, int64_t path) {
  check_inputs(q, k, v, pos, path);
  std::string name;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention_path", [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    Chunk<scalar_t, acc_t> c{};
    c.G = q.size(2);
    c.D = q.size(3);
    c.DV = v.size(3);
    name = attend<scalar_t, acc_t>(c, path == 1, false);
  });
  return name;
}

}  // namespace nanovha

TORCH_LIBRARY(nanovha, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor pos, float scale, int path=0) -> Tensor");
  m.def("decode_attention_path(Tensor q, Tensor k, Tensor v, Tensor pos, int path=0) -> str");
}

TORCH_LIBRARY_IMPL(nanovha, CPU, m) {
  m.impl("decode_attention", &nanovha::decode_attention);
  m.impl("decode_attention_path", &nanovha::decode_attention_path);
}
