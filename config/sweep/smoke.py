# python sweep.py --smoke: a seconds-long check that every step of the sweep runs (tiny models, one small point)
sweep_root = "out-sweep-smoke"
sweep_variants = "gqa2,vha"
sweep_seeds = 2
points = "n_keys=16,n_values=16"
task_args = "n_pairs=4"
sweep_iters = 6
curriculum_iters = 3
sweep_batch_size = 8
sweep_eval_interval = 3
n_val = 16
sweep_model_args = "--n_layer=1 --n_embd=16 --warmup_iters=1"
device = "cpu"
robust_seeds = 1
robust_variants = "gqa2"
