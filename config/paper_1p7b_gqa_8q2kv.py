# The paper's 1.7B GQA 8Q/2KV, a diff on the GQA-8 base: the 8 physical query projections and 2 KV heads that VHA
# trains with. KV cache: 2 x 2 heads x 128 dims = 512 values = 1 KB per layer per token in bf16.
# python train.py config/paper_1p7b_gqa8.py config/paper_1p7b_gqa_8q2kv.py
n_head = 8
n_kv_head = 2
