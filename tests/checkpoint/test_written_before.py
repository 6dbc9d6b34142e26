"""A checkpoint written by aiayn before its config became a package (and its errors types,
its interop a family a file) loads as it was, with the logits it gave then.

The folder in fixtures/ was written by aiayn at commit 14c7fac (a two-layer Llama-style model:
RMSNorm, SwiGLU, rotary positions, grouped-query attention, a character tokenizer), with
the last position's logits for a fixed text.  A run config in the TOML of that time, flat
setting names included, is read to the same model config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.errors import DeprecatedSetting
from aiayn.training.config import load_run_config

FIXTURE = Path(__file__).parent / "fixtures" / "written_before_config_package"
# fp32 on another CPU sums the 32- and 64-term products in another order: each step's error is
# at most ~64 * 2^-24 relative (~4e-6), through two layers and the head.
TOL = {"rtol": 2e-5, "atol": 2e-5}


def test_an_older_checkpoint_loads_with_the_logits_it_gave() -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    bundle = aiayn.load(FIXTURE / "checkpoint")
    ids = torch.tensor([bundle.tokenizer.encode(expected["text"])])
    with torch.no_grad():
        logits = bundle.model.eval()(ids)
    torch.testing.assert_close(logits[0, -1], torch.tensor(expected["logits"]), **TOL)


def test_an_older_run_config_with_flat_names_reads_to_the_same_model(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[model]\npreset = "llama-style-small"\nn_layers = 2\nd_model = 32\nn_heads = 4\n'
        "n_kv_heads = 2\nd_ff = 64\nvocab_size = 17\nmax_len = 32\ndropout = 0.0\n"
        '[data]\ntext = "corpus.txt"\n'
    )
    saved = aiayn.load(FIXTURE / "checkpoint").model.config
    with pytest.warns(DeprecatedSetting):
        assert load_run_config(toml).model == saved
