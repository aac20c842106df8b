# Ablation (use after config/vha_small.py): the paper's nonlinear postmix a + V silu(U^T a).
# It cannot be folded into W_o. KV cache: 512 B/token in bf16.
out_dir = "out-ablate-silu-postmix"
attn = "vha"
vha_postmix_act = "silu"
