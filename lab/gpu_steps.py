"""
The GPU check's steps that are not a command of the repo (lab/gpu_check.py runs each as a child
process): the preflight, correctness and the SDPA kernels. Each appends one JSON line per figure
to --out the moment it is measured, with "ok" where it is a pass/fail, and exits 1 if any failed.

    python3 lab/gpu_steps.py preflight --out=gpu-report/preflight.jsonl
    python3 lab/gpu_steps.py correctness --out=... --dry_run=True     # the CPU, toy sizes
"""
import copy
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from model import GPT, GPTConfig, fold_to_gqa  # noqa: E402
from nanovha.config import flat_defaults, settings  # noqa: E402
from nanovha.engine.attention import use_engine  # noqa: E402
from nanovha.engine.plan import rule_plan  # noqa: E402
from nanovha.figures import compile_counters, gpu_spec, sdpa_backends  # noqa: E402
from nanovha.hardware import allow_tf32  # noqa: E402
from nanovha.outputs import append_line  # noqa: E402

out = ""  # the JSON-lines file this step appends to
dry_run = False  # the CPU, toy sizes
STEPS = ("preflight", "correctness", "kernels")
step = sys.argv[1] if len(sys.argv) > 1 else ""
config = settings(flat_defaults(globals()), sys.argv[2:])
device = "cpu" if config["dry_run"] else "cuda"
failed = []


def record(**figure):
    """One figure, appended the moment it is measured (a step cut later keeps it) and printed."""
    append_line(config["out"], dict(step=step, **figure))
    print(figure, flush=True)
    if figure.get("ok") is False:
        failed.append(figure)


def preflight():
    """What the machine is, TF32 as the project sets it, a compiled float32 bmm, and bf16 GQA SDPA
    on a fused kernel."""
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if device == "cuda" else None
    record(gpu=name, driver=smi.stdout.strip() if smi and smi.returncode == 0 else None, cuda=torch.version.cuda,
           torch=torch.__version__, python=sys.version.split()[0], spec=gpu_spec(name),
           memory_gib=torch.cuda.mem_get_info()[1] / 2**30 if device == "cuda" else None)
    allow_tf32()
    getters = [torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
               torch.backends.cudnn.allow_tf32]
    record(check="TF32 as train.py sets it; every getter reads", value=getters, ok=getters[0] == "high")
    a, b = torch.randn(2, 3, 256, 256, device=device).unbind()
    bmm = torch.compile(lambda a, b: torch.einsum("bij,bjk->bik", a, b).relu())
    error = ((bmm(a, b) - (a.double() @ b.double()).relu()).abs().max() / (a @ b).abs().max()).item()
    record(check="compiled float32 bmm (inductor) vs float64", value=error, ok=error < 1e-2)
    q = torch.randn(1, 16, 1024, 64, device=device, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 2, 1024, 64, device=device, dtype=torch.bfloat16)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    backends = sdpa_backends(sdpa)[0]
    record(check="bf16 GQA SDPA (16 q heads, 2 KV heads) kernel", value=backends,
           ok=bool(backends) and "math" not in backends)


def test_model(dry_run, **kw):
    shape = dict(vocab_size=128, block_size=256, n_layer=2, n_embd=64 if dry_run else 512, n_head=16,
                 head_dim=16 if dry_run else 32, n_kv_head=2)
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**shape, **kw}))


def decoded(model, idx, step=None):
    """Logits of positions 31..62: a prefill of 32 tokens, then one token at a time (by `step` at
    a tensor position over the static cache, as a compiled step runs)."""
    model.setup_cache(1, 64)
    out = [model.prefill(idx[:, :32])]
    for t in range(32, 63):
        out.append(model.decode_one_token(idx[:, t:t + 1], t) if step is None else
                   step(idx[:, t:t + 1], torch.tensor([t], device=idx.device)).clone())
    return torch.stack(out, 1)  # (1, 32, vocab)


