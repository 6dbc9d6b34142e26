"""forward(..., targets=) equals cross entropy of the logits, in every family."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aiayn import build_model

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 4.8e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}


def test_encoder_decoder_loss_ignores_padding_and_smooths() -> None:
    torch.manual_seed(0)
    model = build_model(
        "paper-base",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 2},
        ffn={"d_ff": 64},
        vocab_size=50,
    )
    model.eval()
    src, tgt = torch.randint(1, 50, (3, 7)), torch.randint(1, 50, (3, 6))
    out = torch.randint(1, 50, (3, 6))
    out[1, 3:] = 0  # padding (pad_id 0)
    logits = model(src, tgt)
    expected = F.cross_entropy(
        logits.flatten(0, 1), out.flatten(), ignore_index=0, label_smoothing=0.1
    )
    got = model(src, tgt, targets=out, label_smoothing=0.1)
    torch.testing.assert_close(got, expected, **TOL)


def test_decoder_and_encoder_losses() -> None:
    torch.manual_seed(0)
    lm = build_model(
        "gpt2-small",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 2},
        ffn={"d_ff": 64},
        vocab_size=40,
    )
    lm.eval()
    x, y = torch.randint(0, 40, (2, 9)), torch.randint(0, 40, (2, 9))
    torch.testing.assert_close(
        lm(x, targets=y), F.cross_entropy(lm(x).flatten(0, 1), y.flatten()), **TOL
    )
    bert = build_model(
        "bert-base",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 2},
        ffn={"d_ff": 64},
        vocab_size=40,
    )
    bert.eval()
    ids = torch.randint(1, 40, (2, 9))
    labels = torch.full((2, 9), -100)
    labels[:, 2] = ids[:, 2]
    torch.testing.assert_close(
        bert(ids, targets=labels),
        F.cross_entropy(bert(ids).flatten(0, 1), labels.flatten()),
        **TOL,
    )
