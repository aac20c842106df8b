# The paper's 1.7B baseline, GQA-8: Qwen3-style, 16 query heads, 8 KV heads of dim 128.
# KV cache: 2 (K and V) x 8 heads x 128 dims = 2048 values = 4 KB per layer per token in bf16 (112 KB for 28 layers).
# The base of the 1.7B set: every other paper_1p7b_*.py is a diff applied after it, as config/ablations/ are after
# vha_small.py (python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_vha.py). The cost table:
# python bench.py --costs=True. The paper used the Qwen3 tokenizer (vocab 151936, which bench.py assumes); train.py
# takes the vocab from --dataset. Training it needs GPUs.
n_layer = 28
n_embd = 2048
n_head = 16
n_kv_head = 8
head_dim = 128
mlp_hidden = 6144
rope_theta = 1e6
attn = "gqa"
block_size = 4096
# the paper's optimizer: AdamW (0.9, 0.95), weight decay 0.1, clip 1.0, cosine schedule with warmup
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0
# One 80 GB GPU, bf16 autocast: fp32 weights + grads + two AdamW moments = 16 B/param = 27.6 GB for GQA-8's 1.72B
# params (25.2 GB for VHA's 1.58B), + 3.4 GB of bf16 weight copies. Autograd keeps about 4.0 MiB per token here
# (3.75 for VHA): ~110-120 KiB per layer x 28 + 0.6 MiB for the 151,936-wide fp32 log-softmax; measured on CPU
# with torch.autograd.graph.saved_tensors_hooks at T=256/512 (flash-style SDPA: nothing grows with T^2).
# So one 4,096-token row keeps ~16 GiB, and batch 16 (~256 GiB) cannot fit. Micro-batch 1 peaks near
# 27.6 + 3.4 + 17 + ~5 (the logits' gradient) = ~53 GB; 2 rows would be ~75 GB: too close to 80 to promise.
# Not measured on a GPU. The global batch stays 16 rows x 4,096 = 65,536 tokens per iteration:
batch_size = 1
gradient_accumulation_steps = 16