def correctness():
    """The fold in float64, then bf16 on every path the benchmarks time against the float64
    reference, the compiled step (CUDA graphs over the engine's KV memory) last."""
    vha = test_model(config["dry_run"], attn="vha", vha_postmix_rank=2).double()
    with torch.no_grad():  # premix and postmix off the identity, so the fold has something to fold
        for block in vha.blocks:
            block.attn.premix.add_(0.1 * torch.randn_like(block.attn.premix))
            block.attn.postmix_V.normal_(0, 0.3)
    folded = fold_to_gqa(vha)
    idx = torch.randint(128, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    vha, folded = vha.to(device).eval(), folded.to(device).eval()
    rel = lambda a, ref: ((a.double() - ref).abs().max() / ref.abs().max()).item()
    with torch.inference_mode():
        ref = vha(idx)[0]  # (1, 64, vocab) float64, unfolded, uncached: the reference
        error = rel(folded(idx)[0], ref)
    record(check="float64: folded vs unfolded", value=error, ok=error < 1e-10)
    plan = rule_plan(copy.deepcopy(folded), [torch.bfloat16], ("compiled",))  # as sample.py runs on a GPU
    a16, f16 = vha.to(torch.bfloat16), folded.to(torch.bfloat16)
    step = plan.step or torch.compile(plan.model.decode_one_token, fullgraph=True)  # the CPU: no CUDA graphs
    paths = {"forward, unfolded": lambda: a16(idx)[0], "forward, folded": lambda: f16(idx)[0],
             "eager decode, model.py's": lambda: decoded(f16, idx),
             "eager decode, the engine's": lambda: decoded(use_engine(f16), idx),
             "compiled step, the plan's": lambda: decoded(plan.model, idx, step)}
    with torch.inference_mode():
        for name, logits in paths.items():
            error = rel(logits(), ref if name.startswith("forward") else ref[:, 31:63])
            record(check=f"bf16 {name} vs float64", value=error, ok=error <= 5e-2)
    graphs = compile_counters()
    record(check="compile counters (graphs, breaks, CUDA-graph skips)", value=graphs,
           ok=graphs["graph_breaks"] == 0 and graphs["cudagraph_skips"] == 0)


def kernels():
    """The SDPA backend each training, prefill and decode step really runs; the math path fails."""
    x = torch.randint(128, (2, 128), device=device)
    for kind, kw in (("gqa", {}), ("vha", dict(attn="vha", vha_postmix_rank=4))):
        model = test_model(config["dry_run"], **kw).to(device).train()
        for dtype in (torch.float32, torch.bfloat16):
            def train_step():
                with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
                    model(x, x)[1].backward()
            backends = sdpa_backends(train_step)[0]
            record(check=f"train {kind} {dtype}", value=backends, ok=bool(backends) and "math" not in backends)
    model = use_engine(test_model(config["dry_run"]).to(device, torch.bfloat16).eval())
    model.setup_cache(1, 1024)
    prompt = torch.randint(128, (1, 1000), device=device)
    steps = {"prefill 1000": lambda: model.prefill(prompt),
             "decode, eager": lambda: model.decode_one_token(prompt[:, :1], 1000),
             "decode, static (the graph path)": lambda: model.decode_one_token(prompt[:, :1], torch.tensor(
                 [1001], device=device))}
    for name, fn in steps.items():
        with torch.inference_mode():
            backends = sdpa_backends(fn)[0]
        record(check=f"bf16 {name}", value=backends, ok="math" not in backends)
    with sdpa_kernel([SDPBackend.MATH]):
        backends = sdpa_backends(lambda: model.prefill(prompt))[0]
    record(check="self-check: forced SDPBackend.MATH reads as math", value=backends, ok=backends == ["math"])


if __name__ == "__main__":
    if step not in STEPS or not config["out"]:
        sys.exit(f"error: give a step ({', '.join(STEPS)}) and --out=FILE.jsonl")
    globals()[step]()
    sys.exit(1 if failed else 0)
