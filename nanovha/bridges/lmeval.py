"""
The lm-evaluation-harness beside our own model: lm-eval runs a task on a Hugging Face export
(fold.py --export_hf), and our checkpoint (the unfolded VHA model, in float64) scores the very
same requests, tokenized as lm-eval does:

    lm, results, samples = run_lm_eval(hf_dir, task, include_path)   # lm-eval's Python API, the folder its only arg
    ours = loglikelihoods(model, meta, lm.prefix_token_id, requests)   # [(log-likelihood, greedy, tokens, |logit| max)]
    report = side_by_side(samples, ours)                               # both accuracies, the largest difference

lm-eval's tokenization (api/model.py, _encode_pair): a context's trailing whitespace moves to the
front of the continuation, context + continuation is encoded whole and split where the context's
own ids end; an empty context is the prefix token (the tokenizer's bos, else its eos) unless the
continuation starts with it.
"""
import torch

from data.common import load_tokenizer

INSTALL = "pip install -r requirements-lmeval.txt"


def lm_eval_ids(encode, prefix, context, continuation):
    """(ids, n_context): the tokens lm-eval feeds for one (context, continuation) and how many
    are context."""
    if not context:
        ids = encode(continuation)
        return ([prefix] + ids, 1) if ids[:1] != [prefix] else (ids, 1)
    cut = len(context.rstrip())  # "a context's trailing whitespace belongs to the continuation"
    context, continuation = context[:cut], context[cut:] + continuation
    return encode(context + continuation), len(encode(context))


@torch.no_grad()
def loglikelihoods(model, meta, prefix, requests):
    """(log-likelihood, greedy, tokens scored, largest |logit|) of each (context, continuation) by model, in its
    dtype (float64 for a reference): the sum of log p(token | everything before it) over the continuation, and
    whether every continuation token is the argmax (lm-eval's is_greedy)."""
    encode, out = load_tokenizer(meta)[0], []
    dev = model.embed.weight.device
    for context, continuation in requests:
        ids, n_context = lm_eval_ids(encode, prefix, context, continuation)
        if len(ids) - 1 > model.cfg.block_size:
            raise ValueError(f"a request of {len(ids)} tokens does not fit the model's context of "
                             f"{model.cfg.block_size}: lm-eval would cut it from the left; use shorter items")
        # (T-1, vocab): unpadded
        logits = model(torch.tensor([ids[:-1]], device=dev))[0][0, :, :meta["vocab_size"]]
        # the rows predicting the continuation
        logp = torch.log_softmax(logits.double(), -1)[n_context - 1:].cpu()
        target = torch.tensor(ids[n_context:])
        out.append((logp.gather(1, target[:, None]).sum().item(), bool((logp.argmax(-1) == target).all()),
                    len(target), logits.abs().max().item()))
    return out


def run_lm_eval(hf_dir, task, include_path, device="cpu", limit=None):
    """lm-eval's HFLM on hf_dir (no model argument but the folder) running task from
    include_path, every sample logged. -> (the HFLM, the task's results, its samples)."""
    try:
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ImportError(f"lm-eval is not installed ({e.name}): {INSTALL}") from None
    lm = HFLM(pretrained=hf_dir, device=device)
    out = simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=include_path),
                          log_samples=True, limit=limit)
    return lm, out["results"][task], out["samples"][task]


def side_by_side(samples, ours):
    """lm-eval's multiple-choice samples (in order) against ours (loglikelihoods of their
    requests, in order): our acc and acc_norm (log-likelihood per character of the choice,
    lm-eval's rule), how many choices we pick like
    lm-eval, the largest |log-likelihood difference|, and the largest per scored token and unit of the logit scale.
    """
    theirs = [r for s in samples for (r,) in s["resps"]]
    if len(theirs) != len(ours):
        raise ValueError(f"{len(ours)} log-likelihoods of ours for lm-eval's {len(theirs)}: score its requests")
    scale = max(o[3] for o in ours)
    acc = acc_norm = same_pick = 0
    i = 0
    for s in samples:
        n, lengths = len(s["resps"]), [len(cont) for _, cont in s["arguments"]]
        ll = [o[0] for o in ours[i:i + n]]
        pick = max(range(n), key=ll.__getitem__)
        acc += pick == s["target"]
        acc_norm += max(range(n), key=lambda k: ll[k] / lengths[k]) == s["target"]
        same_pick += pick == max(range(n), key=lambda k: theirs[i + k][0])
        i += n
    return {"items": len(samples), "requests": len(ours), "acc": acc / len(samples),
            "acc_norm": acc_norm / len(samples), "same_pick": same_pick,
            "max_diff": max(abs(o[0] - t[0]) for o, t in zip(ours, theirs)),
            "per_token": max(abs(o[0] - t[0]) / (o[2] * scale) for o, t in zip(ours, theirs)),
            "greedy_agree": all(o[1] == t[1] for o, t in zip(ours, theirs))}
