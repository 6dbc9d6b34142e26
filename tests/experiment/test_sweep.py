"""The sweep runner: variants on equal work, resumable after a kill, scored, reported; bad
sweep files named."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn.cli import main
from aiayn.experiment import collect, load_sweep, markdown_table, run_variant, write_report
from aiayn.experiment.run import training_flops
from aiayn.inspect.calc import translation_batch_flops
from aiayn.models import build_model
from aiayn.training.translate import train_translation
from tests.conftest import LM_TEXT, LM_TOML, TRANSLATION_TOML, write_corpus

SWEEP = """
[sweep]
title = "tiny"
base = "run.toml"
steps = 4
max_tokens = 64
beam = 2
set = { "train.eval_interval" = 2, "train.checkpoint_interval" = 2, "train.keep_snapshots" = 0 }

[[variant]]
name = "base"
row = "base"

[[variant]]
name = "A-h1"
row = "A"
set = { "model.attention.n_heads" = 1 }

[[variant]]
name = "X-additive"
row = "seed"
set = { "model.attention.score" = "additive", "model.residual" = false }
"""


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TRANSLATION_TOML)
    (tmp_path / "sweep.toml").write_text(SWEEP)
    return tmp_path / "data", tmp_path / "sweep.toml"


@pytest.mark.slow
def test_sweep_runs_resumes_and_reports(setup: tuple[Path, Path], tmp_path: Path) -> None:
    data, path = setup
    sweep = load_sweep(path)
    out = tmp_path / "out"
    # A variant stopped part-way (as by a kill after its checkpoint at step 2) ...
    assert run_variant(sweep, sweep.variants[0], out, data, progress=False, stop_after=2) is None
    assert collect(sweep, out) == []
    # ... is resumed by the next invocation, which then runs the others.
    code = main(["experiment", str(path), "--out", str(out), "--data", str(data), "--quiet"])
    assert code == 0
    results = collect(sweep, out)
    assert [r["name"] for r in results] == ["base", "A-h1", "X-additive"]
    base = results[0]
    assert base["train_invocations"] == 2  # stopped once, resumed once
    # The resumed variant ends where an uninterrupted run of the same config does.
    straight = train_translation(
        sweep.run_config(sweep.variants[0]), tmp_path / "straight", data, progress=False
    )
    # two runs, each measuring its linear kernel (MKL or oneDNN): fp32 sums in other orders
    assert base["val_loss"] == pytest.approx(straight.val_loss, rel=1e-5)
    # Equal work: the same batches, hence the same target tokens, for every variant.
    assert len({r["train_target_tokens"] for r in results}) == 1
    assert results[1]["model"]["n_heads"] == 1 and results[1]["model"]["d_head"] == 32
    assert results[2]["model"]["attention_score"] == "additive"
    for r in results:
        assert 0 <= r["val_bleu"] <= 100 and 0 <= r["test_bleu"] <= 100
        # exp in fp32 here, in float64 there: fp32's 2^-23 relative, with room
        assert r["val_ppl"] == pytest.approx(torch.tensor(r["val_loss"]).exp().item(), rel=1e-6)
    # Files: JSON, CSV, the table in Table 3's layout, the plot.
    assert json.loads((out / "results.json").read_text())["variants"] == results
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["name"] for r in rows] == ["base", "A-h1", "X-additive"]
    table = (out / "table.md").read_text()
    assert "| A | A-h1 |  |  |  | 1 | 32 | 32 |" in table  # only what differs from the base
    assert "additive scores, no residual" in table
    assert (out / "plot.png").stat().st_size > 1000
    # Run again: everything is done, nothing retrains.
    before = (out / "runs" / "base" / "timing.json").read_text()
    assert main(["experiment", str(path), "--out", str(out), "--data", str(data), "--quiet"]) == 0
    assert (out / "runs" / "base" / "timing.json").read_text() == before
    # A variant changed after it ran is named, not mixed.
    path.write_text(SWEEP.replace('"model.attention.n_heads" = 1', '"model.attention.n_heads" = 2'))
    with pytest.raises(ValueError, match="variant 'A-h1' was run with other settings"):
        run_variant(load_sweep(path), load_sweep(path).variant("A-h1"), out, data, progress=False)
    assert write_report(sweep, results, out)


def test_flops_equal_torch_flop_counter(setup: tuple[Path, Path]) -> None:
    """The analytic count of one training batch equals what torch.utils.flop_counter counts
    for a forward and backward pass of the model (plain matmul attention, so that every
    multiply is a counted op; the plain cross entropy: aiayn's chunked one recomputes the
    logits in its backward pass, work the model-FLOPs convention does not count)."""
    from torch.utils.flop_counter import FlopCounterMode

    data, path = setup
    sweep = load_sweep(path)
    config = sweep.run_config(sweep.variants[0]).model.replace(
        vocab_size=300, pad_id=0, attention={"backend": "reference"}, dropout=0.0
    )
    model = build_model(config)
    src, tgt = torch.randint(1, 300, (3, 7)), torch.randint(1, 300, (3, 5))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.flatten()).backward()
    assert counter.get_total_flops() == translation_batch_flops(config, 3, 7, 5)
    flops, tokens = training_flops(
        sweep.run_config(sweep.variants[0]), config, _tokenizer(data, sweep), data
    )
    assert flops > 0 and tokens > 0


def _tokenizer(data: Path, sweep: object) -> object:
    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.training.translate import load_pairs

    run = sweep.run_config(sweep.variants[0])  # type: ignore[attr-defined]
    pairs = load_pairs(run, data, "train")
    return BPETokenizer.from_lines([p.source for p in pairs] + [p.target for p in pairs], 300)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            "steps = 4",
            "steps = 0",
        ),
        ('name = "A-h1"', "name = 'A h1' is invalid"),
        ('"model.attention.n_heads" = 1', "'train.max_tokens' may not vary"),
        ('"model.attention.n_heads" = 1', "variant 'A-h1': .*ModelConfig.d_model=32 is invalid"),
        ('name = "X-additive"', "the name 'base' is used twice"),
        ('base = "run.toml"', "base config .*missing.toml does not exist"),
    ],
)
def test_bad_sweep_files_are_named(setup: tuple[Path, Path], edit: str, message: str) -> None:
    _, path = setup
    replacement = {
        "steps = 0": "steps = 0",
        "name = 'A h1' is invalid": 'name = "A h1"',
        "'train.max_tokens' may not vary": '"train.max_tokens" = 9',
        "variant 'A-h1': .*ModelConfig.d_model=32 is invalid": '"model.attention.n_heads" = 3',
        "the name 'base' is used twice": 'name = "base"',
        "base config .*missing.toml does not exist": 'base = "missing.toml"',
    }[message]
    path.write_text(SWEEP.replace(edit, replacement, 1))
    with pytest.raises(ValueError, match=message):
        load_sweep(path)


LM_SWEEP = """
[sweep]
title = "tiny scaling"
base = "lm.toml"
steps = 6
plot = "scaling"
set = { "model.dropout" = 0.0 }

