# Ablation (use after config/vha_small.py): postmix rank 4 instead of 2 (the paper: 4 -> 32).
# KV cache: 512 B/token in bf16.
out_dir = "out-ablate-rank4"
attn = "vha"
vha_postmix_rank = 4
