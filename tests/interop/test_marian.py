"""aiayn's EncoderDecoder against Hugging Face MarianMTModel (OPUS-MT's architecture) with
identical random weights: logits to 1e-5 over a full pass, with source padding, and over
cached decoding; the round trip is exact."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

from aiayn.interop.marian import from_hf_marian, to_hf_marian
from aiayn.models.encoder_decoder import EncoderDecoder
from tests.interop.support import assert_same_state, perturbed_seq2seq

# fp32, HF sums in other orders: a 48-term dot moves up to 48 x 2^-24 ~ 3e-6; CPU: <= 1.2e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB, PAD = 61, 60


def marian(**overrides: object) -> torch.nn.Module:
    kwargs: dict = {
        "vocab_size": VOCAB,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 3,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 48,
        "decoder_ffn_dim": 48,
        "max_position_embeddings": 40,
        "pad_token_id": PAD,
        "decoder_start_token_id": PAD,
        "eos_token_id": 0,
        "activation_function": "swish",
        "scale_embedding": True,
        "dropout": 0.0,
        "attention.dropout": 0.0,
        "activation_dropout": 0.0,
    }
    kwargs.update(overrides)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**kwargs)).eval()
    return perturbed_seq2seq(model)


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, PAD, (3, 11), generator=g)
    keep = torch.ones(3, 11, dtype=torch.bool)
    keep[1, 7:] = False  # Marian pads on the right
    src[~keep] = PAD
    tgt = torch.cat([torch.full((3, 1), PAD), torch.randint(1, PAD, (3, 8), generator=g)], 1)
    return src, keep, tgt


@pytest.mark.parametrize(
    "overrides", [{}, {"activation_function": "gelu", "scale_embedding": False}]
)
def test_logits_and_cached_decoding_equal_hf(overrides: dict) -> None:
    hf = marian(**overrides)
    ours = from_hf_marian(hf).eval()
    assert isinstance(ours, EncoderDecoder) and ours.config.head_bias
    src, keep, tgt = batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
        got = ours(src, tgt, src_mask=keep)
        torch.testing.assert_close(got, want, **TOL)
        memory, src_keep = ours.encode(src, keep)
        cache = ours.new_cache(3, tgt.shape[1])
        steps = [ours.decode(tgt[:, :1], memory, src_keep, cache=cache)]
        steps += [ours.decode(tgt[:, i : i + 1], None, cache=cache) for i in range(1, tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)
    back = to_hf_marian(ours).eval()
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")


def test_greedy_translation_equals_hf_generate() -> None:
    """aiayn's greedy decoding from Marian's start token equals HF's generate (num_beams=1)."""
    from aiayn.generate.beam import greedy_decode

    hf = marian(forced_eos_token_id=None)  # else HF forces EOS at the length limit
    ours = from_hf_marian(hf).eval()
    src, keep, _ = batch()
    src, keep = src[[0, 2]], keep[[0, 2]]  # unpadded rows
    with torch.no_grad():
        want = hf.generate(
            input_ids=src,
            attention_mask=keep.long(),
            num_beams=1,
            do_sample=False,
            max_new_tokens=11,
            min_new_tokens=11,
        )
    # HF's min_new_tokens masks EOS (0) for all 11 tokens, as `never` does.
    got = greedy_decode(ours, src, bos=PAD, eos=-1, max_extra=1, never=(0,))
    assert want[:, 1:].tolist() == [row[:11] for row in got]


def test_what_cannot_be_converted_is_named() -> None:
    with pytest.raises(ValueError, match="normalize_before"):
        from_hf_marian(marian(normalize_before=True))
    with pytest.raises(ValueError, match="share_encoder_decoder_embeddings"):
        from_hf_marian(marian(share_encoder_decoder_embeddings=False))


