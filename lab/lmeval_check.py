"""
lm-eval on a Hugging Face export against our own checkpoint: the harness runs a multiple-choice
task on the folder (fold.py --export_hf wrote it; the folded model), our checkpoint as trained
(the unfolded VHA model, float64) scores the same requests tokenized as lm-eval does
(nanovha/bridges/lmeval.py), and one report says both accuracies and how far apart every log-likelihood
is. It needs lm-eval (pip install -r requirements-lmeval.txt); nothing is downloaded.

    python lab/lmeval_check.py --out_dir=out-vha-small --hf_dir=hf-vha-small      # the demo, shakespeare_mc
    python lab/lmeval_check.py --out_dir=OUT --hf_dir=HF --task=TASK --include_path=FOLDER
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanovha.bridges import lmeval  # noqa: E402
from nanovha.config import flat_defaults, settings  # noqa: E402
from nanovha.loading import load_model  # noqa: E402

out_dir = "out-vha-small"  # the run folder with the checkpoint as trained
ckpt_name = "ckpt.pt"
hf_dir = ""  # the export (default: <out_dir>/hf)
task = "shakespeare_mc"
include_path = os.path.join(ROOT, "data", "shakespeare_mc")  # where the task's yaml is
limit = 0  # items (0: all)

defaults = flat_defaults(globals())


def main(argv):
    cfg = settings(defaults, argv)
    hf, path = cfg["hf_dir"] or os.path.join(cfg["out_dir"], "hf"), os.path.join(cfg["out_dir"], cfg["ckpt_name"])
    for p, what in ((path, "a checkpoint (train.py writes one)"), (os.path.join(hf, "config.json"),
                                                                   "an export (fold.py "
                                                                   "--export_hf=DIR writes one)")):
        if not os.path.isfile(p):
            sys.exit(f"error: {p} not found: give {what}")
    try:
        model, ckpt = load_model(path)
    except ValueError as e:
        sys.exit(f"error: {e}")
    model = model.double().eval()
    t0 = time.time()
    try:
        lm, results, samples = lmeval.run_lm_eval(hf, cfg["task"], cfg["include_path"], limit=cfg["limit"] or None)
    except ImportError as e:
        sys.exit(f"error: {e}")
    t1 = time.time()
    try:
        ours = lmeval.loglikelihoods(model, ckpt["meta"], lm.prefix_token_id,
                                     [pair for s in samples for pair in s["arguments"]])
        report = lmeval.side_by_side(samples, ours)
    except ValueError as e:
        sys.exit(f"error: {e}")
    import lm_eval
    print(f"lm-eval {lm_eval.__version__} on {hf} (folded): {cfg['task']}, {report['items']} items, acc "
          f"{results['acc,none']:.4f}, acc_norm {results['acc_norm,none']:.4f} ({t1 - t0:.1f} s)")
    print(f"ours on {path} ({model.cfg.attn}, float64), the same {report['requests']} requests: acc "
          f"{report['acc']:.4f}, acc_norm {report['acc_norm']:.4f} ({time.time() - t1:.1f} s); the same pick on "
          f"{report['same_pick']}/{report['items']} items")
    print(f"|log-likelihood diff| max {report['max_diff']:.2e} ({report['per_token']:.1e} per "
          f"scored token of the "
          f"logit scale); is_greedy {'identical' if report['greedy_agree'] else 'DIFFERS'}")


if __name__ == "__main__":
    main(sys.argv[1:])
