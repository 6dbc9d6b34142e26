"""The commands beside ``aiayn demo``, end to end on tiny models trained here.

``presets``; ``evaluate`` on a language model, its numbers checked against the cross entropy
computed here from the model's logits; ``generate`` with seeded sampling, ``--stop``, and
byte-level tokens streamed as whole UTF-8 characters; ``translate`` from stdin to stdout; and
the errors of a damaged or empty checkpoint: each names what is wrong, exits 2, no traceback.
"""

from __future__ import annotations

import io
import math
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.cli.decoding import _report_timing
from aiayn.config import presets
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig
from aiayn.generate.translate import translate
from aiayn.models import DecoderLM, EncoderDecoder
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm
from aiayn.training.translate import train_translation
from tests.conftest import LM_TOML, TRANSLATION_TOML, write_corpus

CORPUS = "To be, or not to be, that is the question.\n" * 40
# Held-out text for `evaluate --text` in the same characters: 300 of them, so that the
# validation split (the last 10 %) is 30 tokens and a window of --block 28 (+1 target) fits
# only at offset 0 -- every window `evaluate` draws is the same, known one.
EVAL_TEXT = ("not to be, that is the question. To be, or " * 10)[:300]
EVAL_BLOCK = 28
# Multi-byte characters; with 260 tokens (4 special + 256 bytes) BPE has no merges, so each
# of these characters is split across 2 or 3 byte tokens.
BYTE_CORPUS = "naïve café 日本語\n" * 60


def _train_lm(root: Path, corpus: str, overrides: Mapping[str, object]) -> Path:
    """Train a tiny language model on ``corpus`` in one thread (the suite shares the cores);
    the resolved checkpoint folder."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.txt").write_text(corpus, encoding="utf-8")
    (root / "run.toml").write_text(LM_TOML)
    run = load_run_config(root / "run.toml", {"train.threads": 1, **overrides})
    threads = torch.get_num_threads()
    try:
        result = train_lm(run, root / "run", root, progress=False)
    finally:
        torch.set_num_threads(threads)  # training sets it for the process
    return Path(result.checkpoint).resolve()


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A character-level model, trained enough to continue a prompt with the corpus' words."""
    root = tmp_path_factory.mktemp("char_lm")
    overrides = {
        "train.max_steps": 100,
        "train.lr": 1e-2,
        "train.block_size": 32,
        "model.dropout": 0.0,
    }
    return _train_lm(root, CORPUS, overrides)


