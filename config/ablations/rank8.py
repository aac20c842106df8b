# Ablation (use after config/vha_small.py): postmix at full rank 8 = H_v (the paper: 4 -> 128).
# KV cache: 512 B/token in bf16.
out_dir = "out-ablate-rank8"
attn = "vha"
vha_postmix_rank = 8
