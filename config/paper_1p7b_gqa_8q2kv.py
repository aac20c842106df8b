# The paper's 1.7B GQA 8Q/2KV: the 8 physical query projections and 2 KV heads that VHA trains with.
# KV cache: 2 x 2 heads x 128 dims = 512 values = 1 KB per layer per token in bf16.
# For the cost table: python bench.py --costs=True. The paper used the Qwen3 tokenizer (vocab 151936,
# which bench.py assumes); train.py takes the vocab from --dataset. Training it needs GPUs.
n_layer = 28
n_embd = 2048
n_head = 8
n_kv_head = 2
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
batch_size = 1  # x 16 accumulation steps = 16 x 4,096 tokens: fits one 80 GB GPU (arithmetic in paper_1p7b_gqa8.py)
gradient_accumulation_steps = 16
