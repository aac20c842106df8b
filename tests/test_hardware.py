"""hardware.py: the dtype a run picks for each kind of machine (each capability forced, never timed), and
the GPU spec table read by exact device names."""
import pytest
import torch

import hardware
from conftest import TINY_MODEL, run


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given ISA and bf16 instructions."""
    def make(isa, avx512_bf16=False, amx=False):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    return make


def test_auto_on_cpus(cpu):
    cpu("AVX2")
    assert hardware.choose_dtype("cpu", "auto") == ("float32", "float32: this CPU has no native bf16 (AVX2)")
    cpu("AVX512")  # AVX-512 without its bf16 extension (e.g. Skylake-X)
    assert hardware.choose_dtype("cpu", "auto")[0] == "float32"
    cpu("AVX512", avx512_bf16=True)  # Zen 4/5, Cooper Lake
    assert hardware.choose_dtype("cpu", "auto") == ("bfloat16", "bfloat16 autocast: this CPU has native bf16 (AVX512)")
    cpu("AVX512", amx=True)  # Sapphire Rapids and later
    assert hardware.choose_dtype("cpu", "auto")[0] == "bfloat16"
    cpu("AVX2", avx512_bf16=True)  # the instructions are there, but torch runs its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2)
    assert hardware.choose_dtype("cpu", "auto")[0] == "float32"
    cpu("DEFAULT")  # e.g. an ARM laptop: torch's default kernels
    assert hardware.choose_dtype("cpu", "auto")[0] == "float32"


def test_explicit_bf16_on_a_cpu_without_it_is_kept_with_a_warning(cpu):
    cpu("AVX2")
    dtype, line = hardware.choose_dtype("cpu", "bfloat16")
    assert dtype == "bfloat16" and line.startswith("warning: bfloat16") and "emulated" in line and "--dtype=float32" in line
    cpu("AVX512", avx512_bf16=True)
    assert hardware.choose_dtype("cpu", "bfloat16") == ("bfloat16", "bfloat16: asked for")
    assert hardware.choose_dtype("cpu", "float32") == ("float32", "float32: asked for")


def test_auto_on_cuda_and_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert hardware.choose_dtype("cuda", "auto")[0] == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # V100, T4
    assert hardware.choose_dtype("cuda", "auto") == ("float16", "float16 autocast + GradScaler: this GPU has no bf16")
    assert hardware.choose_dtype("cuda", "float32")[0] == "float32"
    assert hardware.choose_dtype("mps", "auto")[0] == "float32"


@pytest.mark.parametrize("name, peak, hbm", [
    ("NVIDIA H200", 989e12, 4.8e12), ("NVIDIA H200 NVL", 835e12, 4.8e12),
    ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12), ("NVIDIA H100 PCIe", 756e12, 2.0e12), ("NVIDIA H100 NVL", 835e12, 3.9e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12), ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
    ("NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
    ("NVIDIA L40S", 362e12, 0.864e12), ("NVIDIA L40", 181e12, 0.864e12), ("NVIDIA L4", 121e12, 0.3e12),
    ("NVIDIA A10", 125e12, 0.6e12), ("NVIDIA GeForce RTX 4090", 165e12, 1.008e12), ("Tesla T4", 65e12, 0.32e12),
    ("NVIDIA GeForce RTX 4090 D", None, None), ("NVIDIA GeForce RTX 4090 Laptop GPU", None, None),  # other chips
    ("NVIDIA L40-48Q", 181e12, 0.864e12), ("NVIDIA L4-24Q", 121e12, 0.3e12),  # vGPU profiles
    ("GeForce RTX 3090", 71e12, 0.936e12),  # not listed under this name: its last word is the model
    ("NVIDIA A10G", None, None), ("NVIDIA H100", None, None), ("NVIDIA A100-PCIE-80GB", None, None),  # ambiguous: unknown
    ("NVIDIA GeForce GTX 1080", None, None), ("AMD Instinct MI300X", None, None),
])
def test_gpu_spec_matches_whole_names_first(name, peak, hbm):
    assert hardware.gpu_spec(name) == (peak, hbm)


def test_train_prints_its_choice(char_data, tmp_path):
    proc = run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path}", "--max_iters=0", *TINY_MODEL, "--warmup_iters=0")
    native = hardware.cpu_bf16_support()[0]
    assert ("dtype bfloat16 autocast: this CPU has native bf16" if native else "dtype float32: this CPU has no native bf16") in proc.stdout
    forced = run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path}/avx2", "--max_iters=0", "--dtype=bfloat16",
                 *TINY_MODEL, "--warmup_iters=0", env={"ATEN_CPU_CAPABILITY": "avx2"})  # torch's AVX2 kernels: bf16 emulated, as on an AVX2 CPU
    assert "dtype float32" not in forced.stdout and forced.stderr.count("warning: bfloat16 was asked for") == 1
