"""Chat templates render as transformers' ``apply_chat_template`` renders them.

The templates are written in the layouts published chat models use (ChatML with tools,
Llama 2's [INST] with a system prompt folded into the first turn and ``raise_exception`` for
a wrong order, Zephyr's, one with ``{% generation %}`` blocks and ``loop`` controls); the
reference is transformers rendering the same template for the same folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from aiayn.interop.chat_template import ChatTemplateError, chat_ids, render_chat
from aiayn.interop.hf_tokenizer import load_hf_tokenizer

CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA2 = """{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}\
{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}\
{% set system_message = false %}{% endif %}{% for message in loop_messages %}\
{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
{% endif %}{% if loop.index0 == 0 and system_message != false %}\
{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}\
{% else %}{% set content = message['content'] %}{% endif %}\
{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}\
{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}\
{% endif %}{% endfor %}"""
ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""
GENERATION = """{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}\
{% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}{% endgeneration %}\
{% else %}U: {{ m.content | trim }}{% endif %}
{% if loop.index >= 4 %}{% break %}{% endif %}{% endfor %}"""

CHAT = [
    {"role": "system", "content": "You are terse. Réponds en français si on te parle français."},
    {"role": "user", "content": "  Bonjour ! Combien font 2+2 ? 🙂"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "東京は？"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b — la somme, 加法",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
        },
    }
]
SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def folder_with(tmp: Path, template: str) -> Path:
    """A byte-level BPE folder whose tokenizer_config.json carries ``template``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([m["content"] for m in CHAT] * 10 + ["user assistant system"], trainer)
    folder = tmp / "chat"
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": template,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


CASES = [
    (CHATML, CHAT, None),
    (CHATML, CHAT, TOOLS),
    (CHATML, CHAT[1:], None),
    (LLAMA2, CHAT, None),
    (LLAMA2, CHAT[1:3], None),
    (ZEPHYR, CHAT, None),
    (GENERATION, [*CHAT, {"role": "tool", "content": "x"}, *CHAT], None),
]


@pytest.mark.parametrize("prompt", [True, False])
@pytest.mark.parametrize(("template", "messages", "tools"), CASES)
def test_rendering_and_ids_equal_apply_chat_template(
    tmp_path: Path, template: str, messages: list[dict[str, str]], tools: object, prompt: bool
) -> None:
    folder = folder_with(tmp_path, template)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = hf.apply_chat_template(
        messages, tools=tools, add_generation_prompt=prompt, tokenize=False
    )
    ours = load_hf_tokenizer(folder)
    got = render_chat(
        template,
        messages,
        add_generation_prompt=prompt,
        special_tokens=ours.special_tokens,
        tools=tools,  # type: ignore[arg-type]
    )
    assert got == want
    if tools is None:
        want_ids = hf.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True)
        if isinstance(want_ids, dict) or hasattr(want_ids, "keys"):
            want_ids = want_ids["input_ids"]
        assert chat_ids(ours, messages, add_generation_prompt=prompt) == list(want_ids)


def test_the_templates_own_errors_and_bad_input_are_named(tmp_path: Path) -> None:
    wrong_order = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(LLAMA2, wrong_order, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        render_chat("{% for m in messages %}", CHAT)
    with pytest.raises(ValueError, match="at least one message"):
        render_chat(CHATML, [])
    with pytest.raises(ValueError, match="message 0 should be a mapping with a 'role'"):
        render_chat(CHATML, [{"content": "no role"}])
    plain = load_hf_tokenizer(folder_with(tmp_path, CHATML))
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        chat_ids(plain, CHAT)


def test_the_sandbox_refuses_python_internals() -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        render_chat(escape, CHAT)
