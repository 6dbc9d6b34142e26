"""BLEU and chrF as aiayn reports them equal an independent computation: by hand (13a
tokenization written out, n-gram counts and character n-gram statistics listed in the test),
and sacreBLEU's own command-line scorer on the hypotheses that ``aiayn evaluate`` wrote."""

from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sacrebleu

from aiayn.evaluation.translation import score

HYPS = ["the cat sat on the mat", "a dog runs in the park today", "two men walk"]
REFS = ["the cat sat on a mat", "a dog is running in the park", "two men are walking home"]

# Punctuation, case and a number, so that sacreBLEU's 13a tokenization and its lowercasing
# both change the score.
PUNCT_HYPS = [
    "the cat sat on the mat.",
    "A dog (brown) runs in the park!",
    "Is it 3.5 km to the town's market?",
]
PUNCT_REFS = [
    "The cat sat on the mat!",
    "A brown dog runs in the big park.",
    "Is it 3.5 km to the market of the old town?",
]
# The same, tokenized by hand as 13a does (mteval-v13a.pl): spaces around ( ) ! ? and the other
# symbols, and around . and , except between digits ("3.5" stays); the apostrophe stays.
PUNCT_HYPS_13A = [
    "the cat sat on the mat .",
    "A dog ( brown ) runs in the park !",
    "Is it 3.5 km to the town's market ?",
]
PUNCT_REFS_13A = [
    "The cat sat on the mat !",
    "A brown dog runs in the big park .",
    "Is it 3.5 km to the market of the old town ?",
]

Stats = tuple[list[int], list[int], int, int]  # matches and totals for n = 1..4, lengths


def ngram_stats(hyps: list[str], refs: list[str]) -> Stats:
    """Clipped 1-4-gram matches and hypothesis n-gram totals over a corpus of space-separated
    tokens, and the hypothesis and reference lengths (Papineni et al., 2002)."""
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
    return matches, totals, hyp_len, ref_len


def bleu_from_stats(stats: Stats) -> float:
    """Geometric mean of the four precisions times the brevity penalty, in percent."""
    matches, totals, hyp_len, ref_len = stats
    log_p = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
    bp = 1.0 if hyp_len > ref_len else math.exp(1 - ref_len / hyp_len)
    return 100 * bp * math.exp(log_p)


def bleu_by_hand(hyps: list[str], refs: list[str]) -> float:
    """BLEU of space-separated tokens (13a leaves plain lowercase words unchanged)."""
    return bleu_from_stats(ngram_stats(hyps, refs))


def char_ngram_stats(
    hyps: list[str], refs: list[str], order: int = 6
) -> list[tuple[int, int, int]]:
    """(hypothesis n-grams, reference n-grams, clipped matches) for n = 1..order, summed over
    the corpus, on the characters with whitespace removed (chrF, Popović 2015)."""
    stats = []
    for n in range(1, order + 1):
        n_hyp = n_ref = n_match = 0
        for h, r in zip(hyps, refs, strict=True):
            h, r = "".join(h.split()), "".join(r.split())
            hc = Counter(h[i : i + n] for i in range(len(h) - n + 1))
            rc = Counter(r[i : i + n] for i in range(len(r) - n + 1))
            n_hyp, n_ref = n_hyp + sum(hc.values()), n_ref + sum(rc.values())
            n_match += sum(min(c, rc[g]) for g, c in hc.items())
        stats.append((n_hyp, n_ref, n_match))
    return stats


def chrf_from_stats(stats: list[tuple[int, int, int]], beta: float = 2.0) -> float:
    """F-beta of the character n-gram precision and recall, each averaged over the orders
    (every order here has n-grams on both sides), in percent."""
    precision = sum(m / h for h, _, m in stats) / len(stats)
    recall = sum(m / r for _, r, m in stats) / len(stats)
    return 100 * (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def test_score_equals_a_hand_computation_and_sacrebleu() -> None:
    expected = bleu_by_hand(HYPS, REFS)
    got = score(HYPS, REFS)
    # float64 by other code (and sacrebleu's): an ulp of 32 is 7e-15; 1e-9 is loose (seen 7e-15)
    assert got.bleu == pytest.approx(expected, abs=1e-9)
    assert got.bleu == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score, abs=1e-9)
    assert "case:mixed" in got.signature and "tok:13a" in got.signature
    # cased: changing the case of a word changes the score
    assert score(["The cat sat on the mat", *HYPS[1:]], REFS).bleu < got.bleu


