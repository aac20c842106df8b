"""
How many float32 FMAs and bf16 pair dot products (VDPBF16PS) one core starts per cycle: the two
ways our op's vector paths multiply and add (docs/benchmarks.md: our op's paths). Each runs as 16
independent chains whose accumulators come from memory, so no compiler can merge them; the clock
is estimated from a chain of dependent IMULs (3 cycles each on current x86 cores).

    python lab/vector_rates.py      # seconds; with the C++ compiler our op builds with ($CXX, else c++)
"""
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nanovha.config import at_least, flat_defaults, settings  # noqa: E402
from nanovha.hardware import cpu_kind  # noqa: E402
from nanovha.processes import run_limited  # noqa: E402

rounds = 5
seconds = 0.2  # per timing
config = settings(flat_defaults(globals()), sys.argv[1:], limits={"rounds": at_least(1), "seconds": at_least(0.01)})
globals().update(config)

SOURCE = r"""
#include <immintrin.h>
#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
#define FMA(a, b) _mm512_fmadd_ps(a, b, b)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
#define LANES 8
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps
#define FMA(a, b) _mm256_fmadd_ps(a, b, b)
#endif
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define READ(i) vec a##i = LOAD(acc + i * LANES);
#define WRITE(i) STORE(acc + i * LANES, a##i);

extern "C" {

int fma_lanes(void) {
#ifdef LANES
  return LANES;
#else
  return 0;
#endif
}

void fma_chains(float* acc, long n) {  /* 16 x n FMAs */
#ifdef LANES
  CHAINS(READ)
  vec b = LOAD(acc + 16 * LANES);
  for (long i = 0; i < n; ++i) {
#define STEP(i) a##i = FMA(a##i, b);
    CHAINS(STEP)
#undef STEP
    __asm__ volatile("" : "+x"(b));
  }
  CHAINS(WRITE)
#endif
}

int dot_lanes(void) {
#if defined(__AVX512BF16__)
  return 16;
#else
  return 0;
#endif
}

void dot_chains(float* acc, long n) {  /* 16 x n VDPBF16PS */
#if defined(__AVX512BF16__)
  CHAINS(READ)
  __m512bh b = (__m512bh)_mm512_loadu_si512(acc + 16 * LANES);
  for (long i = 0; i < n; ++i) {
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, b, b);
    CHAINS(STEP)
#undef STEP
    __asm__ volatile("" : "+x"(b));
  }
  CHAINS(WRITE)
#endif
}

long imul_chain(long x, long n) {  /* 4 x n dependent IMULs */
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x));
  }
  return x;
}
}  // extern "C"
"""


def build(folder):
    """The source compiled for this CPU into folder -> the library (ctypes), or exits with why."""
    src, lib = os.path.join(folder, "rates.cpp"), os.path.join(folder, "rates.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    cxx = os.environ.get("CXX", "c++")
    try:
        code, out = run_limited([cxx, "-O2", "-march=native", "-shared", "-fPIC", src, "-o", lib], 60)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = type(e).__name__
        sys.exit(f"error: the C++ compiler {cxx} did not build the probe ({why}); set CXX to one that works")
    if code != 0:
        sys.exit(f"error: {cxx} failed on the probe: {out.strip().splitlines()[-1] if out.strip() else code}")
    so = ctypes.CDLL(lib)
    so.fma_chains.argtypes = so.dot_chains.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_long]
    so.imul_chain.argtypes = [ctypes.c_long, ctypes.c_long]
    so.imul_chain.restype = ctypes.c_long
    return so


def per_second(fn, per_call):
    """The median over `rounds` of how many operations fn does per second, n sized to `seconds`."""
    n = 1000
    while True:
        t0 = time.perf_counter()
        fn(n)
        spent = time.perf_counter() - t0
        if spent > seconds / 4:
            break
        n *= 4
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(n)
        rates.append(per_call * n / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    with tempfile.TemporaryDirectory() as folder:
        so = build(folder)
        acc = (ctypes.c_float * (17 * 16))(*([0.5] * (17 * 16)))
        hz = per_second(lambda n: so.imul_chain(3, n), 4) * 3  # cycles: three per IMUL
        print(f"{cpu_kind()}: one core, clock about {hz / 1e9:.2f} GHz (dependent IMULs, 3 cycles each)")
        print(f"{'instruction':<28} {'per ns':>7} {'per cycle':>10} {'multiply-adds per cycle':>24}")
        rows = [("FMA, float32", so.fma_lanes(), so.fma_chains, 1),  # a multiply-add per lane
                ("VDPBF16PS, bf16 pairs", so.dot_lanes(), so.dot_chains, 2)]  # two per lane
        for name, lanes, fn, per_lane in rows:
            if lanes == 0:
                print(f"{name:<28} {'not on this CPU (or not compiled for it)':>43}")
                continue
            rate = per_second(lambda n: fn(acc, n), 16)
            width = f"{32 * lanes}-bit {name}"
            print(f"{width:<28} {rate / 1e9:7.2f} {rate / hz:10.2f} {rate / hz * lanes * per_lane:24.1f}")


if __name__ == "__main__":
    main()
