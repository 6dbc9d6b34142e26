"""Hugging Face checkpoint folders: loaded without instantiating the HF model, logit for logit
equal to HF's own, sharded or not, bf16 kept; written back so that HF's from_pretrained reads
them; a mismatched folder is named, never half-loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers

from aiayn.interop.hf_folder import load_hf_folder, save_hf_folder
from tests.interop.support import assert_same_state

VOCAB = 101
# fp32, HF sums in other orders: GPT-2's 256-term dots, ~sqrt(256) x 2^-24 ~ 1e-6; CPU: <= 2.4e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}
SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)


def hf_model(kind: str, **overrides: object) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "GPT2":
        kwargs: dict = {
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": VOCAB,
            "n_positions": 32,
            **overrides,
        }
        config = transformers.GPT2Config(**kwargs)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = getattr(transformers, f"{kind}Config")(**{**SMALL, **overrides})
        model = getattr(transformers, f"{kind}ForCausalLM")(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def logits(model: torch.nn.Module, ids: torch.Tensor, hf: bool) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits if hf else model(ids)


@pytest.mark.parametrize(
    ("kind", "overrides", "shard"),
    [
        ("GPT2", {}, None),
        ("Llama", {"tie_word_embeddings": True}, None),
        ("Mistral", {"attention.sliding_window": 6}, "40KB"),
        ("Qwen2", {}, "40KB"),
        ("Mixtral", {"num_local_experts": 3, "num_experts_per_tok": 2}, "40KB"),
    ],
)
def test_load_equals_hf_and_writes_back(
    tmp_path: Path, kind: str, overrides: dict, shard: str | None
) -> None:
    hf = hf_model(kind, **overrides)
    kw = {"max_shard_size": shard} if shard else {}
    hf.save_pretrained(tmp_path / "hf", **kw)
    if shard:
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    ours = load_hf_folder(tmp_path / "hf")
    ids = torch.randint(0, VOCAB, (2, 20))
    expected = logits(hf, ids, True)
    torch.testing.assert_close(logits(ours, ids, False), expected, **TOL)
    family = {"GPT2": "gpt2"}.get(kind, kind.lower())
    save_hf_folder(ours, tmp_path / "out", family, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # written in shards
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(logits(back, ids, True), expected, **TOL)
    again = load_hf_folder(tmp_path / "out")  # aiayn -> HF -> aiayn is identical
    assert_same_state(again.state_dict(), ours.state_dict(), "aiayn -> HF folder -> aiayn")


def test_bf16_stays_bf16(tmp_path: Path) -> None:
    hf = hf_model("Llama").to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf_folder(tmp_path / "hf")
    assert all(p.dtype == torch.bfloat16 for p in ours.parameters())
    ids = torch.randint(0, VOCAB, (1, 12))
    # bf16 keeps 8 significant bits: 2^-8 ~ 4e-3 per rounding, ~5 of them; CPU: 3.9e-3
    torch.testing.assert_close(
        logits(ours, ids, False).float(), logits(hf, ids, True).float(), atol=2e-2, rtol=2e-2
    )


def test_mismatched_folders_are_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    hf = hf_model("Llama")
    hf.save_pretrained(tmp_path / "hf")
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    extra = dict(weights, **{"model.layers.9.extra.weight": torch.zeros(2)})
    save_file(extra, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"tensors not expected \['model.layers.9.extra.weight'\]"):
        load_hf_folder(tmp_path / "hf")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(
        ValueError, match="tensors missing \\['model.layers.1.mlp.up_proj.weight'\\]"
    ):
        load_hf_folder(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "intermediate_size": 80}))
    weights["model.layers.1.mlp.up_proj.weight"] = torch.zeros(96, 64)
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(ValueError, match="does not fit"):
        load_hf_folder(tmp_path / "hf")
    with pytest.raises(ValueError, match="no config.json"):
        load_hf_folder(tmp_path)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../outside.safetensors", "is not a file inside"),
        ("ABSOLUTE", "is not a file inside"),
        ("link.safetensors", r"leads out of .* \(a symbolic link\)"),
    ],
)
def test_an_index_naming_a_shard_outside_the_folder_is_refused(
    tmp_path: Path, name: str, why: str
) -> None:
    """``weight_map`` names, unchecked, would read a real shard copied outside the folder."""
    folder = tmp_path / "hf"
    hf_model("Llama").save_pretrained(folder, max_shard_size="40KB")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = next(iter(index["weight_map"].values()))
    outside = tmp_path / "outside.safetensors"
    (folder / shard).rename(outside)
    (folder / "link.safetensors").symlink_to(outside)
    name = str(outside) if name == "ABSOLUTE" else name
    index["weight_map"] = {k: name if v == shard else v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(
        ValueError, match=f"index.json \\(weight_map\\): {re.escape(repr(name))} {why}"
    ):
        load_hf_folder(folder)


def test_convert_a_folder_with_its_tokenizer_and_generate_as_hf_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aiayn convert --from-hf` on a GPT-2 folder with its byte-level BPE tokenizer.json:
    the tokenizer gives HF's ids, and `aiayn generate` greedily continues a prompt with the
    tokens HF's `generate` picks; `--to-hf` writes a folder HF reads back."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tokenizers import decoders as tok_decoders

    from aiayn.cli import main

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tok_decoders.ByteLevel()
    text = ["the cat sat on the mat and the dog sat on the log"] * 50
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    hf = hf_model("GPT2", vocab_size=tok.get_vocab_size())
    hf.save_pretrained(tmp_path / "hf")
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "hf" / "tokenizer.json")
    )
    convert = ["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]
    assert main(convert) == 0
    # Again into the now non-empty folder: refused (it would be replaced), unless asked.
    assert main(convert) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([*convert, "--overwrite"]) == 0
    from aiayn.checkpoint import load

    bundle = load(tmp_path / "ours")
    prompt = "the cat sat"
    assert bundle.tokenizer.encode(prompt) == fast(prompt)["input_ids"]
    ids = torch.tensor([fast(prompt)["input_ids"]])
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)[
            0, ids.shape[1] :
        ]
    capsys.readouterr()
    argv = [
        "generate",
        "--checkpoint",
        str(tmp_path / "ours"),
        "--prompt",
        prompt,
        "--max-new-tokens",
        "8",
        "--top-k",
        "1",
        "--seed",
        "0",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.rstrip("\n") == prompt + fast.decode(expected.tolist())
    assert (
        main(
            [
                "convert",
                "--to-hf",
                "gpt2",
                "--checkpoint",
                str(tmp_path / "ours"),
                "--out",
                str(tmp_path / "back"),
            ]
        )
        == 0
    )
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    torch.testing.assert_close(logits(back, ids, True), logits(hf, ids, True), **TOL)
    assert (tmp_path / "back" / "tokenizer.json").is_file()


def test_a_mixtral_folder_with_fused_experts_loads(tmp_path: Path) -> None:
    """transformers 5 holds Mixtral's experts fused, (E, 2F, C) and (E, C, F) per layer; a
    folder written in that layout loads too, expert e read from slice e of the file."""
    from safetensors.torch import save_file

    hf = hf_model("Mixtral", num_local_experts=3, num_experts_per_tok=2)
    folder = tmp_path / "fused"
    folder.mkdir()
    hf.config.save_pretrained(folder)
    state = {n: t.contiguous() for n, t in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    ids = torch.randint(0, VOCAB, (2, 20))
    ours = load_hf_folder(folder)
    torch.testing.assert_close(logits(ours, ids, False), logits(hf, ids, True), **TOL)


def test_a_sentencepiece_model_alone_gives_sentencepieces_ids(tmp_path: Path) -> None:
    """A Llama folder with only tokenizer.model (and tokenizer_config.json): text -> ids is
    what the ``sentencepiece`` library gives on that .model (its normaliser applied: NFKC,
    extra spaces removed), BOS first, on a multilingual sample; ids -> text too; and it
    survives conversion to an aiayn checkpoint.  (tests/interop/test_tokenizer_reference.py
    has Llama's own identity normaliser and byte fallback.)"""
    import sentencepiece as spm

    from aiayn.checkpoint import convert_from_hf, load
    from aiayn.interop.hf_tokenizer import load_hf_tokenizer

    hf = hf_model("Llama", vocab_size=128)
    hf.save_pretrained(tmp_path / "hf")
    text = [
        "Ein Hund läuft über die Wiese.",
        "A dog runs across the meadow.",
        "Le chien court dans le pré.",
        "Zwei Männer spielen Fußball.",
        "東京は日本の首都です。",
    ]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text * 40),
        model_prefix=str(tmp_path / "hf" / "tokenizer"),
        vocab_size=120,
        model_type="bpe",
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        character_coverage=1.0,
        minloglevel=2,
    )
    (tmp_path / "hf" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True})
    )
    ours = load_hf_tokenizer(tmp_path / "hf")
    theirs = spm.SentencePieceProcessor(model_file=str(tmp_path / "hf" / "tokenizer.model"))
    sample = [*text, "Hund  und Katze ", " le pré, 2 chiens!", "日本の首都", "ＨＵＮＤ１２"]
    unknown = 0  # characters the .model lacks ("K", "z", "2", "!", ...): <unk>, never dropped
    assert sum(unknown in theirs.encode(s) for s in sample) == 3  # Katze, chiens!, ＨＵＮＤ１２
    for s in sample:
        ids = theirs.encode(s, add_bos=True)
        assert ours.encode(s) == ids, (s, theirs.encode(s, out_type=str))
        if unknown not in ids:  # (<unk> is written " ⁇ " by SentencePiece, "<unk>" by HF)
            assert ours.decode(ids[1:]) == theirs.decode(ids[1:]), s
    convert_from_hf(tmp_path / "hf", tmp_path / "ours")
    again = load(tmp_path / "ours").tokenizer
    assert all(again.encode(s) == theirs.encode(s, add_bos=True) for s in sample)


