"""aiayn's EncoderLM against Hugging Face BERT (BertModel, BertForMaskedLM) with identical
random weights, every LayerNorm, bias and embedding moved off HF's initial values: hidden
states, pooled output and masked-LM logits to 1e-5; round trips exact, name by name."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

from aiayn.interop.bert import from_hf_bert, to_hf_bert
from aiayn.models.encoder import EncoderLM
from tests.interop.support import VOCAB, assert_same_state, bert_config, perturb, wordpiece

# fp32, HF sums in other orders: a 96-term dot moves up to 96 x 2^-24 ~ 6e-6; CPU: <= 6e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}


def bert(kind: str = "BertForMaskedLM", **overrides: object) -> torch.nn.Module:
    """A random HF ``kind`` (BertModel, BertForMaskedLM, ...) in eval mode with every LayerNorm,
    bias and embedding (word, position, token type) moved off its initial value."""
    torch.manual_seed(0)
    model = getattr(transformers, kind)(bert_config(**overrides)).eval()
    return perturb(model, ("LayerNorm", "embeddings"))


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 17), generator=g)
    types = (torch.arange(17) >= 9).long().expand(3, -1).clone()
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[1, 12:] = False  # right padding, as BERT has it
    mask[2, 5:] = False
    ids[~mask] = 0
    return ids, types, mask


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_masked_lm_logits_equal_hf(act: str) -> None:
    hf = bert(hidden_act=act)
    ours = from_hf_bert(hf).eval()
    assert isinstance(ours, EncoderLM) and ours.pooler is None and ours.head is not None
    ids, types, mask = inputs()
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(got[mask], want[mask], **TOL)
    back = to_hf_bert(ours).eval()
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")


def test_bert_model_hidden_states_and_pooler_equal_hf() -> None:
    hf = bert("BertModel")
    ours = from_hf_bert(hf).eval()
    assert ours.head is None and ours.pooler is not None
    ids, types, mask = inputs()
    with torch.no_grad():
        out = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long())
        hidden = ours.encode(ids, attention_mask=mask, token_type_ids=types)
        pooled = ours.pool(hidden)
    torch.testing.assert_close(hidden[mask], out.last_hidden_state[mask], **TOL)
    torch.testing.assert_close(pooled, out.pooler_output, **TOL)
    with torch.no_grad():  # no token types given: type 0 everywhere, as HF takes it
        torch.testing.assert_close(
            ours.encode(ids, attention_mask=mask)[mask],
            hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state[mask],
            **TOL,
        )
    with pytest.raises(ValueError, match="no masked-LM head"):
        ours(ids)
    back = to_hf_bert(ours)
    assert type(back).__name__ == "BertModel"
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")


def test_what_cannot_be_converted_is_named() -> None:
    with pytest.raises(ValueError, match="position_embedding_type"):
        from_hf_bert(transformers.BertModel(bert_config(position_embedding_type="relative_key")))
    with pytest.raises(ValueError, match="BertForNextSentencePrediction cannot be converted"):
        from_hf_bert(transformers.BertForNextSentencePrediction(bert_config()))
    ours = from_hf_bert(transformers.BertModel(bert_config()))
    with pytest.raises(ValueError, match="token_type_ids"):
        ours.encode(torch.ones(1, 4, dtype=torch.long), token_type_ids=torch.full((1, 4), 2))


def test_bert_folders_load_with_their_tokenizer_and_write_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A BertForPreTraining folder (encoder, pooler, masked-LM head and a next-sentence head,
    as bert-base-uncased is saved) loads with pooler and head; text -> ids equals HF's fast
    tokenizer; our BERT written as a folder is read back by HF's from_pretrained."""
    from aiayn.interop.hf_folder import load_hf_folder, save_hf_folder
    from aiayn.interop.hf_tokenizer import load_hf_tokenizer

    hf = bert("BertForPreTraining")
    hf.save_pretrained(tmp_path / "hf")
    wordpiece(tmp_path / "hf")
    ours = load_hf_folder(tmp_path / "hf")
    assert isinstance(ours, EncoderLM) and ours.pooler is not None and ours.head is not None
    tok = load_hf_tokenizer(tmp_path / "hf")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "hf" / "tokenizer.json")
    )
    sample = ["Ein Hund läuft über die Wiese.", "A DOG runs!", "Le chien court, 2 Männer."]
    for text in sample:
        assert tok.encode(text) == fast(text)["input_ids"]
    ids = torch.tensor([tok.encode(sample[0])])
    with torch.no_grad():
        out = hf(input_ids=ids)
        hidden = ours.encode(ids)
        torch.testing.assert_close(ours(ids), out.prediction_logits, **TOL)
        torch.testing.assert_close(ours.pool(hidden), hf.bert(input_ids=ids).pooler_output, **TOL)
    # Written back (BertForMaskedLM layout, pooler kept under bert.pooler): HF reads it.
    save_hf_folder(ours, tmp_path / "back", "bert")
    again = transformers.BertForMaskedLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, out.prediction_logits, **TOL)
    assert torch.equal(load_hf_folder(tmp_path / "back").pooler.weight, ours.pooler.weight)  # type: ignore[union-attr]


