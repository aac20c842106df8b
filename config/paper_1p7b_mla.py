# MLA at the paper's 1.7B shape, a diff on the GQA-8 base, at 1 KB per layer per token (bf16): the cache holds the
# latent c_kv (448) + one shared RoPE key (64) = 512 values = 1 KB, the same as GQA-2's 2 x 2 x 128. DeepSeek-V3
# uses 512 + 64 (1,152 B); we trim the latent to match the budget. 16 heads of dim 128 up-projected from it, a
# low-rank query of rank 1024 (DeepSeek-V2-Lite has none, V3 has 1536 for width 7168).
# python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_mla.py
attn = "mla"
n_kv_head = 16  # MLA: a key and a value per head, from the latent
qk_norm = False  # MLA normalises its latents instead (see MLAttention)
mla_kv_rank = 448
mla_rope_dim = 64
q_rank = 1024
