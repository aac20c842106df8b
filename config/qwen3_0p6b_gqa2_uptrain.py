# One GPU: the matched baseline of config/qwen3_0p6b_vha_warmup.py, a diff applied after it: Qwen3-0.6B mean-pooled
# to GQA 16 query heads over 2 KV heads (GQA uptraining, Ainslie et al. 2023; the same KV cache as the VHA run), warmed
# up identically. NOT RUN HERE (no GPU, no hub access in this repo's CI): the figures below are arithmetic.
#
# python convert.py --src=Qwen3-0.6B --out_dir=out-qwen3-gqa2 --n_kv_head=2 --to=gqa   # the student
# python train.py config/qwen3_0p6b_vha_warmup.py config/qwen3_0p6b_gqa2_uptrain.py
#
# The freeze trains only qkv_proj and o_proj (no premix or postmix). Compute at T=2048 (model.py's accounting):
#   4.016 GFLOPs/token (student, training) + 1.427 GFLOPs/token (teacher, forward); on one H100 (989 TFLOP/s dense
#   bf16) at an assumed 40% MFU: 524,288,000 x 5.443e9 / (0.4 x 989e12) = 7,214 s, about 2.0 h.
out_dir = "out-qwen3-gqa2-uptrain"
init_from = "out-qwen3-gqa2/ckpt.pt"
