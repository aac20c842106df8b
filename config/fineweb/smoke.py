# Apply after any config/fineweb/*.py: the same model for a short check of the whole path (data, compile,
# bf16, eval, checkpoint) before committing hours. 300 iterations x 32 x 1024 x 4 = 39.3M tokens; at the
# budget arithmetic of vha.py that is about 90 s of training at 40% MFU on one H100, plus compile and evals.
# KV cache: unchanged (the model is the same).
out_dir = "out-fineweb-smoke"
gradient_accumulation_steps = 4
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
eval_interval = 100
eval_iters = 10
