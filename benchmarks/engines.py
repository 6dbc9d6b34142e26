"""The decoding peers' common ground: one Hugging Face folder, read by aiayn and converted by
CTranslate2's own converter, so that every engine decodes the same weights.

* :func:`gpt2_folder` -- a ``GPT2LMHeadModel`` of a given shape, seeded random weights, with a
  tokenizer whose tokens are ``t0`` ... (and ``<|endoftext|>`` last, as GPT-2's);
* :func:`marian_folder` -- a ``MarianMTModel`` (Marian's conventions: ``</s>`` 0, ``<unk>`` 1,
  ``<pad>`` last and the decoder's start), with SentencePiece models and ``vocab.json``;
* :func:`ct2_folder` -- the folder converted by ``ctranslate2.converters.TransformersConverter``
  (fp32 weights; CTranslate2 quantizes to int8 when a model is loaded with
  ``compute_type="int8"``);
* :func:`ct2_impls` -- CTranslate2's engine names for a run: on the run's threads, and on one
  (``-1t``), since it can be faster on one; :func:`ct2_best` takes the faster for each
  precision, the peer every ratio is stated against.

Folders are cached under the given root by shape, so every process of an interleaved run
reads the same files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rounds import cell, spread

GPT2_SMALL = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
# Marian-small (opus-mt's shape) with an 8,000-token vocabulary, as tools/ab_generation.py
MARIAN_SMALL = {
    "d_model": 512,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "vocab_size": 8000,
    "max_position_embeddings": 512,
}


def _key(shape: dict[str, int]) -> str:
    return "-".join(f"{k}{v}" for k, v in sorted(shape.items()))


def _token_list(vocab: int) -> list[str]:
    return [f"t{i}" for i in range(vocab)]


def gpt2_folder(root: Path, shape: dict[str, int] = GPT2_SMALL, seed: int = 0) -> Path:
    """A GPT-2 folder of ``shape`` with seeded random weights (written once)."""
    import transformers
    from tokenizers import Tokenizer, models

    folder = root / f"gpt2-{_key(shape)}-s{seed}"
    if (folder / "tokenizer.json").is_file():
        return folder
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        **shape, bos_token_id=shape["vocab_size"] - 1, eos_token_id=shape["vocab_size"] - 1
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(folder)
    tokens = [*_token_list(shape["vocab_size"] - 1), "<|endoftext|>"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="t0"))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "t0",
            }
        )
    )
    return folder


def _spm_model(path: Path, pieces: list[str]) -> None:
    """A small SentencePiece model (Marian's tokenizer needs one per side; the benchmark feeds
    token ids, so its pieces do not matter)."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(pieces)] * 50),
        model_writer=buf,
        vocab_size=64,
        model_type="word",
        hard_vocab_limit=False,
    )
    path.write_bytes(buf.getvalue())


def marian_folder(root: Path, shape: dict[str, int] = MARIAN_SMALL, seed: int = 0) -> Path:
    """A Marian folder of ``shape`` with seeded random weights (written once)."""
    import transformers

    folder = root / f"marian-{_key(shape)}-s{seed}"
    if (folder / "vocab.json").is_file():
        return folder
    v = shape["vocab_size"]
    torch.manual_seed(seed)
    cfg = transformers.MarianConfig(
        **shape,
        pad_token_id=v - 1,
        decoder_start_token_id=v - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
    )
    model = transformers.MarianMTModel(cfg).eval()
    model.save_pretrained(folder)
    tokens = ["</s>", "<unk>", *(f"▁t{i}" for i in range(2, v - 1)), "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    for side in ("source", "target"):
        _spm_model(folder / f"{side}.spm", tokens[2:60])
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "MarianTokenizer",
                "source_lang": "de",
                "target_lang": "en",
                "model_max_length": 512,
            }
        )
    )
    return folder


def ct2_folder(hf: Path) -> Path:
    """``hf`` converted by CTranslate2's converter (fp32 weights), written once."""
    import ctranslate2

    out = hf.with_name(hf.name + "-ct2")
    if not (out / "model.bin").is_file():
        ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out), force=True)
    return out


def ct2_tokens(ct2: Path) -> list[str]:
    """The CTranslate2 model's vocabulary, in id order."""
    for name in ("vocabulary.json", "shared_vocabulary.json"):
        if (ct2 / name).is_file():
            tokens: list[str] = json.loads((ct2 / name).read_text())
            return tokens
    for name in ("vocabulary.txt", "shared_vocabulary.txt"):
        if (ct2 / name).is_file():
            return (ct2 / name).read_text().splitlines()
    raise FileNotFoundError(f"no vocabulary in {ct2}")