def test_embed_and_fill_mask_on_an_hf_folder_equal_hf(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`aiayn embed` and `aiayn fill-mask` read an HF BERT folder in place.  Embeddings equal
    sentence-transformers' recipe computed from HF's BertModel (mean over real tokens,
    normalised); fill-mask equals HF's fill-mask pipeline (ids and probabilities)."""
    import json

    import numpy as np

    from aiayn.cli import main

    hf = bert()
    hf.save_pretrained(tmp_path / "hf")
    wordpiece(tmp_path / "hf")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"),
        mask_token="[MASK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
    )
    texts = ["Ein Hund läuft über die Wiese.", "A dog runs.", "Le chien court dans le pré."]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    args = ["embed", "--checkpoint", str(tmp_path / "hf"), "--file", str(tmp_path / "texts.txt")]
    assert main([*args, "--out", str(tmp_path / "e.npy"), "--batch-size", "2"]) == 0
    got = torch.from_numpy(np.load(tmp_path / "e.npy"))
    batch = fast(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf.bert(**batch).last_hidden_state  # (B, T, C)
    m = batch["attention_mask"][..., None].float()
    want = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)
    torch.testing.assert_close(got, want, **TOL)
    assert main([*args, "--out", str(tmp_path / "e.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == texts
    # JSON keeps 7 decimals (<= 5e-8) of unit-vector parts, plus fp32 noise; CPU: 5.2e-8
    torch.testing.assert_close(
        torch.tensor([r["embedding"] for r in rows]), want, atol=1e-6, rtol=0
    )

    text = "Ein [MASK] läuft über die [MASK]."
    capsys.readouterr()
    assert (
        main(["fill-mask", text, "--checkpoint", str(tmp_path / "hf"), "--top-k", "4", "--json"])
        == 0
    )
    ours = json.loads(capsys.readouterr().out)
    pipe = transformers.pipeline("fill-mask", model=hf, tokenizer=fast, top_k=4)
    theirs = pipe(text)
    assert len(ours) == len(theirs) == 2
    for mine, ref in zip(ours, theirs, strict=True):
        assert [g["id"] for g in mine] == [r["token"] for r in ref]
        # probabilities (<= 1) in fp32, other sum orders: TOL's atol; CPU: 0
        np.testing.assert_allclose([g["score"] for g in mine], [r["score"] for r in ref], atol=1e-5)
    with pytest.raises(ValueError, match="no mask token"):
        from aiayn.checkpoint import load
        from aiayn.generate.encoder import fill_mask

        bundle = load(tmp_path / "hf")
        fill_mask(bundle.model, bundle.tokenizer, "no mask here")  # type: ignore[arg-type]


def test_layernorm_gamma_and_beta_names_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Checkpoints converted from TensorFlow (bert-base-uncased) store LayerNorm.gamma/beta."""
    from safetensors.torch import save_file

    from aiayn.interop.hf_folder import load_hf_folder

    hf = bert()
    folder = tmp_path / "tf-names"
    folder.mkdir()
    hf.config.save_pretrained(folder)
    old = {}
    for n, t in hf.state_dict().items():
        n = n.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
        old[n] = t.contiguous()
    for tied in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
        old.pop(tied, None)  # shared with the word embeddings and cls.predictions.bias
    assert "bert.embeddings.LayerNorm.gamma" in old
    save_file(old, str(folder / "model.safetensors"))
    ids, types, mask = inputs()
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=types, attention_mask=mask.long()).logits
        got = load_hf_folder(folder)(ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(got[mask], want[mask], **TOL)


def test_truncated_texts_keep_their_sep_as_hf_truncates(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from aiayn.checkpoint import load
    from aiayn.generate.encoder import sentence_embeddings

    hf = bert("BertModel", max_position_embeddings=12)
    hf.save_pretrained(tmp_path / "hf")
    wordpiece(tmp_path / "hf")
    bundle = load(tmp_path / "hf")
    text = "Ein Hund läuft über die Wiese und zwei Männer spielen Fußball im Park."
    with pytest.raises(ValueError, match="at most 12"):
        sentence_embeddings(bundle.model, bundle.tokenizer, [text])  # type: ignore[arg-type]
    got = sentence_embeddings(bundle.model, bundle.tokenizer, [text], truncate=True)  # type: ignore[arg-type]
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "hf" / "tokenizer.json")
    )
    batch = fast([text], truncation=True, max_length=12, return_tensors="pt")
    assert fast.convert_ids_to_tokens(batch["input_ids"][0])[-1] == "[SEP]"
    with torch.no_grad():
        hidden = hf(**batch).last_hidden_state
    want = torch.nn.functional.normalize(hidden.mean(1), dim=-1)
    torch.testing.assert_close(got, want, **TOL)
