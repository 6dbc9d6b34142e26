"""An encoder's masked-LM training, continued from a Hugging Face BERT folder: the loss is
transformers' ``BertForMaskedLM`` loss on the same corrupted batch, the corruption is BERT's
15 % / 80-10-10, training learns and resumes bit for bit, and the result converts back to a
folder transformers loads with equal logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.nn.context import Record
from aiayn.training.config import load_run_config
from aiayn.training.masked_lm import IGNORE, MaskedLMTask, mask_tokens, train_masked_lm
from tests.interop.support import bert_config, perturb, wordpiece

TEXT = "Ein Hund läuft über die Wiese. A dog runs across the meadow. Le chien court.\n" * 40
TOML = """
[model]
init_from = "{folder}"
dropout = 0.1

[data]
text = "corpus.txt"

[train]
max_steps = 8
batch_size = 4
block_size = 24
lr = 1e-3
warmup_steps = 2
eval_interval = 4
eval_batches = 2
checkpoint_interval = 3
device = "cpu"
linear_kernel = "mkl"
"""


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(bert_config()).eval()
    perturb(model, ("LayerNorm", "embeddings"))
    model.save_pretrained(folder)
    wordpiece(folder)
    return folder


def run_config(root: Path, folder: Path) -> Path:
    (root / "corpus.txt").write_text(TEXT)
    (root / "run.toml").write_text(TOML.format(folder=folder))
    return root / "run.toml"


def test_the_loss_is_transformers_masked_lm_loss(bert: Path, tmp_path: Path) -> None:
    run = load_run_config(run_config(tmp_path, bert))
    bundle = load(bert)
    from aiayn.data.lm_data import TokenStream

    stream = TokenStream.from_text(TEXT, bundle.tokenizer, seed=0)
    task = MaskedLMTask(
        stream,
        bundle.tokenizer,
        vocab_size=run.model.vocab_size,  # type: ignore[arg-type]
        batch_size=4,
        block=24,
        eval_batches=2,
        seed=0,
    )
    ((inputs, labels),) = task.next_batches(1, 0, 1)
    ours, n = task.loss(bundle.model.eval(), (inputs, labels), Record())
    hf = transformers.BertForMaskedLM.from_pretrained(bert).eval()
    with torch.no_grad():
        want = hf(input_ids=inputs, labels=labels).loss
    assert n == int((labels != IGNORE).sum()) > 0
    # fp32 on both sides, summed in other orders: a loss of a few nats to ~100 ulps (2^-23)
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)


def test_bert_corruption_rates_and_specials() -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 512), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    inputs, labels = mask_tokens(
        ids, mask=4, vocab_size=1000, special=torch.tensor([0, 2, 3]), generator=g
    )
    chosen = labels != IGNORE
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # specials are never chosen
    assert torch.equal(labels[chosen], ids[chosen])
    rate = chosen.float().mean().item()
    assert 0.14 < rate < 0.16  # 32,768 seeded draws: 15 % +- 5 sd (sd = 0.002)
    masked = (inputs[chosen] == 4).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    # ~4,900 chosen: 80 % [MASK] +- 3.5 sd (0.0057); 10 % (+ 1 in 1,000 by chance) kept, -2/+3.5 sd
    assert 0.78 < masked < 0.82 and 0.09 < kept < 0.115
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_the_task_never_chooses_the_tokenizers_special_tokens(bert: Path) -> None:
    """The training task's corruption, on a stream where a quarter of the tokens are the
    folder's [CLS], [SEP], [PAD], [MASK] and [UNK]: every special id is known to the task,
    none is ever chosen, and the ordinary tokens are chosen at BERT's 15 %."""
    from aiayn.data.lm_data import TokenStream

    bundle = load(bert)
    tok = bundle.tokenizer
    specials = torch.tensor(
        [tok.tok.token_to_id(n) for n in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")]  # type: ignore[union-attr]
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 300, (40_000,), generator=g)
    where = torch.rand(ids.shape, generator=g) < 0.25
    ids[where] = specials[torch.randint(len(specials), (int(where.sum()),), generator=g)]
    task = MaskedLMTask(
        TokenStream(ids.numpy(), seed=0),
        tok,
        batch_size=32,
        block=64,  # type: ignore[arg-type]
        vocab_size=bundle.model.config.vocab_size,
        eval_batches=1,
        seed=0,
    )
    assert set(specials.tolist()) <= set(task.special.tolist())
    inputs, labels = (torch.cat(t) for t in zip(*task.next_batches(8, 0, 1), strict=True))
    chosen = labels != IGNORE  # (8 B, T)
    original = torch.where(chosen, labels, inputs)
    special = torch.isin(original, specials)
    assert special.any() and not (chosen & special).any()
    # ~12,000 ordinary tokens: 15 % chosen, within 5 standard deviations (0.0033 each)
    rate = chosen[~special].float().mean().item()
    assert abs(rate - 0.15) < 5 * (0.15 * 0.85 / int((~special).sum())) ** 0.5


def test_fine_tuning_learns_resumes_and_converts_back(bert: Path, tmp_path: Path) -> None:
    cfg = run_config(tmp_path, bert)
    run = load_run_config(cfg)
    full = train_masked_lm(run, tmp_path / "full", tmp_path, progress=False)
    assert full.step == 8
    log = (tmp_path / "full" / "log.csv").read_text().splitlines()[1:]
    val = [float(line.split(",")[3]) for line in log if line.split(",")[3]]
    assert len(val) == 2 and val[1] < val[0]  # the same masked validation windows, lower loss
    train_masked_lm(run, tmp_path / "split", tmp_path, stop_after=5, progress=False)
    train_masked_lm(run, tmp_path / "split", tmp_path, resume=True, progress=False)
    a = load_file(tmp_path / "full" / "checkpoint" / "model.safetensors")
    b = load_file(tmp_path / "split" / "checkpoint" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ckpt, out = tmp_path / "full" / "checkpoint", tmp_path / "hf"
    assert main(["convert", "--to-hf", "bert", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    hf = transformers.BertForMaskedLM.from_pretrained(out).eval()
    ours = load(ckpt)
    ids = torch.tensor([ours.tokenizer.encode("a dog runs across the meadow")])
    with torch.no_grad():
        torch.testing.assert_close(
            ours.model.eval()(ids), hf(input_ids=ids).logits, atol=1e-5, rtol=1e-5
        )


def test_the_command_trains_an_encoder_and_needs_a_checkpoint(
    bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = run_config(tmp_path, bert)
    cfg.write_text(cfg.read_text().replace("max_steps = 8", "max_steps = 2"))
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--data", str(tmp_path)]) == 0
    scratch = tmp_path / "scratch.toml"
    scratch.write_text(
        TOML.replace('init_from = "{folder}"', 'preset = "bert-base"\nn_layers = 1').replace(
            "dropout = 0.1", "dropout = 0.1\nd_model = 32\nattention.n_heads = 4\nffn.d_ff = 64"
        )
    )
    code = main(["train", str(scratch), "--out", str(tmp_path / "s"), "--data", str(tmp_path)])
    assert code == 2 and "starts from a checkpoint" in capsys.readouterr().err
