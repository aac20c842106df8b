# python ablate.py --quick: 3 variants x 2 seeds, 200 steps: a pipeline check
out_root = "out-ablate-quick"
variants = "gqa8,gqa2,vha"
n_seeds = 2
lm_iters = 200
block_size = 128
warmup_iters = 20
eval_interval = 50
eval_iters = 10
jobs = 2
threads = 1