def test_marian_folders_with_and_without_position_tables(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A folder as HF saves it loads logit for logit; so does one whose sinusoid tables were
    left out (they are computed, and equal HF's own); ours written back is read by HF."""
    from safetensors.torch import save_file

    from aiayn.interop.hf_folder import load_hf_folder, save_hf_folder
    from aiayn.interop.marian import marian_positions

    hf = marian()
    # both round a float64 table in [-1, 1] to fp32: 1e-6 is ~8 ulps (2^-23) of room; CPU: 0
    torch.testing.assert_close(
        marian_positions(40, 32),
        hf.model.encoder.embed_positions.weight.detach(),
        atol=1e-6,
        rtol=0,
    )
    src, keep, tgt = batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf_folder(tmp_path / "hf")
    assert isinstance(ours, EncoderDecoder)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt, src_mask=keep), want, **TOL)
    # Without the position tables (and with the tied copies some folders hold):
    state = {n: t.contiguous() for n, t in hf.state_dict().items() if "embed_positions" not in n}
    state.pop("model.encoder.embed_tokens.weight", None)
    state.pop("model.decoder.embed_tokens.weight", None)
    state.pop("lm_head.weight", None)
    (tmp_path / "bare").mkdir()
    hf.config.save_pretrained(tmp_path / "bare")
    save_file(state, str(tmp_path / "bare" / "model.safetensors"))
    bare = load_hf_folder(tmp_path / "bare")
    with torch.no_grad():
        torch.testing.assert_close(bare(src, tgt, src_mask=keep), want, **TOL)
    save_hf_folder(ours, tmp_path / "back", "marian")
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        got = again(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, want, **TOL)


def _marian_folder(folder, vocab_size: int = 80):  # type: ignore[no-untyped-def]
    """An OPUS-MT-style folder: config, weights, source.spm, target.spm and vocab.json (the
    pieces of both models, then </s>, <unk>, <pad> where HF's MarianTokenizer expects them)."""
    import json

    import sentencepiece as spm

    src_text = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball im Park."] * 40
    tgt_text = ["A dog runs across the meadow.", "Two men play football in the park."] * 40
    for name, text in (("source", src_text), ("target", tgt_text)):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(text),
            model_prefix=str(folder / name),
            vocab_size=40,
            model_type="unigram",
            minloglevel=2,
            hard_vocab_limit=False,
        )
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
    pieces: list[str] = ["</s>", "<unk>"]
    for name in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        pieces += [
            sp.id_to_piece(i)
            for i in range(sp.get_piece_size())
            if sp.id_to_piece(i) not in pieces and i > 2
        ]
    pieces.append("<pad>")
    vocab = {p: i for i, p in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    hf = marian(
        vocab_size=len(vocab),
        pad_token_id=len(vocab) - 1,
        decoder_start_token_id=len(vocab) - 1,
        forced_eos_token_id=None,
    )
    hf.save_pretrained(folder)
    return hf, vocab


def _their_tokenizer(folder):  # type: ignore[no-untyped-def]
    """HF's MarianTokenizer over the folder's two SentencePiece models and vocabulary."""
    return transformers.MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
    )


