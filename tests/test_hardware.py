"""hardware.py: the dtype a run picks on each kind of machine (each capability forced, the timing faked where a choice
is timed), and the GPU spec table read by exact device names."""
import pytest
import torch

from nanovha import hardware
from nanovha.figures import gpu_spec
from conftest import TINY_MODEL, run


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given ISA and bf16 instructions."""
    def make(isa, avx512_bf16=False, amx=False):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: isa)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    return make


def test_the_probe_leaves_the_run_as_it_was(cpu, tmp_path):
    """A real probe on a tiny model (timed by nanovha/engine/plan.py): the model's weights, its gradients and the random
    streams are untouched, so a run with dtype=auto is bit-identical to the same run with the chosen dtype given
    explicitly."""
    from model import GPT, GPTConfig
    from nanovha.timing import train_plan, training_step
    cpu("AVX512", amx=True)  # bf16 is then a candidate (emulated on an AVX2 machine: slow, but the model is tiny)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_embd=32, n_head=4, n_kv_head=2, attn="vha"))
    x = torch.randint(40, (2, 16))
    before, rng = {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()
    plan = train_plan(training_step(model, x, x), ["tiny"], str(tmp_path))
    line = str(plan)
    assert plan.dtype in (torch.float32, torch.bfloat16)
    assert "float32" in line and "bfloat16" in line and "/step" in line
    assert torch.equal(torch.get_rng_state(), rng) and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_cpu_kind_names_the_cpu_and_its_kernels():
    kind = hardware.cpu_kind()
    assert kind.endswith(")") and torch.backends.cpu.get_cpu_capability() in kind and len(kind) > len(" (AVX2)")


def test_explicit_bf16_on_a_cpu_without_it_is_kept_with_a_warning(cpu):
    cpu("AVX2")
    dtype, line = hardware.choose_dtype("cpu", "bfloat16")
    assert (dtype == "bfloat16" and line.startswith("warning: bfloat16") and "emulated" in line
            and "--dtype=float32" in line)
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
    assert hardware.choose_dtype("cpu", "auto")[0] == "float32"  # nothing timed: the safe choice (the plan times it)


@pytest.mark.parametrize("name, peak, hbm", [
    ("NVIDIA H200", 989e12, 4.8e12), ("NVIDIA H200 NVL", 835e12, 4.8e12),
    ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12),
    ("NVIDIA H100 PCIe", 756e12, 2.0e12),
    ("NVIDIA H100 NVL", 835e12, 3.9e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12), ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
    ("NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
    ("NVIDIA L40S", 362e12, 0.864e12), ("NVIDIA L40", 181e12, 0.864e12), ("NVIDIA L4", 121e12, 0.3e12),
    ("NVIDIA A10", 125e12, 0.6e12), ("NVIDIA GeForce RTX 4090", 165e12, 1.008e12), ("Tesla T4", 65e12, 0.32e12),
    ("NVIDIA GeForce RTX 4090 D", None, None), ("NVIDIA GeForce RTX 4090 Laptop GPU", None, None),  # other chips
    ("NVIDIA L40-48Q", 181e12, 0.864e12), ("NVIDIA L4-24Q", 121e12, 0.3e12),  # vGPU profiles
    ("GeForce RTX 3090", 71e12, 0.936e12),  # not listed under this name: its last word is the model
    # ambiguous: unknown
    ("NVIDIA A10G", None, None), ("NVIDIA H100", None, None), ("NVIDIA A100-PCIE-80GB", None, None),
    ("NVIDIA GeForce GTX 1080", None, None), ("AMD Instinct MI300X", None, None),
])
def test_gpu_spec_matches_whole_names_first(name, peak, hbm):
    assert gpu_spec(name) == (peak, hbm)


def test_train_prints_its_choice_and_a_resume_keeps_it(char_data, tmp_path):
    args = [f"--data_dir={char_data}", f"--out_dir={tmp_path}", *TINY_MODEL, "--warmup_iters=0", "--eval_interval=2",
            "--dtype=auto"]
    proc = run("train.py", *args, "--max_iters=2")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("dtype "))
    assert "s/step (fastest of 2" in line or "the safer kept" in line, line
    assert "measured now" in line, line
    chosen = line.split()[1].rstrip(",")
    assert "compile False: the default on cpu" in proc.stdout  # hardware.choose_compile, as train.py prints it
    resumed = run("train.py", *args, "--max_iters=4", "--init_from=resume")
    assert f"dtype {chosen} (the dtype this run trained in (resumed" in resumed.stdout
    # torch's AVX2 kernels: bf16 emulated, as on an AVX2 CPU
    forced = run("train.py", f"--data_dir={char_data}", f"--out_dir={tmp_path}/avx2", "--max_iters=0",
                 *TINY_MODEL, "--dtype=bfloat16", "--warmup_iters=0", env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert "dtype float32" not in forced.stdout and forced.stderr.count("warning: bfloat16 was asked for") == 1


@pytest.mark.parametrize("cuda, mps, picked", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_device_auto_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, picked):
    from nanovha.config import resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert resolve_device("auto") == picked


@pytest.mark.parametrize("device_type, given, on, why", [
    ("cuda", None, True, "compile True: the default on cuda"),
    ("cpu", None, False, "compile False: the default on cpu"),
    ("mps", None, False, "compile False: the default on mps"),
    ("cpu", True, True, "compile True: asked for"),
    ("cuda", False, False, "compile False: asked for"),
])
def test_compile_is_on_by_default_for_cuda_only(device_type, given, on, why):
    assert hardware.choose_compile(device_type, given) == (on, why)


def test_vector_rates_prints_a_row_per_way_to_multiply_and_add():
    """lab/vector_rates.py: a rate for the float FMA on any x86 CPU with AVX2 or AVX-512, and for VDPBF16PS exactly
    where the CPU has AVX512_BF16; a compiler that cannot be run is one line before any timing."""
    out = run("lab/vector_rates.py", "--rounds=1", "--seconds=0.01").stdout.splitlines()
    assert "clock about" in out[0], out
    rows = {line.split(",")[0].split("-bit ")[-1]: line for line in out[2:]}
    assert set(rows) == {"FMA", "VDPBF16PS"}, out
    dot = rows["VDPBF16PS"]
    assert ("not on this CPU" in dot) == (not torch.cpu._is_avx512_bf16_supported()), dot
    for line in rows.values():
        if "not on this CPU" not in line:
            assert all(float(x) > 0 for x in line.split()[-3:]), line
    bad = run("lab/vector_rates.py", check=False, env={"CXX": "/nonexistent/c++"})
    assert bad.returncode == 1 and bad.stdout == "", bad
    assert bad.stderr.strip() == ("error: the C++ compiler /nonexistent/c++ did not build the probe "
                                  "(FileNotFoundError); set CXX to one that works"), bad.stderr
