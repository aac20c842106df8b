# Token-level associative recall (MQAR, data/recall) with a small GQA/MHA model: the recall sweep's base
# (python sweep.py sets attn/n_head/n_kv_head per variant and the task knobs per sweep point).
# Rows: 16 key-value pairs, then the 16 keys again: T = 3 x 16 + 1 = 49 tokens, loss on the 16 answers.
# 2 layers, width 64, 8 heads of dim 8. MHA KV cache: 2 layers x 2 (K, V) x 8 heads x 8 = 256 values/token.
# Budget: 1500 steps x 128 rows at the default 128 keys (sweep.py gives 64 rows at 64 keys; fewer rows stall
# some runs); the number of pairs ramps 2 -> 16 over the first 750 steps, and every batch keeps rows from 2 pairs up
# to the current level ("mix"; why, and the batch sizes' screens and held-out tests: docs/recall.md).
out_dir = "out-recall-mqar"
dataset = "recall"  # python data/recall/prepare.py writes the default MQAR spec there (or pass --data_dir)

n_layer = 2
n_embd = 64
n_head = 8
n_kv_head = 8
head_dim = 8
attn = "gqa"
rope_theta = 1e4  # short rows: the recipe's choice (docs/recall.md)

block_size = 49
batch_size = 128
max_iters = 1500
lr_decay_iters = 1500
curriculum_iters = 750
curriculum_mode = "mix"
warmup_iters = 100
learning_rate = 1e-3
min_lr = 1e-4
eval_interval = 25  # held-out accuracy every 25 steps: steps to 50/90/99% are interpolated between evals
eval_iters = 1  # train loss on 1 batch at full difficulty; val: data/recall's held-out rows
log_interval = 100
dtype = "float32"  # every run of a sweep in one dtype, whatever the CPU ("auto" would time it per run)
