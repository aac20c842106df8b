# The demo: a 0.7M-parameter VHA model on the complete works of Shakespeare, char-level.
# 4 layers, width 128; 8 virtual query heads made from 4 physical q projections, 2 KV heads,
# postmix rank 2. After `python fold.py` it is a plain 8Q/2KV GQA model.
# KV cache: 4 layers x 2 (K and V) x 2 heads x 16 dims = 256 values = 512 B/token in bf16 (1 KB in fp32).
# Budget: 16 rows x 256 tokens = 4,096 tokens/iter x 1,200 iterations = 4.9M tokens (1.08 passes over the
# 4.55M training characters). README has the curve and the wall time on each CPU kind.
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

# auto: a GPU runs bf16 autocast; a CPU times fp32 against bf16 autocast (where bf16 is native) on this model and
# keeps the faster. The run's first lines print both timings and the choice.
dtype = "auto"
