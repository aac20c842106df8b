# python ablate.py --size=gpu: one GPU, config/fineweb's 120M twins, 2 seeds
# tokens per run = lm_iters x batch_size x block_size x gradient_accumulation_steps
#                = 4800 x 32 x 1024 x 16 = 2.52B (the budget's arithmetic is in config/fineweb/vha.py)
out_root = "out-ablate-gpu"
variants = "gqa8,gqa2,vha"
config_dir = "config/fineweb"
lm_dataset = "fineweb_edu"
n_seeds = 2
lm_iters = 4800
batch_size = 32
block_size = 1024
gradient_accumulation_steps = 16
warmup_iters = 200
eval_interval = 250
eval_iters = 50
log_interval = 10