@pytest.fixture(scope="module")
def byte_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE model (no merges) that has learnt to continue "naïve" with " café 日"."""
    root = tmp_path_factory.mktemp("byte_lm")
    overrides = {
        "data.tokenizer": "bpe",
        "data.bpe_vocab_size": 260,
        "train.max_steps": 100,
        "train.lr": 1e-2,
        "model.dropout": 0.0,
        "train.eval_interval": 100,
        "train.checkpoint_interval": 100,
    }
    return _train_lm(root, BYTE_CORPUS, overrides)


@pytest.fixture(scope="module")
def sharded_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint written as shards (torch.distributed.checkpoint), by one process."""
    root = tmp_path_factory.mktemp("sharded_lm")
    overrides = {
        "train.checkpoint_format": "sharded",
        "train.max_steps": 2,
        "train.eval_interval": 2,
        "train.checkpoint_interval": 2,
    }
    return _train_lm(root, CORPUS, overrides)


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("translator")
    write_corpus(root / "data")
    (root / "run.toml").write_text(TRANSLATION_TOML)
    result = train_translation(
        load_run_config(root / "run.toml"), root / "run", root / "data", progress=False
    )
    return Path(result.checkpoint).resolve()


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``aiayn ARGS`` run in this process."""
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# ----- presets ----------------------------------------------------------------------------


def test_presets_lists_every_preset_with_its_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["presets"], capsys)
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert list(rows) == list(presets())
    sizes = {name: int(row[2].replace(",", "")) for name, row in rows.items()}
    # The published counts: GPT-2 small (tied embeddings) and Llama 3 70B.
    assert sizes["gpt2-small"] == 124_439_808
    assert sizes["llama3-70b"] == 70_553_706_496
    assert rows["paper-base"][1] == "encoder-decoder" and rows["gpt2-small"][1] == "decoder"
    assert all(row[3] == "parameters" for row in rows.values())


# ----- evaluate on a language model -------------------------------------------------------


def printed_numbers(out: str) -> dict[str, float]:
    """``validation loss    2.5709 nats/token`` and the like -> {"validation loss": 2.5709}."""
    return {
        label: float(value) for label, value in re.findall(r"^([a-z ]+?) +([0-9.]+)", out, re.M)
    }


def test_evaluate_a_language_model_reports_its_cross_entropy(
    char_lm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Loss, perplexity and bits per character equal the mean cross entropy computed here, by
    running the model on the one validation window of the text."""
    text = tmp_path / "held_out.txt"
    text.write_text(EVAL_TEXT)
    args = [
        "evaluate",
        "--checkpoint",
        str(char_lm),
        "--text",
        str(text),
        "--device",
        "cpu",
        "--block",
        str(EVAL_BLOCK),
        "--batches",
        "2",
        "--batch-size",
        "3",
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    got = printed_numbers(out)
    assert set(got) == {"validation loss", "perplexity", "bits per character"}, out

    bundle = load(char_lm)
    model, tokenizer = bundle.model, bundle.tokenizer
    assert isinstance(model, DecoderLM) and isinstance(tokenizer, CharTokenizer)
    ids = torch.tensor(tokenizer.encode(EVAL_TEXT))  # (300,): one token per character
    val = ids[int(len(ids) * 0.9) :]  # (30,): the split `evaluate` reads (train_fraction 0.9)
    assert len(val) == EVAL_BLOCK + 2
    x, y = val[:EVAL_BLOCK], val[1 : EVAL_BLOCK + 1]  # (T,), (T,)
    with torch.no_grad():
        logits = model.eval()(x[None]).double()[0]  # (T, V)
    nats = float(-logits.log_softmax(-1)[torch.arange(EVAL_BLOCK), y].mean())
    # measured 1.06 nats; the 0.5 floor has ~2x room
    assert 0.5 < nats < math.log(tokenizer.vocab_size)  # a trained model, not a uniform one
    # loss and bits are printed to 4 decimals (<= 5e-5 off): 2e-4 is 4x that
    assert got["validation loss"] == pytest.approx(nats, abs=2e-4)
    # printed to 3 decimals: <= 5e-4 off a perplexity >= e^0.5 ~ 1.65, i.e. <= 3e-4 relative
    assert got["perplexity"] == pytest.approx(math.exp(nats), rel=1e-3)
    assert got["bits per character"] == pytest.approx(nats / math.log(2), abs=2e-4)


# ----- generate ---------------------------------------------------------------------------


def gen_args(checkpoint: Path, prompt: str, tokens: int, *extra: str) -> list[str]:
    return [
        "generate",
        "--checkpoint",
        str(checkpoint),
        "--prompt",
        prompt,
        "--device",
        "cpu",
        "--max-new-tokens",
        str(tokens),
        *extra,
    ]


def test_verbose_logs_the_cpu_kernels_once_and_off_takes_none(
    char_lm: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiayn.nn.cpu_kernels as cpu_kernels

    cpu_kernels.log_once.cache_clear()
    args = ["-v", *gen_args(char_lm, "To be", 8)]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if "linear layers:" in line]
    assert len(lines) == 1 and lines[0].startswith("aiayn: one-row decoding of ")
    assert "gemv" in lines[0] and "F.linear" in lines[0]  # what it chose, and both timings
    assert [line for line in run_cli(args, capsys)[2].splitlines() if "decoding" in line] == []
    cpu_kernels.log_once.cache_clear()
    monkeypatch.setenv("AIAYN_CPU_KERNELS", "off")
    code, _, err = run_cli(args, capsys)
    assert code == 0 and "decoding" not in err, err


def test_timing_leaves_a_capture_out_of_the_time_a_token(
    char_lm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--timing``: a capture made during the run (the first step after the first token, its
    step included) is reported on its own, not spread over the tokens as if each were slow."""
    _report_timing(0.0, [0.1, 2.1, 2.2, 2.3], [2.0])  # 2 s of capture, then two 0.1 s steps
    line = capsys.readouterr().err.strip()
    threads = torch.get_num_threads()
    assert line == (
        f"first token 100 ms; then 100.00 ms a token; {threads} threads; step captured in 2.0 s"
    )
    _report_timing(0.0, [0.1, 2.1], [2.0])  # no step but the captured one: no time a token
    expected = f"first token 100 ms; {threads} threads; step captured in 2.0 s"
    assert capsys.readouterr().err.strip() == expected
    code, _, err = run_cli([*gen_args(char_lm, "To be", 8), "--timing", "--compile", "off"], capsys)
    assert code == 0, err
    assert re.fullmatch(r"first token \d+ ms; then [\d.]+ ms a token; \d+ threads", err.strip())


def test_sampling_is_seeded_and_is_what_the_library_samples(
    char_lm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt, n = "To be", 26  # within max_len=32
    args = gen_args(char_lm, prompt, n, "--temperature", "0.8", "--top-k", "10", "--seed", "3")
    code, first, err = run_cli(args, capsys)
    assert code == 0, err
    assert run_cli(args, capsys)[1] == first  # the same seed, the same text
    bundle = load(char_lm)
    assert isinstance(bundle.model, DecoderLM)
    ids = generate(
        bundle.model,
        [bundle.tokenizer.encode(prompt)],
        max_new_tokens=n,
        sampling=SamplingConfig(temperature=0.8, top_k=10),
        seed=3,
    )[0]
    assert first == prompt + bundle.tokenizer.decode(ids) + "\n"
    assert run_cli([*args[:-1], "4"], capsys)[1] != first  # another seed, another text
    # top-k 1 is greedy decoding, whatever the seed and temperature
    greedy = run_cli(gen_args(char_lm, prompt, n, "--temperature", "0"), capsys)[1]
    assert run_cli([*args[:-4], "--top-k", "1", "--seed", "5"], capsys)[1] == greedy


def test_generation_stops_once_a_stop_text_appears(
    char_lm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The output ends with the token that completes the earliest stop text (one character
    per token here), never later."""
    prompt, n = "To be", 26  # within max_len=32
    greedy = gen_args(char_lm, prompt, n, "--temperature", "0")
    full = run_cli(greedy, capsys)[1][len(prompt) : -1]  # the continuation alone
    assert len(full) == n
    stop = full[20:23]  # a 3-character text the model writes
    end = full.index(stop) + len(stop)
    code, out, err = run_cli([*greedy, "--stop", stop], capsys)
    assert code == 0, err
    assert out == prompt + full[:end] + "\n"
    # Repeated --stop: the first to appear ends it; one that never appears changes nothing.
    early = full[4:6]
    out = run_cli([*greedy, "--stop", stop, "--stop", early, "--stop", "zzz"], capsys)[1]
    assert out == prompt + full[: min(end, full.index(early) + 2)] + "\n"
    assert run_cli([*greedy, "--stop", "zzz"], capsys)[1] == prompt + full + "\n"


class Recorder(io.StringIO):
    """A stdout that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def test_multibyte_characters_stream_whole(byte_lm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte tokens that end inside a UTF-8 character are written once the character is
    complete: every piece written is whole text, and together they are the decoded tokens."""
    bundle = load(byte_lm)
    model, tokenizer = bundle.model, bundle.tokenizer
    assert isinstance(model, DecoderLM) and isinstance(tokenizer, BPETokenizer)
    assert tokenizer.vocab_size == 260  # bytes only: no merges
    prompt = "naïve"
    ids = generate(
        model,
        [tokenizer.encode(prompt)],
        max_new_tokens=10,
        sampling=SamplingConfig(temperature=0.0),
    )[0]
    text = tokenizer.decode(ids)
    # The premise: whole characters, some of them several bytes long.
    assert "\ufffd" not in text and len(text.encode()) > len(text), text
    stdout = Recorder()
    monkeypatch.setattr(sys, "stdout", stdout)  # in the test: pytest resets it between phases
    assert main(gen_args(byte_lm, prompt, 10, "--temperature", "0")) == 0
    assert "".join(stdout.writes) == prompt + text + "\n"
    pieces = [w for w in stdout.writes if w]
    assert not [w for w in pieces if "\ufffd" in w], f"split characters written: {pieces}"
    assert len(pieces) > 3  # streamed, not written at the end
    # Generation that ends inside a character writes what it has (as decoding does).
    cut = ids[:8]
    assert tokenizer.decode(cut).endswith("\ufffd")  # the premise: 8 tokens end mid-character
    stdout.writes.clear()
    assert main(gen_args(byte_lm, prompt, 8, "--temperature", "0")) == 0
    assert "".join(stdout.writes) == prompt + tokenizer.decode(cut) + "\n"


# ----- translate --------------------------------------------------------------------------


def test_translate_reads_stdin_and_writes_stdout(
    translator: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = ["ein hund läuft", "zwei männer", "der ball ist rot"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    args = [
        "translate",
        "--checkpoint",
        str(translator),
        "--device",
        "cpu",
        "--beam",
        "2",
        "--max-extra",
        "8",
    ]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    bundle = load(translator)
    model, tokenizer = bundle.model, bundle.tokenizer
    assert isinstance(model, EncoderDecoder) and isinstance(tokenizer, BPETokenizer)
    expected = translate(model.eval(), tokenizer, lines, beam=BeamConfig(beam_size=2, max_extra=8))
    assert out == "".join(f"{t}\n" for t in expected)  # one line out per line in, in order
    assert err == ""  # nothing but the translations on stdout, nothing on stderr
    # Files instead of the standard streams: the same text.
    (tmp_path / "in.txt").write_text("".join(f"{line}\n" for line in lines))
    files = ["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]
    assert run_cli([*args, *files], capsys)[:2] == (0, "")
    assert (tmp_path / "out.txt").read_text() == out


# ----- damaged and empty checkpoints ------------------------------------------------------


def damaged(checkpoint: Path, into: Path, remove: list[str], manifest: bool) -> Path:
    """A copy of ``checkpoint`` without the files ``remove`` (and without its manifest, as an
    older aiayn wrote, so that the loader's own checks speak rather than the checksums)."""
    shutil.copytree(checkpoint, into)
    for name in remove + ([] if manifest else ["manifest.json"]):
        (into / name).unlink()
    return into


def assert_clean_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, f"exit code {code}: {err}"
    assert err.startswith("aiayn: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in the message: {err}"


@pytest.mark.parametrize("manifest", [True, False])
def test_a_missing_shard_is_named(
    sharded_lm: Path, tmp_path: Path, manifest: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = "dcp/__0_0.distcp"
    assert (sharded_lm / shard).is_file() and not (sharded_lm / "model.safetensors").exists()
    folder = damaged(sharded_lm, tmp_path / "ckpt", [shard], manifest)
    code, _, err = run_cli(gen_args(folder, "To", 3), capsys)
    assert_clean_error(code, err, str(folder / shard))


@pytest.mark.parametrize("manifest", [True, False])
def test_a_corrupt_run_config_is_named(
    char_lm: Path, tmp_path: Path, manifest: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = damaged(char_lm, tmp_path / "ckpt", [], manifest)
    (folder / "run.json").write_text('{"model": {"n_layers": ')  # cut short
    code, _, err = run_cli(["evaluate", "--checkpoint", str(folder)], capsys)
    assert_clean_error(code, err, str(folder / "run.json"))
    if not manifest:
        assert "corrupt run config" in err
        (folder / "run.json").write_text("[1, 2]")  # JSON, but not a table of settings
        code, _, err = run_cli(["evaluate", "--checkpoint", str(folder)], capsys)
        assert_clean_error(code, err, str(folder / "run.json"), "expected a JSON object")


@pytest.mark.parametrize("manifest", [True, False])
def test_a_missing_tokenizer_is_named(
    char_lm: Path, tmp_path: Path, manifest: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = damaged(char_lm, tmp_path / "ckpt", ["tokenizer.json"], manifest)
    code, _, err = run_cli(gen_args(folder, "To", 3), capsys)
    assert_clean_error(code, err, "tokenizer.json", str(folder))


def test_an_empty_run_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty folder, and a run killed before its first checkpoint (a log, no checkpoint)."""
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["evaluate", "--checkpoint", str(tmp_path / "empty")], capsys)
    assert_clean_error(code, err, str(tmp_path / "empty"), "config.json is missing")
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text("step,loss,lr,val_loss,tokens_per_s,grad_norm\n")
    code, _, err = run_cli(gen_args(run / "checkpoint", "To", 3), capsys)
    assert_clean_error(code, err, f"no checkpoint at {run / 'checkpoint'}")
    monkeypatch.setattr(sys, "stdin", io.StringIO("ein hund\n"))
    code, _, err = run_cli(["translate", "--checkpoint", str(run / "checkpoint")], capsys)
    assert_clean_error(code, err, f"no checkpoint at {run / 'checkpoint'}")
