# Ablation (use after config/vha_small.py): VHA with Q premix only (no postmix).
# KV cache: 512 B/token in bf16.
out_dir = "out-ablate-premix-only"
attn = "vha"
vha_premix = True
vha_postmix = False