[[variant]]
name = "small"
set = { "model.n_layers" = 1, "model.d_model" = 16, "model.attention.n_heads" = 2, "model.ffn.d_ff" = 32 }

[[variant]]
name = "mid"

[[variant]]
name = "large"
set = { "model.n_layers" = 3, "model.d_model" = 48, "model.ffn.d_ff" = 96 }
"""


@pytest.mark.slow
def test_language_model_sweep_fits_power_laws(tmp_path: Path) -> None:
    """A decoder-only sweep: scored by validation loss, FLOPs from the fixed batch shape, and
    a scaling report whose power laws are the least-squares lines of the log-log points."""
    import math

    import numpy as np

    from aiayn.checkpoint import read_config
    from aiayn.experiment import run_sweep
    from aiayn.experiment.report import scaling_fits
    from aiayn.inspect.calc import training_flops_per_token

    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "lm.toml").write_text(LM_TOML)
    (tmp_path / "sweep.toml").write_text(LM_SWEEP)
    sweep = load_sweep(tmp_path / "sweep.toml")
    results = run_sweep(sweep, tmp_path / "out", tmp_path, progress=False, say=lambda _: None)
    assert [r["name"] for r in results] == ["small", "mid", "large"]
    sizes = [r["params_non_embedding"] for r in results]
    assert sizes == sorted(sizes) and "val_bleu" not in results[0]
    for r in results:
        config = read_config(tmp_path / "out" / "runs" / r["name"] / "checkpoint")
        assert r["train_tokens"] == 6 * 4 * 16
        assert r["train_flops"] == training_flops_per_token(config, 16) * 6 * 4 * 16
        assert math.isfinite(r["val_loss"])
    fits = scaling_fits(results)
    x = np.log([r["params_non_embedding"] for r in results])
    y = np.log([r["val_loss"] for r in results])
    slope = np.polyfit(x, y, 1)[0]
    assert fits["params_non_embedding"]["alpha"] == pytest.approx(-slope)
    paths = write_report(sweep, results, tmp_path / "out")
    assert (tmp_path / "out" / "plot.png").stat().st_size > 1000 and len(paths) == 4
    assert "power_laws" in json.loads((tmp_path / "out" / "results.json").read_text())
    assert "| val loss |" in (tmp_path / "out" / "table.md").read_text()


@pytest.mark.slow
def test_a_changed_sweep_or_a_run_killed_before_its_checkpoint(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """A finished variant whose sweep-level settings changed is named, not reused; a variant
    killed before its first checkpoint (only a log left) starts over."""
    data, path = setup
    sweep = load_sweep(path)
    out = tmp_path / "out"
    assert run_variant(sweep, sweep.variants[0], out, data, progress=False) is not None
    path.write_text(SWEEP.replace("steps = 4", "steps = 6"))
    changed = load_sweep(path)
    with pytest.raises(ValueError, match="variant 'base'.*other \\[train\\] settings"):
        run_variant(changed, changed.variants[0], out, data, progress=False)
    stale = out / "runs" / "A-h1"
    stale.mkdir(parents=True)
    (stale / "log.csv").write_text("step,loss,lr,val_loss,tokens_per_s,grad_norm\n1,5.0,0.1,,10,\n")
    result = run_variant(sweep, sweep.variant("A-h1"), out, data, progress=False)
    assert result is not None and result["train_invocations"] == 1


def test_report_with_a_diverged_base_and_bad_flags(setup: tuple[Path, Path]) -> None:
    _, path = setup
    sweep = load_sweep(path)
    diverged = {"name": "base", "row": "base", "note": "", "overrides": {}, "diverged": "nan"}
    assert "diverged" in markdown_table(sweep, [diverged])
    path.write_text(SWEEP.replace("beam = 2", 'beam = 2\ntest = "false"'))
    with pytest.raises(ValueError, match="test = 'false' is invalid: expected true or false"):
        load_sweep(path)


def test_a_run_saved_before_a_setting_existed_is_the_same_run(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run.json written before a setting was added lacks it; the run used its default, so it
    is the same run (a release adding a setting must not orphan a sweep)."""
    from aiayn.checkpoint import RunDir
    from aiayn.experiment.run import _check_same_config

    data, path = setup
    sweep = load_sweep(path)
    out = tmp_path / "out"
    run_variant(sweep, sweep.variants[0], out, data, progress=False)
    latest = RunDir(out / "runs" / "base").latest()
    assert latest is not None
    run_json = json.loads((latest / "run.json").read_text())
    del run_json["train"]["checkpoint_format"], run_json["model"]["mixer"]  # as an older aiayn
    (latest / "run.json").write_text(json.dumps(run_json))
    (latest / "manifest.json").unlink()  # the edit would fail the checksum, as it should
    _check_same_config(out / "runs" / "base", sweep.run_config(sweep.variants[0]), "base")
    run_json["train"]["label_smoothing"] = 0.3
    (latest / "run.json").write_text(json.dumps(run_json))
    with pytest.raises(ValueError, match=r"other \[train\] settings \(label_smoothing\)"):
        _check_same_config(out / "runs" / "base", sweep.run_config(sweep.variants[0]), "base")


