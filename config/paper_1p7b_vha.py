# The paper's 1.7B VHA, a diff on the GQA-8 base: 8 physical query projections -> 16 virtual heads (premix), 2 KV
# heads of dim 128, postmix rank 4; folds into paper_1p7b_gqa2.py's shape. KV cache: 1 KB per layer per token in bf16.
# python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_vha.py
attn = "vha"
n_kv_head = 2
vha_postmix_rank = 4
