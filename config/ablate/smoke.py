# python ablate.py --smoke: seconds-long, one tiny VHA run: checks that every step of the grid runs
out_root = "out-ablate-smoke"
variants = "vha"
n_seeds = 1
lm_iters = 4
batch_size = 4
block_size = 64
warmup_iters = 1
eval_interval = 2
eval_iters = 1
log_interval = 1
model_args = "--n_layer=1 --n_embd=32"
device = "cpu"
dtype = "float32"
threads = 1
