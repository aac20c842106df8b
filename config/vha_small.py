# The demo: a 0.7M-parameter VHA model on the complete works of Shakespeare, char-level.
# 4 layers, width 128; 8 virtual query heads made from 4 physical q projections, 2 KV heads,
# postmix rank 2. After `python fold.py` it is a plain 8Q/2KV GQA model.
# KV cache: 4 layers x 2 (K and V) x 2 heads x 16 dims = 256 values = 512 B/token in bf16 (1 KB in fp32).
# Budget: 16 rows x 256 tokens = 4,096 tokens/iter x 1,200 iterations = 4.9M tokens (1.08 passes over the
# 4.55M training characters). 2-core CPU: about 7 min in fp32 (what auto picks on AVX2), 5.5 min in native bf16;
# README has the curve.
out_dir = "out-vha-small"
dataset = "shakespeare_char"

n_layer = 4
n_embd = 128
n_head = 8
n_kv_head = 2
attn = "vha"
vha_postmix_rank = 2

block_size = 256
batch_size = 16
max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 100
learning_rate = 2e-3
min_lr = 2e-4
eval_interval = 250
eval_iters = 20
log_interval = 50

# auto: bf16 autocast where the hardware has it (1.5x faster than fp32 on AVX-512 BF16 / AMX CPUs and GPUs),
# fp32 where it would be emulated (AVX2 CPUs: about 11x slower). The run's first lines say which it chose.
dtype = "auto"