def test_integer_buffers_do_not_set_the_dtype(tmp_path: Path) -> None:
    """Older GPT-2 files carry uint8 causal-mask buffers (h.i.attn.bias): skipped, and the
    weights' dtype is the one most bytes have."""
    from safetensors.torch import save_file

    hf = hf_model("GPT2")
    folder = tmp_path / "old"
    folder.mkdir()
    hf.config.save_pretrained(folder)
    state = {n: t.contiguous() for n, t in hf.state_dict().items() if n != "lm_head.weight"}
    state["transformer.h.0.attn.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.uint8)
    state["transformer.h.1.attn.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.uint8)
    save_file(state, str(folder / "model.safetensors"))
    ours = load_hf_folder(folder)
    assert next(ours.parameters()).dtype == torch.float32
    ids = torch.randint(0, VOCAB, (2, 20))
    torch.testing.assert_close(logits(ours, ids, False), logits(hf, ids, True), **TOL)


def test_a_folder_of_another_family_names_the_supported_ones(tmp_path: Path) -> None:
    """Found by aiayn.load as an HF folder, refused by the family table before transformers
    is asked (aiayn/interop/families.py)."""
    import aiayn
    from aiayn.interop.families import FAMILIES

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    supported = ", ".join(FAMILIES)
    assert supported == "gpt2, llama, mistral, qwen2, mixtral, bert, marian, bart"
    with pytest.raises(
        ValueError, match=f"model_type='t5' cannot be loaded: supported are {supported}"
    ):
        aiayn.load(tmp_path)
