# Ablation (use after config/vha_small.py): MFA (StepFun's multi-matrix factorization attention, Step-3 form)
# at VHA's cache budget: one KV head of dim 32 (twice the demo's head dim), 8 query heads of dim 32 from a
# low-rank query q = RMSNorm(x W_qa) W_qb of rank 64. KV cache: 4 layers x 2 x 1 x 32 = 256 values
# = 512 B/token in bf16, the same as VHA's 4 x 2 x 2 x 16.
out_dir = "out-ablate-mfa"
attn = "mfa"
n_head = 8
n_kv_head = 1
head_dim = 32
q_rank = 64