def ct2_engine(kind: str, ct2: Path, impl: str, threads: int) -> Any:
    """A CTranslate2 ``Generator`` or ``Translator`` on the CPU for the engine name ``impl``:
    ``ct2-float32`` or ``ct2-int8`` on ``threads`` intra-op threads, the same with ``-1t`` on
    one (see :func:`ct2_impls`)."""
    import ctranslate2

    compute_type = impl.removeprefix("ct2-").removesuffix("-1t")
    threads = 1 if impl.endswith("-1t") else threads
    cls = ctranslate2.Generator if kind == "generator" else ctranslate2.Translator
    return cls(
        str(ct2), device="cpu", compute_type=compute_type, intra_threads=threads, inter_threads=1
    )


def ct2_impls(threads: int) -> list[str]:
    """CTranslate2's engine names for a run on ``threads`` threads.  Beside the same thread
    count as the others, one thread: on a 2-core Intel Xeon, CTranslate2 4.8 decoded at batch 1
    and 8 faster on one thread than on two (int8 GPT-2-small shape: 137 against 76 tok/s), so
    the peer is also measured where it is at its best."""
    impls = ["ct2-float32", "ct2-int8"]
    return impls + [f"{i}-1t" for i in impls] if threads > 1 else impls


def engine_threads(impl: str) -> dict[str, int]:
    """The case settings an engine name implies: a ``-1t`` engine's whole process runs on one
    thread (``OMP_NUM_THREADS=1`` and the rest, benchmarks/rounds.py), as it would for a user
    who runs CTranslate2 that way."""
    return {"threads": 1} if impl.endswith("-1t") else {}


def ct2_best(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For fp32 and int8: CTranslate2 at its faster thread count in ``rows`` (engine name ->
    a spread with ``median``), and aiayn's ratio to it (aiayn fp32 / CT2 fp32, aiayn int8 /
    CT2 int8)."""
    best: dict[str, Any] = {}
    for kind, ours in (("float32", "aiayn"), ("int8", "aiayn-int8")):
        runs = {i: r for i, r in rows.items() if i.removesuffix("-1t") == f"ct2-{kind}"}
        if not runs or ours not in rows:
            continue
        impl = max(runs, key=lambda i: runs[i]["median"])
        best[kind] = {
            "engine": impl,
            "median": runs[impl]["median"],
            "aiayn_over": rows[ours]["median"] / runs[impl]["median"],
        }
    return best


def agreement(ids: list[list[int]], reference: list[list[int]]) -> float:
    """The share of positions where ``ids`` equal the reference's."""
    pairs = [(a, b) for x, y in zip(ids, reference, strict=True) for a, b in zip(x, y, strict=True)]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def engine_rows(
    got: dict[str, list[dict[str, Any]]],
    speed: Callable[[dict[str, Any]], float],
    label: str,
    fmt: str = ".0f",
) -> dict[str, Any] | None:
    """One case of an engines table, from :func:`rounds.interleaved`'s runs per engine: each
    engine's ``speed`` over the rounds, aiayn's ratio to it (fp32 and int8), the agreement of
    its ids with aiayn fp32's, printed as rows under ``label``; and CTranslate2 at its faster
    thread count (:func:`ct2_best`).  None when aiayn gave no run."""
    rows: dict[str, Any] = {i: spread([speed(r) for r in runs]) for i, runs in got.items() if runs}
    if "aiayn" not in rows:
        return None
    reference = got["aiayn"][0]["ids"]
    for impl, sp in rows.items():
        sp["aiayn_over"] = rows["aiayn"]["median"] / sp["median"]
        if "aiayn-int8" in rows:
            sp["aiayn_int8_over"] = rows["aiayn-int8"]["median"] / sp["median"]
        sp["agreement"] = min(agreement(r["ids"], reference) for r in got[impl])
        print(
            f"{label}{impl:<15}{cell(sp, fmt):>22}"
            f"{sp.get('aiayn_int8_over', math.nan):>15.2f}x{sp['aiayn_over']:>10.2f}x"
            f"{sp['agreement']:>10.1%}"
        )
    best = ct2_best(rows)
    if best:
        rows["ct2_best"] = best
    for kind, b in best.items():
        ours = "aiayn" if kind == "float32" else "aiayn int8"
        print(
            f"{label}CTranslate2 {kind} at its faster thread count ({b['engine']}):"
            f" {ours} / it = {b['aiayn_over']:.2f}x"
        )
    return rows
