"""Fine-tune what you load: ``[model] init_from`` starts a language-model run from a Hugging
Face folder (or an aiayn checkpoint), trains it further, resumes like any run, and converts
back to a folder that transformers loads with equal logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import aiayn
from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.training.config import load_run_config
from aiayn.training.lm import initial_model, train_lm

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind.\n" * 30
TOML = """
[model]
init_from = "{folder}"
dropout = 0.0

[data]
text = "corpus.txt"

[train]
max_steps = {steps}
batch_size = 4
block_size = 24
lr = 3e-3
warmup_steps = 2
eval_interval = 4
eval_batches = 2
checkpoint_interval = 3
device = "cpu"
linear_kernel = "mkl"
"""


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 folder as transformers writes it, with a byte-level BPE tokenizer.json."""
    folder = tmp_path_factory.mktemp("gpt2")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        n_positions=32,
        vocab_size=tok.get_vocab_size(),
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def write_run(root: Path, folder: Path, steps: int) -> Path:
    (root / "corpus.txt").write_text(TEXT)
    cfg = root / f"run_{steps}.toml"
    cfg.write_text(TOML.format(folder=folder, steps=steps))
    return cfg


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoint" / "model.safetensors")


def test_the_run_starts_from_the_folders_weights_and_tokenizer(gpt2: Path, tmp_path: Path) -> None:
    run = load_run_config(write_run(tmp_path, gpt2, steps=1))
    model, tokenizer = initial_model(run, block_size=24)
    start = load(gpt2)
    got = model.state_dict()
    for name, value in start.model.state_dict().items():
        assert torch.equal(got[name], value), name
    assert tokenizer.encode(TEXT[:40]) == start.tokenizer.encode(TEXT[:40])
    assert model.config.n_layers == 2 and model.config.dropout == 0.0  # the folder's, the run's


def test_fine_tuning_learns_resumes_and_converts_back(gpt2: Path, tmp_path: Path) -> None:
    cfg = write_run(tmp_path, gpt2, steps=8)
    run = load_run_config(cfg)
    full = train_lm(run, tmp_path / "full", tmp_path, progress=False)
    log = (tmp_path / "full" / "log.csv").read_text().splitlines()
    losses = [float(line.split(",")[1]) for line in log[1:]]
    assert losses[-1] < losses[0]  # it trains
    assert full.step == 8
    # stopped after 5 steps, then resumed: the same weights, bit for bit
    train_lm(run, tmp_path / "split", tmp_path, stop_after=5, progress=False)
    train_lm(run, tmp_path / "split", tmp_path, resume=True, progress=False)
    a, b = weights(tmp_path / "full"), weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # back to Hugging Face's layout: transformers' logits equal aiayn's
    out = tmp_path / "hf"
    ckpt = tmp_path / "full" / "checkpoint"
    assert main(["convert", "--to-hf", "gpt2", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    hf = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ours = load(ckpt).model.eval()
    ids = torch.tensor([load(ckpt).tokenizer.encode(TEXT[:60])])
    with torch.no_grad():
        # fp32, HF sums in other orders: 128-term dots x 2^-24 ~ 8e-6 at worst; CPU: <= 2.4e-7
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
    # and an aiayn checkpoint is a starting point too
    (tmp_path / "again").mkdir()
    again, _ = initial_model(load_run_config(write_run(tmp_path / "again", ckpt, steps=1)), 24)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in a.items())


def test_contradicting_settings_are_named(gpt2: Path, tmp_path: Path) -> None:
    cfg = write_run(tmp_path, gpt2, steps=1)
    text = cfg.read_text()
    cfg.write_text(text.replace("dropout = 0.0", "dropout = 0.0\nn_layers = 4\nd_model = 32"))
    with pytest.raises(ValueError, match=r"n_layers = 4 \(.* has 2\)") as err:
        load_run_config(cfg)
    assert "d_model" not in str(err.value)  # 32 agrees with the folder
    cfg.write_text(text.replace("dropout = 0.0", 'preset = "gpt2-small"'))
    with pytest.raises(ValueError, match="both preset and init_from"):
        load_run_config(cfg)
    cfg.write_text(text.replace(str(gpt2), str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="no such folder"):
        load_run_config(cfg)
    cfg.write_text(text.replace("block_size = 24", "block_size = 64"))
    with pytest.raises(ValueError, match="positions for at most 32"):
        train_lm(load_run_config(cfg), tmp_path / "long", tmp_path, progress=False)


def test_only_language_models_start_from_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import TRANSLATION_TOML, tiny_model, write_corpus

    write_corpus(tmp_path / "data")
    aiayn.save(tiny_model("paper-base", vocab_size=300, max_len=64), tmp_path / "mt-start")
    toml = TRANSLATION_TOML.replace(
        'preset = "paper-base"\n', f'init_from = "{tmp_path / "mt-start"}"\n'
    )
    for key in (
        "n_layers = 1",
        "d_model = 32",
        "attention.n_heads = 4",
        "ffn.d_ff = 64",
        "max_len = 64",
    ):
        toml = toml.replace(key + "\n", "")
    (tmp_path / "mt.toml").write_text(toml)
    code = main(
        [
            "train",
            str(tmp_path / "mt.toml"),
            "--out",
            str(tmp_path / "mt"),
            "--data",
            str(tmp_path / "data"),
        ]
    )
    assert code == 2
    assert "built for language models" in capsys.readouterr().err
