# Ablation (use after config/vha_small.py): MLA (DeepSeek-V2/V3 latent attention) at VHA's cache budget.
# Each layer caches the latent c_kv (48) + one shared RoPE key (16) = 64 values, like GQA-2's 2 x 2 x 16:
# 4 layers x 64 = 256 values = 512 B/token in bf16. 8 heads of dim 16 up-projected from the latent;
# the query is full rank (q_rank = None). No per-head QK-norm (see MLAttention); decode absorbs W_uk, W_uv.
out_dir = "out-ablate-mla"
attn = "mla"
n_head = 8
n_kv_head = 8  # MLA: every head gets its own key and value from the latent
qk_norm = False
mla_kv_rank = 48
mla_rope_dim = 16
