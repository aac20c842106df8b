# MFA at the paper's 1.7B shape, a diff on the GQA-8 base, at 1 KB per layer per token (bf16): one KV head of dim
# 256 (Step-3's head dim), 2 x 1 x 256 = 512 values = 1 KB, the same as GQA-2's 2 x 2 x 128. 16 query heads of dim
# 256 from a low-rank query of rank 1024 (Step-3: 64 heads, share_q_dim 2048 at width 7168).
# python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_mfa.py
attn = "mfa"
n_kv_head = 1
head_dim = 256
q_rank = 1024
