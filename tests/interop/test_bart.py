"""aiayn's EncoderDecoder against Hugging Face BartForConditionalGeneration with identical
random weights: logits to 1e-5 over a full pass with source padding and over cached decoding;
the round trip is exact; folders load and are read back by HF."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

from aiayn.interop.bart import from_hf_bart, to_hf_bart
from aiayn.models.encoder_decoder import EncoderDecoder
from tests.interop.support import assert_same_state, perturbed_seq2seq

# fp32, HF sums in other orders: a 48-term dot moves up to 48 x 2^-24 ~ 3e-6; CPU: <= 2.4e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB, PAD, EOS = 57, 1, 2


def bart(**overrides: object) -> torch.nn.Module:
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
        "bos_token_id": 0,
        "eos_token_id": EOS,
        "decoder_start_token_id": EOS,
        "forced_eos_token_id": None,
        "dropout": 0.0,
        "attention.dropout": 0.0,
        "activation_dropout": 0.0,
    }
    kwargs.update(overrides)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**kwargs)).eval()
    return perturbed_seq2seq(model)


def read_rows(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state without rows 0 and 1 of the position tables, which BART never reads
    (its offset of 2)."""
    return {n: t[2:] if "embed_positions" in n else t for n, t in model.state_dict().items()}


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, VOCAB, (3, 11), generator=g)
    keep = torch.ones(3, 11, dtype=torch.bool)
    keep[1, 7:] = False  # BART pads on the right
    src[~keep] = PAD
    tgt = torch.cat([torch.full((3, 1), EOS), torch.randint(3, VOCAB, (3, 8), generator=g)], 1)
    return src, keep, tgt


@pytest.mark.parametrize(
    "overrides", [{}, {"activation_function": "relu", "scale_embedding": True}]
)
def test_logits_and_cached_decoding_equal_hf(overrides: dict) -> None:
    hf = bart(**overrides)
    ours = from_hf_bart(hf).eval()
    assert isinstance(ours, EncoderDecoder) and ours.config.embedding_norm
    src, keep, tgt = batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
        got = ours(src, tgt, src_mask=keep)
        torch.testing.assert_close(got, want, **TOL)
        memory, src_keep = ours.encode(src, keep)
        cache = ours.new_cache(3, tgt.shape[1])
        steps = [ours.decode(tgt[:, :2], memory, src_keep, cache=cache)]
        steps += [ours.decode(tgt[:, i : i + 1], None, cache=cache) for i in range(2, tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)
    back = to_hf_bart(ours).eval()
    assert_same_state(read_rows(back), read_rows(hf), "HF -> aiayn -> HF")
    assert_same_state(from_hf_bart(back).state_dict(), ours.state_dict(), "aiayn -> HF -> aiayn")


def test_greedy_decoding_equals_hf_generate() -> None:
    """aiayn's greedy decoding from BART's start token (EOS) equals HF's generate."""
    from aiayn.generate.beam import greedy_decode

    hf = bart()
    ours = from_hf_bart(hf).eval()
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
    got = greedy_decode(ours, src, bos=EOS, eos=-1, max_extra=1, never=(EOS,))
    assert want[:, 1:].tolist() == [row[:11] for row in got]


def test_bart_folders_load_and_are_read_back_by_hf(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A folder as HF saves it (offset position tables, tied copies) loads logit for logit;
    ours written back is read by HF's from_pretrained; a wrong table is named."""
    from safetensors.torch import load_file, save_file

    from aiayn.interop.hf_folder import load_hf_folder, save_hf_folder

    hf = bart()
    src, keep, tgt = batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf_folder(tmp_path / "hf")
    assert isinstance(ours, EncoderDecoder)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt, src_mask=keep), want, **TOL)
    save_hf_folder(ours, tmp_path / "back", "bart")
    again = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        got = again(input_ids=src, attention_mask=keep.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, want, **TOL)
    state = load_file(str(tmp_path / "back" / "model.safetensors"))
    state["model.decoder.embed_positions.weight"] = state["model.decoder.embed_positions.weight"][
        1:
    ]
    save_file(state, str(tmp_path / "back" / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"decoder.embed_positions.weight\[2:\]: 39 rows filled, expected 40"
    ):
        load_hf_folder(tmp_path / "back")


def test_translate_refuses_a_tokenizer_with_other_special_ids() -> None:
    """BART's tokenizer has <s>=0, <pad>=1, </s>=2: translate() names the mismatch rather than
    decode from the wrong start token."""
    from tokenizers import Tokenizer, models

    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.generate.translate import translate

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a": 4}
    tok = BPETokenizer(Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")))
    ours = from_hf_bart(bart())
    with pytest.raises(ValueError, match="id 0 is '<s>', where translation expects '<pad>'"):
        translate(ours, tok, ["a a"])
