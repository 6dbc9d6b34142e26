"""Scoring translations with sacreBLEU.

Scores are sacreBLEU's (Post, 2018): BLEU (cased, on detokenized text with its standard 13a
tokenization) and chrF.  Older reimplementations report BLEU on lowercased, tokenized text;
``bleu_lowercase`` gives that comparable figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu
import torch

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.errors import UserError
from aiayn.generate.beam import PAPER_BEAM, BeamConfig
from aiayn.generate.translate import translate
from aiayn.models import EncoderDecoder


@dataclass(frozen=True)
class Scores:
    bleu: float
    chrf: float
    bleu_lowercase: float
    signature: str

    def __str__(self) -> str:
        return f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  BLEU(lowercase) {self.bleu_lowercase:.2f}  [{self.signature}]"


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU()
    result = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf = sacrebleu.metrics.CHRF().corpus_score(list(hypotheses), [list(references)])
    lower = sacrebleu.metrics.BLEU(lowercase=True).corpus_score(
        list(hypotheses), [list(references)]
    )
    return Scores(result.score, chrf.score, lower.score, str(bleu.get_signature()))


@torch.no_grad()
def evaluate_translation(
    model: EncoderDecoder,
    tokenizer: BPETokenizer | MarianTokenizer,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    beam: BeamConfig | None = PAPER_BEAM,
) -> tuple[Scores, list[str]]:
    hyps = translate(model, tokenizer, sources, beam=beam)
    return score(hyps, references), hyps
