# MFA at the paper's 1.7B shape and its 1 KB per layer per token (bf16): one KV head of dim 256 (Step-3's
# head dim), 2 x 1 x 256 = 512 values = 1 KB, the same as GQA-2's 2 x 2 x 128. 16 query heads of dim 256
# from a low-rank query of rank 1024 (Step-3: 64 heads, share_q_dim 2048 at width 7168).
# For the cost table: python bench.py --costs=True. Training it needs GPUs.
n_layer = 28
n_embd = 2048
n_head = 16
n_kv_head = 1
head_dim = 256
mlp_hidden = 6144
rope_theta = 1e6
attn = "mfa"
q_rank = 1024
block_size = 4096
batch_size = 1  # x 16 accumulation steps = 16 x 4,096 tokens: fits one 80 GB GPU (arithmetic in paper_1p7b_gqa8.py)
gradient_accumulation_steps = 16
