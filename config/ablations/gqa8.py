# Ablation (use after config/vha_small.py): GQA with 4x the cache, 8Q/8KV (here that is MHA).
# The paper's GQA-8 baseline. KV cache: 4 x 2 x 8 x 16 = 1024 values = 2048 B/token in bf16.
out_dir = "out-ablate-gqa8"
attn = "gqa"
n_head = 8
n_kv_head = 8
