# The paper's 1.7B GQA-2, a diff on the GQA-8 base: 16 query heads, 2 KV heads of dim 128, the deployed shape of a
# folded VHA. KV cache: 2 x 2 heads x 128 dims = 512 values = 1 KB per layer per token in bf16 (28 KB for 28 layers).
# python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_gqa2.py   (the cost table: python bench.py --costs=True)
n_kv_head = 2
