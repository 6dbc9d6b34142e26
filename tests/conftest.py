"""What many test files share: tiny seeded models, and tiny translation and LM runs.

Test modules import them (``from tests.conftest import ...``), never from each other.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

import aiayn

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N: N workers share the cores, each with one intra-op thread (torch's default,
    # one per core in every worker, would have them spin against each other).
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    )

# Captured decoding steps (aiayn/generate/captured.py) compile into inductor's disk cache: the
# tests' own folder, never the user's.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    str(Path(tempfile.gettempdir()) / f"aiayn-tests-inductor-{os.getuid()}"),
)

# Property tests and fuzzing (hypothesis, schemathesis) draw the same examples on every run:
# a test's verdict never depends on luck.  HYPOTHESIS_PROFILE=deep draws 400 a test,
# freshly each run, to look for new failures (docs/security.md).
settings.register_profile("ci", derandomize=True, max_examples=25, deadline=None, database=None)
settings.register_profile("deep", derandomize=False, max_examples=400, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def fake_decoding_probes(
    monkeypatch: pytest.MonkeyPatch, gemv: tuple[float, float], packed: tuple[float, float]
) -> None:
    """The host's answers to aiayn/nn/cpu_decoding.py's probes, so a test chooses the kernels:
    a one-row pass (F.linear, gemv) and a packed product (F.linear, packed), in seconds."""
    import aiayn.nn.cpu_decoding as decoding

    monkeypatch.setattr(decoding, "_decode_seconds", lambda *a: packed)
    monkeypatch.setattr(decoding, "_GEMV_SECONDS", {})
    monkeypatch.setattr(decoding, "_gemv_seconds", lambda layers: gemv)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[object]:
    """Any JSON value: scalars of every type, and lists and objects of them, nested -- what a
    parser of files from elsewhere may be handed."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


# Two layers, 32 wide, 4 heads, no dropout: a model every family can be, small enough to run
# a forward pass in milliseconds, large enough for heads, grouping and caches to matter.
TINY: dict[str, Any] = {
    "n_layers": 2,
    "d_model": 32,
    "attention.n_heads": 4,
    "ffn.d_ff": 64,
    "dropout": 0.0,
}


def tiny_model(preset: str, **overrides: Any) -> Any:
    """A tiny model of ``preset`` (:data:`TINY`, then ``overrides``), built after
    ``torch.manual_seed(0)`` so that every call gives the same weights, in eval mode."""
    torch.manual_seed(0)
    return aiayn.build_model(preset, **{**TINY, **overrides}).eval()


# A parallel corpus in Multi30k's layout: five German-English pairs, repeated.
DE = [
    "ein hund läuft",
    "eine katze schläft",
    "zwei männer",
    "ein kind spielt im park",
    "der ball ist rot",
]
EN = ["a dog runs", "a cat sleeps", "two men", "a child plays in the park", "the ball is red"]


def write_corpus(root: Path) -> None:
    """``root/multi30k/{train,val,test_2016_flickr}.{de,en}.gz`` from :data:`DE` / :data:`EN`."""
    m = root / "multi30k"
    m.mkdir(parents=True)
    for split, n in (("train", 12), ("val", 1), ("test_2016_flickr", 1)):
        for lang, lines in (("de", DE), ("en", EN)):
            with gzip.open(m / f"{split}.{lang}.gz", "wt", encoding="utf-8") as fh:
                fh.write("\n".join(lines * n) + "\n")


# A one-layer paper-recipe translation run: 6 steps of 64-token batches, checkpoints every 3.
TRANSLATION_TOML = """
[model]
preset = "paper-base"
n_layers = 1
d_model = 32
attention.n_heads = 4
ffn.d_ff = 64
max_len = 64
dropout = 0.1

[data]
bpe_vocab_size = 300

[train]
schedule = "paper"
lr = 0.1
warmup_steps = 4
beta2 = 0.98
adam_eps = 1e-9
weight_decay = 0.0
label_smoothing = 0.1
max_tokens = 64
max_steps = 6
eval_interval = 3
checkpoint_interval = 3
keep_snapshots = 2
"""

