# MLA at the paper's 1.7B shape and its 1 KB per layer per token (bf16): the cache holds the latent c_kv
# (448) + one shared RoPE key (64) = 512 values = 1 KB, the same as GQA-2's 2 x 2 x 128. DeepSeek-V3 uses
# 512 + 64 (1,152 B); we trim the latent to match the budget. 16 heads of dim 128 up-projected from it,
# a low-rank query of rank 1024 (DeepSeek-V2-Lite has none, V3 has 1536 for width 7168).
# For the cost table: python bench.py --costs=True. Training it needs GPUs.
n_layer = 28
n_embd = 2048
n_head = 16
n_kv_head = 16  # MLA: a key and a value per head, from the latent
head_dim = 128
mlp_hidden = 6144
rope_theta = 1e6
attn = "mla"
qk_norm = False  # MLA normalises its latents instead (see MLAttention)
mla_kv_rank = 448
mla_rope_dim = 64
q_rank = 1024
block_size = 4096
batch_size = 1  # x 16 accumulation steps = 16 x 4,096 tokens: fits one 80 GB GPU (arithmetic in paper_1p7b_gqa8.py)
gradient_accumulation_steps = 16
