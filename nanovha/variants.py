"""
The attention variants the comparisons name, in one table: name -> a one-line description and its
GPTConfig overrides. Every command that names a variant reads it: sweep.py and bench_decode.py
build their models from it, ablate.py's variants are its names (each written out as
config/ablations/<name>.py with the arithmetic, which tests/test_configs.py checks against this
table), and tests/test_docs.py checks that no other name is used.

The overrides are for H query heads of dim d in a model of width D, whose small cache is kv KV
heads (VHA's: 2 in every preset, so vha and its ablations cache what gqa2 does). mla and mfa get
that cache too: 2 * kv * d values per layer and token. A name carries its number where it has
one: gqa2 has 2 KV heads whatever kv is.
"""
import re
from collections import namedtuple

Variant = namedtuple("Variant", "about overrides")  # overrides(H, d, D, kv) -> GPTConfig fields

VARIANTS = {
    "mha": Variant("MHA: every query head has its own KV head", lambda H, d, D, kv: dict(attn="gqa", n_kv_head=H)),
    "gqa8": Variant("GQA with 8 KV heads (the paper's GQA-8: 4x VHA's cache)",
                    lambda H, d, D, kv: dict(attn="gqa", n_kv_head=8)),
    "gqa4": Variant("GQA with 4 KV heads", lambda H, d, D, kv: dict(attn="gqa", n_kv_head=4)),
    "gqa2": Variant("GQA with 2 KV heads, trained directly: the model a folded VHA deploys as",
                    lambda H, d, D, kv: dict(attn="gqa", n_kv_head=2)),
    "gqa2_half_q": Variant("GQA with VHA's physical query projections (H/2 heads) attending "
                           "directly, 2 KV heads",
                           lambda H, d, D, kv: dict(attn="gqa", n_head=H // 2, n_kv_head=2)),
    "mqa": Variant("MQA: one KV head", lambda H, d, D, kv: dict(attn="gqa", n_kv_head=1)),
    "vha": Variant("VHA: H/2 physical -> H virtual query heads (premix), a linear postmix, kv KV heads",
                   lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv)),
    "vha_folded": Variant("vha folded into the plain GQA model it is (fold_to_gqa): what a VHA model decodes as",
                          lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv)),
    "premix_only": Variant("VHA with the Q premix and no postmix",
                           lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv, vha_postmix=False)),
    "postmix_only": Variant("VHA with the postmix and no premix: the H/2 physical heads attend",
                            lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv, vha_premix=False)),
    "silu_postmix": Variant("VHA with the paper's nonlinear postmix a + V silu(U^T a) (it does not fold)",
                            lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv, vha_postmix_act="silu")),
    "rank4": Variant("VHA with postmix rank 4", lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv, vha_postmix_rank=4)),
    "rank8": Variant("VHA with postmix rank 8", lambda H, d, D, kv: dict(attn="vha", n_kv_head=kv, vha_postmix_rank=8)),
    # MLA caches its latent c_kv plus one shared RoPE key: rank + d/2 = 2 * kv * d values per layer
    "mla": Variant("MLA (DeepSeek's latent attention) at VHA's cache: latent + shared RoPE key",
                   lambda H, d, D, kv: dict(attn="mla", n_kv_head=H, qk_norm=False, mla_rope_dim=d // 2,
                                            mla_kv_rank=2 * kv * d - d // 2)),
    # MFA caches one KV head of dim kv * d: 2 * kv * d values per layer; its query has rank D / 2
    "mfa": Variant("MFA (StepFun's multi-matrix factorization attention) at VHA's cache: one wide KV head",
                   lambda H, d, D, kv: dict(attn="mfa", n_kv_head=1, head_dim=kv * d, q_rank=D // 2)),
}
# gqaN: N KV heads, for any N (the table lists the ones compared)
GQA_N = re.compile(r"gqa([1-9][0-9]*)")
RENAMED = {"gqa_same_deploy": "gqa2", "gqa_4x_cache": "gqa8", "gqa_half_q": "gqa2_half_q"}  # ablate.py's old names


def is_variant(name):
    return name in VARIANTS or bool(GQA_N.fullmatch(name))


def unknown_variant(name, known=VARIANTS):
    """The one-line problem of a variant name that is not in `known` (a command's subset of the
    table)."""
    hint = f" ({name} is now {RENAMED[name]})" if name in RENAMED else ""
    return f"unknown variant {name!r}{hint}; choose from {', '.join(known)}"


def overrides(name, n_head, head_dim, n_embd, kv_head=2):
    """The GPTConfig fields of variant `name` (or gqaN) for n_head query heads of dim head_dim,
    width n_embd, and kv_head KV heads for VHA's cache. Raises ValueError for a name the table
    does not know."""
    if name in VARIANTS:
        return VARIANTS[name].overrides(n_head, head_dim, n_embd, kv_head)
    if match := GQA_N.fullmatch(name):
        return dict(attn="gqa", n_kv_head=int(match.group(1)))
    raise ValueError(unknown_variant(name, [*VARIANTS, "gqaN (N KV heads)"]))
