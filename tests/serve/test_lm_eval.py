"""lm-evaluation-harness, the real package, against ``aiayn serve``: three local tasks
(tests/data/lm_eval/) -- a log-likelihood multiple choice, a rolling perplexity and a
generation until a stop string -- scored through ``local-completions`` (token-id prompts in
batches, ``echo``, ``logprobs``, the server's own tokenizer through ``/tokenize``), and by
lm-eval's own ``hf`` model on the same GPT-2 folder with transformers, and in process by
``aiayn evaluate --lm-eval`` (aiayn/evaluation/lm_eval.py).  The scores agree:
accuracy and exact match equal, perplexities within 1e-4 relative (fp32 sums of the same
log-probabilities, computed by two implementations)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aiayn.checkpoint import load
from aiayn.cli import main
from aiayn.interop.generation_config import generation_of
from aiayn.serve.app import create_app
from tests.conftest import chat_folder
from tests.serve.support import served

ROOT = Path(__file__).resolve().parents[2]
TASKS = ["aiayn_mc", "aiayn_ppl", "aiayn_gen"]
CONTEXT = 96  # the folder's n_positions


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_folder(tmp_path_factory.mktemp("lm_eval"), eos=None)


def evaluate(
    model: str, model_args: dict[str, Any]
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """lm-eval's scores of :data:`TASKS` for ``model``, and the texts it generated for
    ``aiayn_gen`` (run from the repository root, where the tasks' data paths start)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    local = str(ROOT / "tests" / "data" / "lm_eval")
    manager = TaskManager(include_path=local, include_defaults=False)  # ours alone: 9 s less
    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=TASKS,
        task_manager=manager,
        batch_size=4,
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    assert out is not None
    scores = {
        task: {k.split(",")[0]: v for k, v in values.items() if isinstance(v, float)}
        for task, values in out["results"].items()
    }
    # The generations themselves, not just their score (an untrained model matches no target).
    generated = sorted((s["doc_id"], s["filtered_resps"][0]) for s in out["samples"]["aiayn_gen"])
    return scores, [text for _, text in generated]


def test_local_completions_against_aiayn_serve_equals_lm_evals_hf_model(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    bundle = load(folder)
    app = create_app(
        bundle.model, bundle.tokenizer, name="tiny", generation=generation_of(bundle.run)
    )
    with served(app) as url:
        served_scores, served_texts = evaluate(
            "local-completions",
            {
                "base_url": f"{url}/v1/completions",
                "model": "tiny",
                "tokenizer_backend": "remote",
                "tokenized_requests": True,
                "max_length": CONTEXT,
                "num_concurrent": 1,
                "max_retries": 1,
            },
        )
    hf_args = {
        "pretrained": str(folder),
        "dtype": "float32",
        "max_length": CONTEXT,
        "device": "cpu",
    }
    hf_scores, hf_texts = evaluate("hf", hf_args)
    assert served_scores["aiayn_mc"]["acc"] == hf_scores["aiayn_mc"]["acc"]
    assert served_scores["aiayn_gen"]["exact_match"] == hf_scores["aiayn_gen"]["exact_match"]
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        got, want = served_scores["aiayn_ppl"][metric], hf_scores["aiayn_ppl"][metric]
        assert got == pytest.approx(want, rel=1e-4), metric
    assert served_texts == hf_texts and any(served_texts)
    # The same tasks in process, through the command line and the model class it registers.
    out = folder.parent / "scores.json"
    argv = ["evaluate", "--checkpoint", str(folder), "--lm-eval", ",".join(TASKS)]
    assert main([*argv, "--include-path", "tests/data/lm_eval", "--output", str(out)]) == 0
    here = json.loads(out.read_text())
    assert here["results"]["aiayn_mc"]["acc,none"] == served_scores["aiayn_mc"]["acc"]
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        got = here["results"]["aiayn_ppl"][f"{metric},none"]
        assert got == pytest.approx(served_scores["aiayn_ppl"][metric], rel=1e-4), metric
    assert [r[0] for r in here["responses"]["aiayn_gen"]] == served_texts
