# Ablation (use after config/vha_small.py): GQA 8Q/2KV trained directly: the same deployed model
# as a folded VHA. KV cache: 4 x 2 x 2 x 16 = 256 values = 512 B/token in bf16.
out_dir = "out-ablate-gqa2"
attn = "gqa"
n_head = 8
n_kv_head = 2
