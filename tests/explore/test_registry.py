"""The model list: names only, paths refused, checkpoints found under a runs folder."""

import shutil

import pytest

from aiayn.cli import build_parser
from aiayn.explore.registry import PathNotAllowed, Registry, UnknownModel, default_registry


def test_names_never_paths(registry):
    assert registry.get("tiny-lm").model.config.arch == "decoder"
    for name in ("/etc/passwd", "../tiny-lm", "runs/x", "~root", "..", ".hidden", "a\\b"):
        with pytest.raises(PathNotAllowed, match="path"):
            registry.get(name)
    with pytest.raises(UnknownModel, match="unknown model 'nope'; known: tiny-lm"):
        registry.get("nope")
    with pytest.raises(UnknownModel):
        registry.get(3)


def test_runs_folder_is_scanned_and_named(registry, tmp_path):
    lm = registry.entries["tiny-lm"].directory
    shutil.copytree(lm, tmp_path / "shakespeare" / "checkpoint")
    shutil.copytree(lm, tmp_path / "wmt" / "averaged")
    (tmp_path / "notes").mkdir()
    reg = default_registry(runs=[str(tmp_path)])
    assert list(reg.entries) == ["shakespeare", "wmt:averaged"]
    assert reg.entries["wmt:averaged"].directory == tmp_path / "wmt" / "averaged"
    reg = default_registry(checkpoints=[f"mine={lm}"], preset_names=["gpt2-small"])
    assert list(reg.entries) == ["mine", "gpt2-small:untrained"]


def test_bad_lists_are_refused(registry, tmp_path):
    reg = Registry()
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        reg.add_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="unknown preset"):
        reg.add_preset("gpt-9")
    with pytest.raises(ValueError, match="more than the explorer builds"):
        reg.add_preset("llama3-70b")
    reg.add_checkpoint(registry.entries["tiny-lm"].directory, "a")
    with pytest.raises(ValueError, match="given twice"):
        reg.add_checkpoint(registry.entries["tiny-lm"].directory, "a")
    with pytest.raises(ValueError, match="invalid"):
        reg.add_checkpoint(registry.entries["tiny-lm"].directory, "has space")


def test_loaded_models_are_cached_and_evicted(registry):
    reg = Registry(cache_size=1)
    for name, entry in registry.entries.items():
        reg.entries[name] = entry
    a = reg.get("tiny-lm")
    assert reg.get("tiny-lm") is a and not a.model.training
    reg.get("tiny-mt")
    assert reg.get("tiny-lm") is not a  # evicted, loaded again


def test_cli_defaults():
    args = build_parser().parse_args(["explore"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.max_chars == 400
    args = build_parser().parse_args(
        ["explore", "--checkpoint", "a=runs/x", "--checkpoint", "runs/y", "--preset", "bert-base"]
    )
    assert args.checkpoint == ["a=runs/x", "runs/y"] and args.preset == ["bert-base"]
