# Ablation (use after config/vha_small.py): GQA 4Q/2KV: the same physical q projections as VHA
# but only 4 heads attend. head_dim stays 16. KV cache: 512 B/token in bf16.
out_dir = "out-ablate-gqa2-half-q"
attn = "gqa"
n_head = 4
n_kv_head = 2
head_dim = 16
