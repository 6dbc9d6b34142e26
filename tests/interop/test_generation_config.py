"""generation_config.json: the ids that end a text are the folder's, read as transformers
reads them, and generation stops at any of several, as transformers' ``generate`` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from aiayn.checkpoint import load
from aiayn.generate import SamplingConfig, generate, stream
from aiayn.interop.generation_config import GenerationIds, generation_of, read_generation

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small GPT-2 folder (perturbed weights) whose config.json names BOS 3 and EOS 7."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=64,
        n_positions=64,
        bos_token_id=3,
        eos_token_id=7,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(folder / "tokenizer.json"))
    return folder


def with_generation(folder: Path, tmp: Path, config: dict[str, object] | None) -> Path:
    out = tmp / "variant"
    out.mkdir()
    for f in folder.iterdir():
        if f.name != "generation_config.json":
            (out / f.name).symlink_to(f)
    if config is not None:
        (out / "generation_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    "config",
    [
        None,
        {"pad_token_id": 5},
        {"bos_token_id": 1, "eos_token_id": [7, 9], "pad_token_id": 0},
        {"eos_token_id": 11},
    ],
)
def test_ids_are_read_as_transformers_reads_them(
    gpt2: Path, tmp_path: Path, config: dict[str, object] | None
) -> None:
    folder = with_generation(gpt2, tmp_path, config)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(folder).generation_config
    eos = theirs.eos_token_id
    want = GenerationIds(
        bos=theirs.bos_token_id,
        pad=theirs.pad_token_id,
        eos=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
    )
    assert read_generation(folder) == want
    assert generation_of(load(folder).run) == want  # carried by the bundle


def test_generation_stops_at_any_eos_as_transformers_does(gpt2: Path, tmp_path: Path) -> None:
    bundle = load(gpt2)
    prompt = [3, 12, 40, 17]
    free = generate(bundle.model, [prompt], max_new_tokens=20, sampling=GREEDY)[0]  # type: ignore[arg-type]
    # two ids the free continuation produces, each for the first time at `first` and later
    new = [i for i, t in enumerate(free) if t not in free[:i]]
    assert len(new) >= 3, free
    first, later = new[1], new[2]
    eos = [free[later], free[first]]  # listed out of order: any of them ends the text
    folder = with_generation(gpt2, tmp_path, {"eos_token_id": eos, "pad_token_id": 0})
    ids = generation_of(load(folder).run).eos
    got = generate(bundle.model, [prompt], max_new_tokens=20, sampling=GREEDY, eos_id=ids)[0]  # type: ignore[arg-type]
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder)
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, 4:]
    assert got == want.tolist() == free[: first + 1]  # stopped at the first, EOS kept
    steps = list(stream(bundle.model, [prompt], max_new_tokens=20, sampling=GREEDY, eos_id=ids))  # type: ignore[arg-type]
    assert len(steps) == first + 1  # the stream itself ends there, not only its reader


def test_a_batch_stops_each_row_at_its_own_eos(gpt2: Path) -> None:
    bundle = load(gpt2)
    prompts = [[3, 12, 40, 17], [3, 5, 6]]
    free = generate(bundle.model, prompts, max_new_tokens=12, sampling=GREEDY)  # type: ignore[arg-type]
    eos = (free[0][2], free[1][6])
    got = generate(bundle.model, prompts, max_new_tokens=12, sampling=GREEDY, eos_id=eos)  # type: ignore[arg-type]
    for row, want in zip(got, free, strict=True):
        first = min(i for i, t in enumerate(want) if t in eos)
        assert row == want[: first + 1]


def test_bad_ids_are_named(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ValueError, match="eos_token_id should be a token id or a list"):
        read_generation(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": [1, 2]}))
    with pytest.raises(ValueError, match="bos_token_id should be one token id"):
        read_generation(tmp_path)
    assert read_generation(tmp_path / "nothing") == GenerationIds()