# A two-layer character-level LM run on ``corpus.txt``: 8 steps, a checkpoint every 4.
LM_TOML = """
[model]
preset = "gpt2-small"
n_layers = 2
d_model = 32
attention.n_heads = 4
ffn.d_ff = 64
max_len = 32
dropout = 0.1

[data]
text = "corpus.txt"

[train]
max_steps = 8
batch_size = 4
block_size = 16
lr = 3e-3
warmup_steps = 2
eval_interval = 4
eval_batches = 2
checkpoint_interval = 4
"""
LM_TEXT = "To be, or not to be, that is the question.\n" * 40


def train_run(toml: str, root: Path, data: Path | None = None) -> Path:
    """Train ``toml`` into ``root/run`` through ``aiayn train`` (in process), on the tiny
    corpus of ``write_corpus`` (a translation run) or on ``corpus.txt`` of :data:`LM_TEXT`
    (``data`` None: an LM run); return the run's checkpoint folder."""
    from aiayn.cli import main

    if data is None:
        data = root
        (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(toml)
    assert (
        main(["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(data)])
        == 0
    )
    return root / "run" / "checkpoint"


@pytest.fixture(scope="session")
def lm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of :data:`LM_TOML` trained once for the whole run: read it, never
    write into its folder (copy it first)."""
    return train_run(LM_TOML, tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="session")
def translation_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of :data:`TRANSLATION_TOML` trained once on :func:`write_corpus`'s
    corpus for the whole run: read it, never write into its folder."""
    root = tmp_path_factory.mktemp("translation")
    write_corpus(root / "data")
    return train_run(TRANSLATION_TOML, root, root / "data")


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The shared data folder with the real Multi30k and Tiny Shakespeare ($AIAYN_DATA, else
    ../shared/data): tests on real corpora read it; it is there in CI."""
    from aiayn.data.files import data_dir

    root = data_dir()
    for need in ("multi30k/train.de.gz", "tinyshakespeare/input.txt"):
        assert (root / need).is_file(), f"{root / need} is missing: set AIAYN_DATA"
    return root


@pytest.fixture(params=[7, 8], ids=["7-bit", "8-bit"])
def int8_bits(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The bits of the int8 kernel's activations for the test, 7 and then 8, so that a CPU
    with VNNI also runs what a CPU without it computes (7 bits run correctly everywhere, only
    less precisely).  8 bits are skipped on a CPU without VNNI or AMX, whose 8-bit products
    saturate.  Read ``int8_kernel.INT8_ACTIVATION_BITS`` through the module, at run time."""
    from aiayn.nn import int8_kernel

    bits = int(request.param)
    if bits == 8 and not int8_kernel.CPU_HAS_VNNI:
        pytest.skip("8-bit int8 activations need VNNI or AMX (without, the products saturate)")
    monkeypatch.setattr(int8_kernel, "INT8_ACTIVATION_BITS", bits)
    monkeypatch.setattr(int8_kernel, "REDUCE_RANGE", bits == 7)
    return bits


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick for port 0), for
    torchrun's --master_port: a fixed port fails when another run or test holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# A chat model's folder, as Hugging Face writes one.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_TEXT = ["hello there, how are you today?", "the cat sat on the mat", "café 東京 🙂 2026"] * 30


def chat_folder(root: Path, eos: list[int] | None, template: str | None = CHATML) -> Path:
    """A small Hugging Face GPT-2 chat folder (perturbed weights, byte-level BPE with ChatML's
    tokens and chat template) in ``root/chat``; ``eos`` is its generation_config.json's list
    of end ids (None: no such file)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CHAT_TEXT, trainer)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=tok.get_vocab_size(),
        n_positions=96,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    folder = root / "chat"
    model.save_pretrained(folder)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {
        "eos_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if eos is not None:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder
