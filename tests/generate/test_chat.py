"""Chat with a Hugging Face chat folder: the prompt is the folder's chat template rendered as
transformers renders it, the reply is transformers' greedy ``generate`` up to the folder's
end ids, and ``aiayn chat`` / ``aiayn generate`` stream it in the terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import transformers

from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.chat import Chat, end_ids
from aiayn.interop.generation_config import generation_of
from tests.conftest import chat_folder

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """(a folder whose greedy first reply ends on its third new token, that token's id)."""
    root = tmp_path_factory.mktemp("chat")
    free = chat_folder(root / "free", eos=[])
    bundle = load(free)
    hf = transformers.AutoTokenizer.from_pretrained(str(free))
    ids = hf.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = generate(bundle.model, [list(ids)], max_new_tokens=12, sampling=GREEDY)[0]  # type: ignore[arg-type]
    new = [i for i, t in enumerate(out) if t not in out[:i]]
    assert len(new) >= 3, out
    return chat_folder(root / "ends", eos=[out[new[2]], 0]), out[new[2]]


def reference_reply(folder: Path, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(prompt ids, reply ids without its end token) by transformers alone."""
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder)
    out = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids) :]
    reply = out.tolist()
    ends = set(hf.generation_config.eos_token_id)
    if reply and reply[-1] in ends:
        reply = reply[:-1]
    return ids, reply


def test_two_turns_equal_transformers(folders: tuple[Path, int]) -> None:
    folder, _ = folders
    bundle = load(folder)
    chat = Chat(
        bundle.model,
        bundle.tokenizer,
        generation_of(bundle.run),
        sampling=GREEDY,  # type: ignore[arg-type]
        max_new_tokens=20,
    )
    messages = [{"role": "user", "content": "hello"}]
    for follow_up in ("and the cat?", "café?"):
        ids, reply = reference_reply(folder, messages)
        assert chat.prompt_ids(messages[-1]["content"]) == ids
        text = "".join(chat.reply(messages[-1]["content"]))
        assert text == bundle.tokenizer.decode(reply)
        assert chat.messages[-2:] == [messages[-1], {"role": "assistant", "content": text}]
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]


def test_a_reply_ends_at_the_folders_end_id_or_the_tokenizers_eos(
    folders: tuple[Path, int],
) -> None:
    folder, stop = folders
    bundle = load(folder)
    assert end_ids(bundle.tokenizer, generation_of(bundle.run)) == (stop, 0)  # type: ignore[arg-type]
    _, reply = reference_reply(folder, [{"role": "user", "content": "hello"}])
    assert len(reply) == 2  # it stopped on the third new token, as the fixture chose


def run_cli(
    args: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_aiayn_chat_streams_replies_and_resets(
    folders: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = folders
    bundle = load(folder)
    _, reply = reference_reply(folder, [{"role": "user", "content": "hello"}])
    args = ["chat", "--checkpoint", str(folder), "--temperature", "0", "--max-new-tokens", "20"]
    code, out, err = run_cli(args, "hello\n/reset\nhello\n/exit\n", monkeypatch, capsys)
    assert code == 0, err
    assert out == (bundle.tokenizer.decode(reply) + "\n") * 2


def test_chat_needs_a_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = chat_folder(tmp_path, eos=[0], template=None)
    code, _, err = run_cli(["chat", "--checkpoint", str(folder)], "hi\n", monkeypatch, capsys)
    assert code == 2
    assert "no chat_template" in err


def test_generate_stops_at_the_end_id_without_printing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder ends on the 4th distinct token of the prompt's free greedy run (chosen
    here, so the end id provably comes): generate prints the text before it; --ignore-eos
    prints all 30 tokens."""
    prompt = "hello there"
    bundle = load(chat_folder(tmp_path / "free", eos=[]))
    free = generate(
        bundle.model,
        [bundle.tokenizer.encode(prompt)],
        max_new_tokens=30,  # type: ignore[arg-type]
        sampling=GREEDY,
    )[0]
    new = [i for i, t in enumerate(free) if t not in free[:i]]
    assert len(new) >= 4, free
    folder = chat_folder(tmp_path / "ends", eos=[free[new[3]]])
    args = [
        "generate",
        "--checkpoint",
        str(folder),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-new-tokens",
        "30",
    ]
    _, out, _ = run_cli(args, "", monkeypatch, capsys)
    assert out == prompt + bundle.tokenizer.decode(free[: new[3]]) + "\n"
    _, out, _ = run_cli([*args, "--ignore-eos"], "", monkeypatch, capsys)
    assert out == prompt + bundle.tokenizer.decode(free) + "\n"
