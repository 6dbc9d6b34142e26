"""Tokenizers behind one small interface: characters, byte-level BPE (HF `tokenizers`), and
the class labels of an image classifier."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from aiayn.errors import UserError


class CharTokenizer:
    kind = "char"

    def __init__(self, chars: list[str]) -> None:
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise UserError("CharTokenizer needs distinct single characters")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        if not text:
            raise UserError("cannot build a character vocabulary from empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as err:
            raise UserError(
                f"character {err.args[0]!r} is not in the tokenizer's vocabulary of {self.vocab_size}"
            ) from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=False))


class BPETokenizer:
    """A byte-level BPE tokenizer (HF ``tokenizers``) behind the same small interface."""

    kind = "bpe"

    def __init__(
        self,
        tokenizer: object,
        *,
        model_max_length: int | None = None,
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        """``model_max_length``, ``chat_template`` and ``special_tokens`` (names such as
        ``"bos_token"`` to their strings): a published folder's settings that live outside
        ``tokenizer.json`` (aiayn/interop/tokenizer_config.py), kept with it."""
        from tokenizers import Tokenizer

        assert isinstance(tokenizer, Tokenizer)
        self.model_max_length = model_max_length
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        # A published tokenizer.json may carry fixed padding and truncation (a sentence
        # embedding model's "pad to 128").  transformers applies them only when a call asks for
        # them; here ``encode`` gives a text's own tokens, and batching pads and masks.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tok = tokenizer

    @classmethod
    def from_text(cls, text: str, vocab_size: int) -> BPETokenizer:
        return cls.from_lines(text.splitlines(keepends=True), vocab_size)

    @classmethod
    def from_lines(cls, lines: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Byte-level BPE trained on ``lines`` (any iterable: a stream of a corpus's lines is
        never held whole)."""
        from aiayn.data.bpe import train_bpe

        return cls(train_bpe(lines, vocab_size=vocab_size))

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size())

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=False))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(
                {
                    "kind": "bpe",
                    "tokenizer": json.loads(self.tok.to_str()),
                    "model_max_length": self.model_max_length,
                    "chat_template": self.chat_template,
                    "special_tokens": self.special_tokens,
                }
            )
        )


class LabelTokenizer:
    """The class names of an image classifier (aiayn/models/vision.py): its output ids mean
    these labels, so a checkpoint carries them as a text model carries its vocabulary."""

    kind = "labels"

    def __init__(self, labels: list[str]) -> None:
        if not labels or len(set(labels)) != len(labels):
            raise UserError("LabelTokenizer needs distinct class names")
        self.labels = labels
        self.index = {name: i for i, name in enumerate(labels)}

    @property
    def vocab_size(self) -> int:
        return len(self.labels)

    def encode(self, text: str) -> list[int]:
        if text not in self.index:
            raise UserError(f"unknown class {text!r}; the classes are {self.labels}")
        return [self.index[text]]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.labels[i] for i in ids)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"kind": "labels", "labels": self.labels}))


class MarianTokenizer:
    """Marian's (OPUS-MT's) tokenizer, as HF's MarianTokenizer: the source text cut into pieces
    by the source SentencePiece model, the pieces looked up in the shared vocabulary (unknown
    ones as ``<unk>``), ``</s>`` appended; ids back to pieces, special tokens dropped, joined by
    the target SentencePiece model.  The decoder starts from ``<pad>``."""

    kind = "marian"

    def __init__(self, source: bytes, target: bytes, vocab: dict[str, int]) -> None:
        try:
            import sentencepiece as spm
        except ImportError as err:
            raise UserError(
                "Marian's tokenizer needs sentencepiece: pip install sentencepiece"
            ) from err
        self.source_model, self.target_model, self.vocab = source, target, vocab
        self.src = spm.SentencePieceProcessor(model_proto=source)
        self.tgt = spm.SentencePieceProcessor(model_proto=target)
        self.pieces = {i: p for p, i in vocab.items()}
        try:
            self.eos_id, self.unk_id, self.pad_id = vocab["</s>"], vocab["<unk>"], vocab["<pad>"]
        except KeyError as err:
            raise UserError(f"Marian's vocabulary has no {err.args[0]} token") from err
        self.bos_id = self.pad_id  # the decoder's start token
        self.specials = {self.eos_id, self.unk_id, self.pad_id}

    @property
    def vocab_size(self) -> int:
        return max(self.pieces) + 1

    def encode(self, text: str) -> list[int]:
        pieces = self.src.encode(text, out_type=str)
        return [*(self.vocab.get(p, self.unk_id) for p in pieces), self.eos_id]

    def encode_target(self, text: str) -> list[int]:
        """Target-language ids, cut by the target SentencePiece model, without ``</s>``: the
        decoder's input after its ``<pad>`` start."""
        pieces = self.tgt.encode(text, out_type=str)
        return [self.vocab.get(p, self.unk_id) for p in pieces]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces[i] for i in ids if i in self.pieces and i not in self.specials]
        return str(self.tgt.decode_pieces(pieces))

    def save(self, path: str | Path) -> None:
        import base64

        Path(path).write_text(
            json.dumps(
                {
                    "kind": "marian",
                    "vocab": self.vocab,
                    "source": base64.b64encode(self.source_model).decode(),
                    "target": base64.b64encode(self.target_model).decode(),
                }
            )
        )


Tokenizer = CharTokenizer | BPETokenizer | LabelTokenizer | MarianTokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer saved by ``CharTokenizer.save`` or ``BPETokenizer.save``."""
    try:
        data = json.loads(Path(path).read_text())
        if data["kind"] == "char":
            return CharTokenizer(list(data["chars"]))
        if data["kind"] == "labels":
            return LabelTokenizer([str(x) for x in data["labels"]])
        if data["kind"] == "bpe":
            from tokenizers import Tokenizer as HFTokenizer

            return BPETokenizer(
                HFTokenizer.from_str(json.dumps(data["tokenizer"])),
                model_max_length=data.get("model_max_length"),
                chat_template=data.get("chat_template"),
                special_tokens=data.get("special_tokens"),
            )
        if data["kind"] == "marian":
            import base64

            return MarianTokenizer(
                base64.b64decode(data["source"]),
                base64.b64decode(data["target"]),
                {str(k): int(v) for k, v in data["vocab"].items()},
            )
    except Exception as err:  # any failure to read or parse the file
        raise UserError(f"cannot load tokenizer {path}: {err}") from err
    raise UserError(f"cannot load tokenizer {path}: unknown kind {data.get('kind')!r}")
