# python sweep.py --quick: 4 variants x 2 points x 2 seeds, the recipe's steps: a pipeline check
sweep_root = "out-sweep-quick"
sweep_variants = "mha,gqa2,mqa,vha"
sweep_seeds = 2
