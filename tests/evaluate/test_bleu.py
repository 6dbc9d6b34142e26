"""BLEU as aiayn reports it equals an independent computation: by hand on a small corpus, and
sacreBLEU's own command-line scorer on the hypotheses that ``aiayn evaluate`` wrote."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sacrebleu

from aiayn.evaluate.translation import score

HYPS = ["the cat sat on the mat", "a dog runs in the park today", "two men walk"]
REFS = ["the cat sat on a mat", "a dog is running in the park", "two men are walking home"]


def bleu_by_hand(hyps: list[str], refs: list[str]) -> float:
    """Papineni et al. (2002): geometric mean of clipped 1-4-gram precisions over the corpus,
    times the brevity penalty; on space-separated words (13a leaves these unchanged)."""
    matches, totals = [0] * 4, [0] * 4
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs, strict=True):
        hw, rw = h.split(), r.split()
        hyp_len, ref_len = hyp_len + len(hw), ref_len + len(rw)
        for n in range(1, 5):
            hc = Counter(tuple(hw[i : i + n]) for i in range(len(hw) - n + 1))
            rc = Counter(tuple(rw[i : i + n]) for i in range(len(rw) - n + 1))
            matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
            totals[n - 1] += max(len(hw) - n + 1, 0)
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def test_score_equals_a_hand_computation_and_sacrebleu() -> None:
    expected = bleu_by_hand(HYPS, REFS)
    got = score(HYPS, REFS)
    assert got.bleu == pytest.approx(expected, abs=1e-9)
    assert got.bleu == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-9)
    assert "case:mixed" in got.signature and "tok:13a" in got.signature
    # cased: changing the case of a word changes the score
    assert score(["The cat sat on the mat", *HYPS[1:]], REFS).bleu < got.bleu


def test_evaluate_prints_what_sacrebleu_gives_for_its_hypotheses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main
    from aiayn.train.config import load_run_config
    from aiayn.train.translate import train_translation
    from tests.train.test_translation import TOML, write_corpus

    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TOML)
    run = load_run_config(
        tmp_path / "run.toml",
        {"train.max_steps": 250, "train.lr": 0.5, "model.dropout": 0.0, "train.warmup_steps": 10,
         "train.label_smoothing": 0.0},
    )  # fmt: skip
    train_translation(run, tmp_path / "run", tmp_path / "data", progress=False)
    hyp_file = tmp_path / "hyps.txt"
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run" / "checkpoint"), "--data", str(tmp_path / "data"), "--output", str(hyp_file)]) == 0  # fmt: skip
    printed = float(capsys.readouterr().out.split("BLEU ")[1].split()[0])
    refs = tmp_path / "refs.txt"
    from aiayn.data.parallel import multi30k

    refs.write_text("".join(p.target + "\n" for p in multi30k(tmp_path / "data" / "multi30k", "test_2016_flickr", "de", "en")))  # fmt: skip
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(refs), "-i", str(hyp_file), "-b", "-w", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed > 10.0  # a score worth comparing (not 0 = 0)
    assert printed == pytest.approx(float(cli.stdout.strip()), abs=0.005)
