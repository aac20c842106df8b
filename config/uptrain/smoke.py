# python uptrain.py --smoke: seconds-long, tiny models: checks that every step of the comparison runs
out_root = "out-uptrain-smoke"
teacher_iters = 30
n_seeds = 2
batch_size = 4
block_size = 64
eval_iters = 2
evals = 1
log_interval = 1
uptrain_warmup_iters = 1
model_args = "--n_layer=1 --n_embd=32"
device = "cpu"
dtype = "float32"
jobs = 2
threads = 1
