# Ablation (use after config/vha_small.py): VHA with postmix only: the 4 physical q heads attend
# directly (2 per KV head) and postmix mixes those 4 outputs. KV cache: 512 B/token in bf16.
out_dir = "out-ablate-postmix-only"
attn = "vha"
vha_premix = False
vha_postmix = True
