# One GPU: warm up Qwen3-0.6B converted to VHA (16 virtual heads from 8 physical query projections over 2 KV heads, a
# 4x smaller KV cache than its 8 KV heads) with the authors' phase 0 and logit distillation (docs/convert.md#warm-up).
# NOT RUN HERE (no GPU, no hub access in this repo's CI): the figures below are arithmetic, not measurements.
#
# TOKENIZER: Qwen3's, not GPT-2's: FineWeb-Edu tokenized with the folder's tokenizer (~151,669 ids, so uint32 bins:
# 600,000,000 tokens x 4 bytes = 2.4 GB; 99% = 594,000,000 train tokens, more than the 524,288,000 below), prepared
# once, before training (train.py refuses, in one line and before any download, to prepare data_dir with
# data/fineweb_edu's default GPT-2 tokenizer):
#
# python data/fineweb_edu/prepare.py --tokenizer=hf --hf_tokenizer=Qwen3-0.6B --num_tokens=600000000
#     --out_dir=data/fineweb_edu_qwen3
# python convert.py --src=Qwen3-0.6B --out_dir=out-qwen3-vha --n_kv_head=2   # the student (its shape comes from it)
# python train.py config/qwen3_0p6b_vha_warmup.py                          # the teacher: the Hugging Face folder
#
# Budget (config/qwen3_0p6b_gqa2_uptrain.py, the matched baseline, is a diff applied after this file: the same):
#   tokens/iter = 4 rows x 2048 tokens x 16 accumulation steps = 131,072
#   4,000 iterations x 131,072 = 524,288,000 tokens (~0.5B: a short warm-up, not GQA uptraining's ~5% of pretraining)
#   freeze: 500 iterations x 131,072 = 65,536,000 tokens train only qkv_proj, o_proj, premix and postmix (phase 0)
#   distillation: alpha 0.7 at T = 1 throughout (the authors hold 0.7, then decay it to 0; not implemented here)
#   compute: 3.887 GFLOPs/token (student, training) + 1.427 GFLOPs/token (teacher, forward) at T=2048 (model.py's
#   accounting; the teacher's share is logged as teacher_share, measured). On one H100 (989 TFLOP/s dense bf16) at
#   an assumed 40% MFU: 524,288,000 x 5.314e9 / (0.4 x 989e12) = 7,043 s, about 2.0 h.
#   Memory: the (4, 2048, 151,936) logits are 2.5 GB each in bf16 (student, teacher, and fp32 copies in the loss).
out_dir = "out-qwen3-vha-warmup"
init_from = "out-qwen3-vha/ckpt.pt"
teacher = "Qwen3-0.6B"
dataset = "fineweb_edu"
data_dir = "data/fineweb_edu_qwen3"  # the prepare command above

freeze_iters = 500
distill_alpha = 0.7
distill_temperature = 1.0

block_size = 2048
batch_size = 4
gradient_accumulation_steps = 16
max_iters = 4000
lr_decay_iters = 4000
warmup_iters = 100
learning_rate = 2e-5  # the authors' 1.7B warm-up: 2e-5 cosine to 1e-5
min_lr = 1e-5
weight_decay = 0.1
eval_interval = 250
eval_iters = 50
log_interval = 10
dtype = "bfloat16"
compile = True