@pytest.mark.slow
def test_a_killed_invocation_counts_up_to_its_last_checkpoint(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """A sweep killed outright (no chance to write its time) still has its kept training time
    counted, from the start it put on record to its last checkpoint."""
    from aiayn.checkpoint import RunDir
    from aiayn.experiment.run import OPEN_FILE

    data, path = setup
    sweep = load_sweep(path)
    out, variant = tmp_path / "out", sweep.variants[0]
    assert run_variant(sweep, variant, out, data, progress=False, stop_after=2) is None
    folder = out / "runs" / "base"
    assert not (folder / OPEN_FILE).exists()  # an invocation that ended closed its record
    # Now as if a second invocation had started 100 s before that checkpoint and been killed.
    latest = RunDir(folder).latest()
    assert latest is not None
    (folder / OPEN_FILE).write_text(json.dumps({"started": latest.stat().st_mtime - 100.0}))
    result = run_variant(sweep, variant, out, data, progress=False)
    assert result is not None and result["train_invocations"] == 3
    timing = json.loads((folder / "timing.json").read_text())
    assert timing[1] == pytest.approx(100.0, abs=0.01)  # mtimes are exact to a microsecond
    assert not (folder / OPEN_FILE).exists()


@pytest.mark.slow
def test_only_runs_the_named_variants_and_report_only_trains_nothing(
    setup: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aiayn experiment --only NAME`` trains that variant alone; ``--report-only`` writes the
    report of what is done and trains nothing, and with nothing done says so (exit 2)."""
    data, path = setup
    path.write_text(SWEEP.replace("beam = 2", "beam = 0\ntest = false\nval_limit = 1"))  # quick
    out = tmp_path / "out"
    base = ["experiment", str(path), "--out", str(out), "--data", str(data), "--quiet"]
    assert main([*base, "--report-only"]) == 2
    err = capsys.readouterr().err
    assert f"nothing to report in {out}: no variant of {path} has finished there" in err
    assert main([*base, "--only", "A-h1"]) == 0
    assert [r["name"] for r in collect(load_sweep(path), out)] == ["A-h1"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["A-h1"]  # nothing else began
    capsys.readouterr()
    # --report-only: the report rewritten from what is done, no training, no new folder.
    (out / "table.md").unlink()
    files = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    assert main([*base, "--report-only"]) == 0
    printed = capsys.readouterr().out
    assert "3 variants" not in printed and f"wrote {out / 'table.md'}" in printed
    assert "| A | A-h1 |" in (out / "table.md").read_text()
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()} == files
    # A name the sweep does not have is named, with those it has.
    assert main([*base, "--only", "A-h2"]) == 2
    assert (
        "no variant 'A-h2' in the sweep; it has base, A-h1, X-additive" in capsys.readouterr().err
    )
