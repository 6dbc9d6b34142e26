"""The recurrent baselines: cached decoding, padding, the attention by hand, the bottleneck
without attention, the FLOP count against torch's counter, and training through the same
trainer, beam search and CLI as the Transformer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import aiayn
from aiayn.cli import main
from aiayn.generate.beam import beam_search, greedy_decode
from aiayn.inspect.calc import translation_batch_flops
from aiayn.models.rnn import RNNEncoderDecoder
from aiayn.training.config import load_run_config
from aiayn.training.translate import train_translation
from tests.conftest import TRANSLATION_TOML, write_corpus

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.2e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}
SMALL = dict(n_layers=2, d_model=32, vocab_size=50, max_len=64, dropout=0.0)
KINDS = [("gru", True), ("gru", False), ("lstm", True), ("lstm", False)]


def small(rnn: str, attention: bool, **kw: object) -> RNNEncoderDecoder:
    torch.manual_seed(0)
    model = aiayn.build_model(
        "paper-base", **{**SMALL, "rnn.cell": rnn, "rnn.attention": attention, **kw}
    )
    assert isinstance(model, RNNEncoderDecoder)
    return model.eval()


@pytest.mark.parametrize(("rnn", "attention"), KINDS)
def test_cached_decoding_equals_full_pass_and_padding_changes_nothing(
    rnn: str, attention: bool
) -> None:
    model = small(rnn, attention)
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 6))
    src[1, 4:] = 0
    full = model(src, tgt)
    memory, keep = model.encode(src)
    cache = model.new_cache(2, 6)
    steps = [model.decode(tgt[:, :2], memory, keep, cache=cache)]
    steps += [model.decode(tgt[:, i : i + 1], None, keep, cache=cache) for i in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    torch.testing.assert_close(model(src[1:, :4], tgt[1:]), full[1:], **TOL)
    greedy = greedy_decode(model, src, bos=1, eos=2)
    beam1 = beam_search(model, src, bos=1, eos=2, config=aiayn.generate.beam.BeamConfig(1, 0.0))
    assert greedy == beam1  # beam 1 without a length penalty is greedy decoding


@torch.no_grad()
def test_additive_attention_equals_bahdanaus_formula_by_hand() -> None:
    model = small("gru", True)
    att = model.attention
    assert att is not None
    torch.manual_seed(1)
    s, memory = torch.randn(1, 2, 32), torch.randn(1, 3, 32)
    keep = torch.tensor([[True, True, False]])
    context, weights, _ = att(s, memory, att.key(memory), keep)
    W, U, b, w = att.query.weight, att.key.weight, att.key.bias, att.w.weight[0]
    for t in range(2):
        e = [float(w @ torch.tanh(W @ s[0, t] + U @ memory[0, j] + b)) for j in range(2)]
        alpha = [math.exp(x) / sum(math.exp(y) for y in e) for x in e]
        # fp32 module vs float64 alphas: 1e-6 is ~17 ulps (2^-24) of O(1) values; seen <= 1.2e-7
        assert weights[0, t].tolist() == pytest.approx([*alpha, 0.0], abs=1e-6)
        expected = alpha[0] * memory[0, 0] + alpha[1] * memory[0, 1]
        torch.testing.assert_close(context[0, t], expected, atol=1e-6, rtol=1e-5)


def test_without_attention_the_source_enters_only_through_the_initial_state() -> None:
    """The bottleneck: with the initial state held fixed, the decoder's output does not depend
    on the source at all; with attention it does."""
    for attention in (False, True):
        model = small("gru", attention)
        tgt = torch.randint(3, 50, (1, 5))
        a, b = torch.randint(3, 50, (1, 6)), torch.randint(3, 50, (1, 6))
        fixed = model.initial_state(*model.encode(a))
        model.initial_state = lambda memory, keep, fixed=fixed: fixed  # type: ignore[method-assign,assignment,misc]
        same = torch.allclose(model(a, tgt), model(b, tgt))
        assert same == (not attention)


def test_the_encoder_reads_both_directions() -> None:
    """One layer: the forward half of the first state has not seen the last token; the
    backward half has.  (From the second layer on, both halves have seen everything.)"""
    model = small("gru", True, n_layers=1)
    src = torch.randint(3, 50, (1, 6))
    changed = src.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 47 + 3
    first = model.encode(src)[0][0, 0]
    first_changed = model.encode(changed)[0][0, 0]
    half = 16
    torch.testing.assert_close(first[:half], first_changed[:half])  # forward: not yet seen
    assert not torch.allclose(first[half:], first_changed[half:])  # backward: has seen it


@pytest.mark.parametrize("attention", [True, False])
def test_flop_count_agrees_with_torch_flop_counter(attention: bool) -> None:
    """torch.utils.flop_counter counts a GRU's matmuls (not an LSTM's: its CPU kernel is one
    opaque op); it skips the gradient of the first step's recurrent matmul (its input, the
    zero state, needs none) -- within 3 %."""
    from torch.utils.flop_counter import FlopCounterMode

    model = small("gru", attention).train()
    src, tgt = torch.randint(3, 50, (4, 9)), torch.randint(3, 50, (4, 7))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten()).backward()
    expected = translation_batch_flops(model.config, 4, 9, 7)
    # measured <= 0.94 % (the skipped gradient above); 3 % is ~3x that
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.03)


@pytest.mark.parametrize(("rnn", "attention"), KINDS)
def test_flop_count_meets_every_recurrent_weight(rnn: str, attention: bool) -> None:
    """Per source and target token, the count's recurrent part is 6 x the GRU's or LSTM's
    weight matrices (every gate's input and recurrent matrix, both directions)."""
    model = small(rnn, attention)
    rnn_weights = sum(p.numel() for n, p in model.named_parameters() if "_rnn.weight_" in n)
    extra = translation_batch_flops(model.config, 1, 1, 1) - translation_batch_flops(
        model.config.replace(n_layers=1, n_decoder_layers=1), 1, 1, 1
    )
    one_layer = small(rnn, attention, n_layers=1)
    weights_one = sum(p.numel() for n, p in one_layer.named_parameters() if "_rnn.weight_" in n)
    assert extra == 6 * (rnn_weights - weights_one)


def test_bad_configs_are_named() -> None:
    with pytest.raises(
        ValueError, match="rnn.cell='gru' is invalid: expected None for arch='decoder'"
    ):
        aiayn.build_model("gpt2-small", rnn={"cell": "gru"})
    with pytest.raises(ValueError, match="RNNConfig.cell='rnn' is invalid"):
        aiayn.build_model("paper-base", rnn={"cell": "rnn"})
    with pytest.raises(ValueError, match="d_model=33 is invalid: expected an even width"):
        aiayn.build_model("paper-base", rnn={"cell": "lstm"}, d_model=33, attention={"n_heads": 1})
    from aiayn.inspect.calc import parameter_count

    with pytest.raises(ValueError, match="covers the Transformer"):
        parameter_count(small("gru", True).config)


def test_trains_resumes_saves_and_translates_like_the_transformer(tmp_path: Path) -> None:
    write_corpus(tmp_path / "data")
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        TRANSLATION_TOML.replace('preset = "paper-base"', 'preset = "paper-base"\nrnn.cell = "gru"')
    )
    run = load_run_config(cfg, {"model.dropout": 0.0})
    full = train_translation(run, tmp_path / "full", tmp_path / "data", progress=False)
    train_translation(run, tmp_path / "split", tmp_path / "data", stop_after=3, progress=False)
    resumed = train_translation(
        run, tmp_path / "split", tmp_path / "data", resume=True, progress=False
    )
    losses = [h["loss"] for h in full.history]
    # the same fp32 steps replayed (bit for bit on CPU); 1e-5 is ~80 ulps (2^-23) of slack
    assert [h["loss"] for h in resumed.history] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0]
    loaded = aiayn.load_model(tmp_path / "full" / "checkpoint")
    assert isinstance(loaded, RNNEncoderDecoder)
    assert loaded.head.weight is loaded.src_token.weight  # tying survives the checkpoint
    src = tmp_path / "in.txt"
    src.write_text("ein hund läuft\n")
    out = tmp_path / "out.txt"
    argv = [
        "translate",
        "--checkpoint",
        str(tmp_path / "full" / "checkpoint"),
        "--input",
        str(src),
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    assert out.read_text().strip()


def test_an_empty_source_gives_zeros_and_left_padding_is_refused() -> None:
    model = small("gru", True)
    att = model.attention
    assert att is not None
    memory = torch.randn(1, 3, 32)
    context, weights, _ = att(
        torch.randn(1, 2, 32), memory, att.key(memory), torch.zeros(1, 3, dtype=torch.bool)
    )
    assert torch.all(context == 0) and torch.all(weights == 0)  # not NaN
    src = torch.randint(3, 50, (1, 5))
    with pytest.raises(ValueError, match="right-padded"):
        model.encode(src, torch.tensor([[False, True, True, True, True]]))


def test_explorer_and_attention_pictures_take_an_rnn_checkpoint(tmp_path: Path) -> None:
    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.explore.registry import Entry
    from aiayn.inspect.attention_maps import attention_maps

    model = small("gru", True, vocab_size=300, pad_id=0)
    tok = BPETokenizer.from_lines(["ein hund läuft", "a dog runs"] * 20, 300)
    aiayn.checkpoint.save_bundle(tmp_path / "ckpt", model, tok, {})
    entry = Entry("gru", model.config, tmp_path / "ckpt")
    assert entry.describe()["parameters"] == model.num_parameters()
    paths = attention_maps(tmp_path / "ckpt", "ein hund", tmp_path / "fig", target_text="a dog")
    assert list(paths) == ["cross"] and paths["cross"].stat().st_size > 1000


@pytest.mark.parametrize(("rnn", "attention"), KINDS)
def test_beam_search_takes_one_memory_row_per_sentence(rnn: str, attention: bool) -> None:
    """Beam search hands the decoder one encoder row per sentence for its K beams; an RNN
    keeps them per row.  Batched beams equal each sentence decoded alone."""
    model = small(rnn, attention)
    src = torch.randint(3, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    src[1, 4:] = 0
    cfg = aiayn.generate.beam.BeamConfig(3, 0.6, max_extra=4)
    batched = beam_search(model, src, bos=1, eos=2, config=cfg)
    alone = [
        beam_search(model, src[i : i + 1, : int((src[i] != 0).sum())], bos=1, eos=2, config=cfg)[0]
        for i in range(3)
    ]
    assert batched == alone
    assert all(len(h) > 0 for h in batched)
    memory, keep = model.encode(src)
    with pytest.raises(ValueError, match="3 rows for 7 decoder rows"):
        model.decode(torch.ones(7, 1, dtype=torch.long), memory, keep, cache=model.new_cache(7))
