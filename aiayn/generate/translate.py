"""Translating text with a trained encoder-decoder: the checkpoint's tokenizer in, beam search
(or greedy decoding) through the model, text out.

Lines are tokenized with the checkpoint's BPE vocabulary, sorted by length into batches (so
that little work goes to padding), decoded, detokenized, and put back in their original order.
An empty line translates to an empty line.  A line longer than the model supports is an error
naming the line, unless ``truncate`` keeps its beginning.  Special tokens (padding, BOS,
unknown) are masked out of every step, so they never appear in a translation.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.data.batching import pad
from aiayn.data.bpe import BOS, EOS, PAD, SPECIAL_TOKENS, UNK
from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.errors import UserError
from aiayn.generate.beam import PAPER_BEAM, BeamConfig, beam_search, greedy_decode, search_steps
from aiayn.generate.cancel import CancelToken
from aiayn.generate.captured import wants_capture
from aiayn.interop.generation_config import NONE, GenerationIds
from aiayn.models import EncoderDecoder
from aiayn.nn.cpu_decoding import for_decoding

NEVER = (PAD, BOS, UNK)  # special tokens that must not appear in a translation


def specials(tokenizer: BPETokenizer | MarianTokenizer) -> tuple[int, int, int, tuple[int, ...]]:
    """(start, end, padding, never-generated) token ids: aiayn's BPE reserves the first four
    ids; Marian starts from <pad> and ends with </s> (its tokenizer appends it)."""
    if isinstance(tokenizer, MarianTokenizer):
        return tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, (tokenizer.pad_id,)
    # Any other tokenizer must reserve ids as aiayn's BPE does, or decoding would start, end
    # and pad with the wrong tokens (a BART folder's has <s>=0, <pad>=1, </s>=2).
    for i, name in enumerate(SPECIAL_TOKENS):
        found = tokenizer.tok.id_to_token(i)
        if found != name:
            raise UserError(
                f"the tokenizer's id {i} is {found!r}, where translation expects {name!r}"
                f" (ids 0-3 = {', '.join(SPECIAL_TOKENS)}, aiayn's BPE layout); this"
                " checkpoint's tokenizer is not one translate() can drive"
            )
    return BOS, EOS, PAD, NEVER


def translate(
    model: EncoderDecoder,
    tokenizer: BPETokenizer | MarianTokenizer,
    lines: Sequence[str],
    *,
    beam: BeamConfig | None = PAPER_BEAM,
    batch_size: int = 64,
    truncate: bool = False,
    generation: GenerationIds = NONE,
    cancel: CancelToken | None = None,
    compile: str = "off",
) -> list[str]:
    """Translations of ``lines`` (beam search, or greedy when ``beam`` is None).

    ``generation`` -- a Hugging Face folder's ids (generation_config.json): its decoder start,
    end and padding ids replace the tokenizer's where it names them.  ``cancel`` stops the work
    at the next decoding step (aiayn/generate/cancel.py).  ``compile`` captures beam search's
    decoding step (aiayn/generate/captured.py).
    """
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size}: translate at least 1 line per batch")
    limit = model.config.max_len
    bos, eos, pad_id, never = specials(tokenizer)
    if len(generation.eos) > 1:
        raise UserError(
            f"eos_token_id={list(generation.eos)}: translation ends at one end id; this folder"
            " names several"
        )
    bos = generation.decoder_start if generation.decoder_start is not None else bos
    eos = generation.eos[0] if generation.eos else eos
    pad_id = generation.pad if generation.pad is not None else pad_id
    appends_eos = isinstance(tokenizer, MarianTokenizer)
    encoded: list[list[int] | None] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            encoded.append(None)
            continue
        ids = (
            tokenizer.encode(line.strip())
            if appends_eos
            else [*tokenizer.encode(line.strip()), eos]
        )
        if len(ids) > limit:
            if not truncate:
                raise UserError(
                    f"line {number} has {len(ids)} tokens; the model supports at most {limit}"
                    " (pass truncate=True / --truncate to keep its beginning)"
                )
            ids = [*ids[: limit - 1], eos]
        encoded.append(ids)
    order = sorted(
        (i for i, e in enumerate(encoded) if e is not None), key=lambda i: len(encoded[i] or [])
    )
    out = [""] * len(lines)
    rows = min(batch_size, len(order)) * (1 if beam is None else beam.beam_size)
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    if beam is not None:
        lengths = [[len(encoded[i] or []) for i in chunk] for chunk in chunks]
        compile = compile_for_job(model, compile, rows, lengths, beam)
    with for_decoding(model, rows):  # the kernels chosen and weights packed once for all batches
        for chunk in chunks:
            src = pad([encoded[i] or [] for i in chunk], pad_id)
            src = src.to(next(model.parameters()).device)
            if beam is None:
                hyps = greedy_decode(model, src, bos=bos, eos=eos, never=never, cancel=cancel)
            else:
                hyps = beam_search(
                    model,
                    src,
                    bos=bos,
                    eos=eos,
                    config=beam,
                    never=never,
                    cancel=cancel,
                    compile=compile,
                )
            for i, ids in zip(chunk, hyps, strict=True):
                out[i] = tokenizer.decode(ids).strip()
    return out


def compile_for_job(
    model: EncoderDecoder,
    compile: str,
    rows: int,
    lengths: Sequence[Sequence[int]],
    beam: BeamConfig,
) -> str:
    """``compile`` for each batch's search: ``auto`` decided once for the whole job (every
    batch's steps together: one capture serves them all), so that a long file of short
    batches captures its step while one sentence alone does not.  ``lengths``: each batch's
    source lengths."""
    if compile != "auto":
        return compile
    steps = sum(search_steps(model, max(batch), beam) for batch in lengths)
    return "on" if wants_capture(model, compile, rows, steps) else "off"
