"""A readable summary of a model: its config and where its parameters are."""

from __future__ import annotations

from collections import Counter

from torch import nn

from aiayn.models import TransformerModel


def parameter_breakdown(model: TransformerModel) -> dict[str, int]:
    """Parameters per top-level component (embeddings, encoder, decoder, head), tied counted once."""
    seen: set[int] = set()
    counts: Counter[str] = Counter()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        counts[name.split(".")[0]] += p.numel()
    return dict(counts)


def summarize(model: TransformerModel) -> str:
    c = model.config
    lines = [
        f"{type(model).__name__} ({c.arch}): {model.num_parameters():,} parameters"
        f" ({model.num_parameters(exclude_embeddings=True):,} without embeddings)",
        f"  layers {c.n_layers}"
        + (f"+{c.decoder_layers}" if c.arch == "encoder-decoder" else "")
        + f", d_model {c.d_model}, heads {c.attention.n_heads} (kv {c.kv_heads}),"
        f" d_head {c.head_dim},"
        f" d_ff {c.ffn.d_ff}, vocab {c.vocab_size}, max_len {c.max_len}",
        f"  positions {c.positions.scheme}, norm {c.norm} ({c.norm_position}-LN), activation"
        f" {c.ffn.activation}, dropout {c.dropout}, tied embeddings {c.tie_embeddings},"
        f" attention backend {c.attention.backend}",
    ]
    for part, n in parameter_breakdown(model).items():
        lines.append(f"  {part:<12} {n:>14,}")
    n_modules = sum(1 for m in model.modules() if isinstance(m, nn.Linear))
    lines.append(f"  {n_modules} linear layers")
    return "\n".join(lines)