def test_an_opus_mt_folder_tokenizes_and_translates_as_hf(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Marian's tokenizer (two SentencePiece models, one vocabulary) gives HF's MarianTokenizer
    ids and text; `translate` (greedy) on the folder gives HF generate's translation."""
    from aiayn.checkpoint import load
    from aiayn.data.tokenizer import MarianTokenizer, load_tokenizer
    from aiayn.generate.translate import translate

    hf, vocab = _marian_folder(tmp_path)
    theirs = _their_tokenizer(tmp_path)
    bundle = load(tmp_path)
    ours = bundle.tokenizer
    assert isinstance(ours, MarianTokenizer)
    lines = ["Ein Hund läuft über die Wiese.", "Zwei Männer, ß!"]
    for line in lines:
        assert ours.encode(line) == theirs(line)["input_ids"]
    ids = [vocab[p] for p in ("▁A", "▁dog") if p in vocab] + [3, 4, vocab["</s>"]]
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    ours.save(tmp_path / "tok.json")
    again = load_tokenizer(tmp_path / "tok.json")
    assert all(again.encode(line) == ours.encode(line) for line in lines)

    got = translate(bundle.model.eval(), ours, lines, beam=None)  # type: ignore[arg-type]
    batch = theirs(lines, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(
            **batch,
            num_beams=1,
            do_sample=False,
            max_new_tokens=39,
            bad_words_ids=[[hf.config.pad_token_id]],
        )
    want = [theirs.decode(row, skip_special_tokens=True).strip() for row in out]
    assert got == want


def test_translation_ends_at_the_folders_own_end_id(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """generation_config.json decides where a translation ends, as in HF's generate: with its
    eos_token_id set to a piece the model produces, translate (library and command) stops
    there too, and the folder's decoder start and padding are read from it."""
    import json

    from aiayn.checkpoint import load
    from aiayn.cli import main
    from aiayn.generate.translate import translate
    from aiayn.interop.generation_config import generation_of

    hf, vocab = _marian_folder(tmp_path)
    theirs = _their_tokenizer(tmp_path)
    line = "Ein Hund läuft über die Wiese."
    batch = theirs([line], return_tensors="pt")
    with torch.no_grad():
        free = hf.generate(
            **batch,
            num_beams=1,
            do_sample=False,
            max_new_tokens=20,
            bad_words_ids=[[hf.config.pad_token_id]],
        )[0, 1:].tolist()
    assert free[0] != 0, free  # it would go on: the untrained model repeats one piece
    stop = free[0]  # that piece made the folder's end id
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": stop}))
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        out = hf.generate(
            **batch,
            num_beams=1,
            do_sample=False,
            max_new_tokens=20,
            bad_words_ids=[[hf.config.pad_token_id]],
        )
    assert out[0, -1] == stop  # HF ended on it; its text is what came before (a real
    want = theirs.decode(out[0, 1:-1], skip_special_tokens=True).strip()  # </s> is not shown)
    bundle = load(tmp_path)
    ids = generation_of(bundle.run)
    assert ids.eos == (stop,) and ids.decoder_start == vocab["<pad>"]
    got = translate(bundle.model.eval(), bundle.tokenizer, [line], beam=None, generation=ids)  # type: ignore[arg-type]
    assert got == [want] and out.shape[1] == 2  # HF stopped at it too: start, end
    ignored = translate(bundle.model, bundle.tokenizer, [line], beam=None)  # type: ignore[arg-type]
    assert ignored != got  # without the folder's end id it runs on
    (tmp_path / "in.txt").write_text(line + "\n")
    args = [
        "translate",
        "--checkpoint",
        str(tmp_path),
        "--input",
        str(tmp_path / "in.txt"),
        "--beam",
        "1",
    ]
    assert main(args) == 0
    assert capsys.readouterr().out == want + "\n"


def test_attention_views_frame_marian_pairs_as_hf_trains_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The attention pictures and the explorer feed a Marian model what HF's training feeds it:
    the source with its </s>, and the decoder input <pad> + the target cut by the *target*
    SentencePiece model (HF's labels shifted right)."""
    from aiayn.checkpoint import load
    from aiayn.inspect.attention_maps import as_trained, attention_maps, encode

    hf, _ = _marian_folder(tmp_path)
    theirs = _their_tokenizer(tmp_path)
    tokenizer = load(tmp_path).tokenizer
    src_text, tgt_text = "Ein Hund läuft.", "A dog runs across the park."
    (src, src_labels), (tgt, tgt_labels) = as_trained(
        tokenizer,  # type: ignore[arg-type]
        encode(tokenizer, src_text, "text"),  # type: ignore[arg-type]
        encode(tokenizer, tgt_text, "target", target=True),  # type: ignore[arg-type]
    )
    batch = theirs(src_text, text_target=tgt_text)
    assert src == batch["input_ids"] and src_labels[-1] == "</s>"
    pad = hf.config.pad_token_id
    assert tgt == [pad, *batch["labels"][:-1]] and tgt_labels[0] == "<pad>"
    assert tgt != [pad, *theirs(tgt_text)["input_ids"][:-1]]  # the source model cuts otherwise
    written = attention_maps(tmp_path, src_text, tmp_path / "maps", target_text=tgt_text)
    assert set(written) == {"encoder", "decoder", "cross"}
    assert all(p.is_file() for p in written.values())
