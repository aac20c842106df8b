# One GPU, FineWeb-Edu: the same-deploy GQA twin of vha.py (16 query heads, 2 KV heads, trained directly): what a
# folded vha.py becomes, with all 16 query projections trained as such. A diff on vha.py: identical except attention.
# KV cache: 12 layers x 2 (K, V) x 2 heads x 64 = 3072 values = 6,144 B/token in bf16.
# 123.6M parameters (GPT-2 vocab 50257), 0.817 GFLOPs/token at T=1024 (model.py's accounting): on one H100 at an
# assumed 40% MFU, 2.52e9 x 0.817e9 / (0.4 x 989e12) = 5,195 s, about 1.4 h (vha.py has the budget's arithmetic).
# python train.py config/fineweb/vha.py config/fineweb/gqa2.py
out_dir = "out-fineweb-gqa2"
attn = "gqa"
vha_postmix_rank = None
