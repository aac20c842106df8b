# python uptrain.py --quick: the comparison at a quarter of the teacher's budget: a pipeline check
out_root = "out-uptrain-quick"
teacher_iters = 300
n_seeds = 2
block_size = 128
eval_iters = 10
uptrain_warmup_iters = 3
jobs = 2
threads = 1
