# One GPU, FineWeb-Edu: GQA with 4x the cache of vha.py (16 query heads, 8 KV heads; the paper's GQA-8), a diff on
# vha.py: identical except attention.
# KV cache: 12 layers x 2 (K, V) x 8 heads x 64 = 12288 values = 24,576 B/token in bf16.
# 130.7M parameters (GPT-2 vocab 50257), 0.859 GFLOPs/token at T=1024 (model.py's accounting): on one H100 at an
# assumed 40% MFU, 2.52e9 x 0.859e9 / (0.4 x 989e12) = 5,465 s, about 1.5 h (vha.py has the budget's arithmetic).
# python train.py config/fineweb/vha.py config/fineweb/gqa8.py
out_dir = "out-fineweb-gqa8"
attn = "gqa"
n_kv_head = 8
vha_postmix_rank = None