def test_bleu_tokenizes_punctuation_as_13a_does() -> None:
    """Counted by hand on the 13a tokens: the score is cased, on 13a tokens, with the brevity
    penalty of 26 hypothesis tokens against 28 reference tokens."""
    stats = ngram_stats(PUNCT_HYPS_13A, PUNCT_REFS_13A)
    # n=1: 5 + 7 + 8 of 7 + 10 + 9 hypothesis tokens ("the" is clipped to the reference's one, "The" differs)
    assert stats == ([20, 11, 8, 5], [26, 23, 20, 17], 26, 28)
    expected = bleu_from_stats(stats)
    got = score(PUNCT_HYPS, PUNCT_REFS)
    # float64 by other code: an ulp of 42 is 7e-15; 1e-9 is loose (seen 7e-15)
    assert got.bleu == pytest.approx(expected, abs=1e-9), (
        f"BLEU {got.bleu} is not that of the 13a tokens, {expected}"
    )
    # The example has teeth: on whitespace-split words ("mat." against "mat!") BLEU differs.
    assert abs(bleu_by_hand(PUNCT_HYPS, PUNCT_REFS) - expected) > 1.0  # measured 1.03


def test_lowercase_bleu_is_bleu_of_the_lowercased_13a_tokens() -> None:
    lower_hyps = [h.lower() for h in PUNCT_HYPS_13A]
    lower_refs = [r.lower() for r in PUNCT_REFS_13A]
    stats = ngram_stats(lower_hyps, lower_refs)
    assert stats == ([21, 12, 9, 6], [26, 23, 20, 17], 26, 28)  # "the cat ..." now matches
    got = score(PUNCT_HYPS, PUNCT_REFS)
    assert got.bleu_lowercase == pytest.approx(bleu_from_stats(stats), abs=1e-9)  # as above
    assert got.bleu_lowercase > got.bleu + 1.0  # measured 4.86 points higher


def test_chrf_is_the_character_f2_score_counted_by_hand() -> None:
    """chrF (beta = 2, orders 1-6, spaces removed) of "thecatsat." against "acatsat!"."""
    hyp, ref = "the cat sat.", "a cat sat!"
    # (hypothesis n-grams, reference n-grams, matches) for n = 1..6, counted by hand:
    # n=1: t x3 h e c a x2 s . | a x3 c t x2 s ! -> t 2, c 1, a 2, s 1 = 6 matches
    # n=2: th he ec ca at ts sa at t. | ac ca at ts sa at t! -> ca, at x2, ts, sa = 5
    table = [(10, 8, 6), (9, 7, 5), (8, 6, 4), (7, 5, 3), (6, 4, 2), (5, 3, 1)]
    assert char_ngram_stats([hyp], [ref]) == table
    precision = (6 / 10 + 5 / 9 + 4 / 8 + 3 / 7 + 2 / 6 + 1 / 5) / 6
    recall = (6 / 8 + 5 / 7 + 4 / 6 + 3 / 5 + 2 / 4 + 1 / 3) / 6
    expected = 100 * 5 * precision * recall / (4 * precision + recall)  # F_beta, beta^2 = 4
    # float64: an ulp of 55 is 7e-15 (1e-12 leaves ~140); aiayn's chrF by other code: 1e-9 as above
    assert chrf_from_stats(table) == pytest.approx(expected, abs=1e-12)
    assert score([hyp], [ref]).chrf == pytest.approx(expected, abs=1e-9)
    # A corpus: the statistics are summed over its sentences before the F-score.
    corpus = char_ngram_stats(PUNCT_HYPS, PUNCT_REFS)
    assert score(PUNCT_HYPS, PUNCT_REFS).chrf == pytest.approx(chrf_from_stats(corpus), abs=1e-9)


@pytest.mark.slow
def test_evaluate_prints_what_sacrebleu_gives_for_its_hypotheses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main
    from aiayn.training.config import load_run_config
    from aiayn.training.translate import train_translation
    from tests.conftest import TRANSLATION_TOML, write_corpus

    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TRANSLATION_TOML)
    run = load_run_config(
        tmp_path / "run.toml",
        {
            "train.max_steps": 250,
            "train.lr": 0.5,
            "model.dropout": 0.0,
            "train.warmup_steps": 10,
            "train.label_smoothing": 0.0,
        },
    )
    train_translation(run, tmp_path / "run", tmp_path / "data", progress=False)
    hyp_file = tmp_path / "hyps.txt"
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                str(tmp_path / "run" / "checkpoint"),
                "--data",
                str(tmp_path / "data"),
                "--output",
                str(hyp_file),
            ]
        )
        == 0
    )
    printed = float(capsys.readouterr().out.split("BLEU ")[1].split()[0])
    refs = tmp_path / "refs.txt"
    from aiayn.data.parallel import multi30k

    refs.write_text(
        "".join(
            p.target + "\n"
            for p in multi30k(tmp_path / "data" / "multi30k", "test_2016_flickr", "de", "en")
        )
    )
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(refs), "-i", str(hyp_file), "-b", "-w", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed > 10.0  # a score worth comparing (not 0 = 0); measured 64.45
    # both printed to 2 decimals: half their last place, so the printed figures must agree
    assert printed == pytest.approx(float(cli.stdout.strip()), abs=0.005)
