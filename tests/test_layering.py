"""The package is layered: a module may import only from its own layer or the ones below.

The layers, bottom to top (docs/ARCHITECTURE.md explains each):

    0 config, registry,     what a model is, the names of its pluggable parts, and where
      device, atomic,       it runs (device, precision, the machine's measured rates);
      errors                folders written so that a crash loses nothing; the exceptions
                            the command line turns into exit codes
    1 nn, data              the mechanism; tokenizers, datasets, batching
    2 models                the three families, built from nn
    3 interop               Hugging Face's folders and weights, family by family
    4 checkpoint            our folders of weights, and the one loader (ours, a run's, HF's)
    5 generate              greedy, sampling, beam search, translation
    6 evaluate              BLEU/chrF, perplexity
    7 train                 the loop, tasks, checkpoints of a run
    8 inspect               figures, calculators, recorded scores
    9 explore, experiment,  the browser explorer; sweeps of training runs (Table 3, scaling);
      serve                 the HTTP generation server
   10 cli                   the command line (and the package's own re-exports)

Every import counts, including those inside functions, and no two packages import each other
(a cycle), even within one layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "aiayn"
LAYERS = {
    "config": 0,
    "registry": 0,
    "device": 0,
    "extras": 0,  # which pip extra brings a missing package (imports nothing of aiayn)
    "errors": 0,  # the exceptions the CLI maps to exit codes (imports nothing)
    "atomic": 0,  # writing a folder so that a crash loses nothing (checkpoints, data shards)
    "nn": 1,
    "data": 1,
    "models": 2,
    "interop": 3,
    "checkpoint": 4,
    "generate": 5,
    "evaluation": 6,
    "training": 7,
    "inspect": 8,
    "explore": 9,
    "experiment": 9,
    "serve": 9,
    "cli": 10,
    "__main__": 10,
    "__init__": 10,  # aiayn/__init__.py: the public API re-exports
}


def unit(parts: tuple[str, ...]) -> str:
    """aiayn.nn.attention -> "nn"; aiayn.config -> "config"; aiayn -> "__init__"."""
    return parts[1].removesuffix(".py") if len(parts) > 1 else "__init__"


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "aiayn"
        ):
            names = node.module.split(".")
            if len(names) == 1:  # from aiayn import registry
                found += [(node.lineno, a.name) for a in node.names]
            else:
                found.append((node.lineno, names[1]))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name.split(".")[1])
                for a in node.names
                if a.name.startswith("aiayn.")
            ]
    return found


def test_every_module_has_a_layer() -> None:
    units = {unit(p.relative_to(ROOT.parent).parts) for p in ROOT.rglob("*.py")}
    assert units <= set(LAYERS), f"give these a layer: {sorted(units - set(LAYERS))}"


def test_no_import_runs_up_the_layers() -> None:
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        here = unit(path.relative_to(ROOT.parent).parts)
        for line, target in imports(path):
            if target in LAYERS and LAYERS[target] > LAYERS[here]:
                violations.append(
                    f"{path.relative_to(ROOT.parent)}:{line} ({here}, layer {LAYERS[here]})"
                    f" imports {target} (layer {LAYERS[target]})"
                )
    assert not violations, "\n".join(violations)


def _unit_imports(root: Path) -> dict[tuple[str, str], str]:
    """(importer, imported) unit pairs of the package at ``root``, each with its first
    place."""
    edges: dict[tuple[str, str], str] = {}
    for path in sorted(root.rglob("*.py")):
        here = unit(path.relative_to(root.parent).parts)
        for line, target in imports(path):
            if target != here:
                edges.setdefault((here, target), f"{path.relative_to(root.parent)}:{line}")
    return edges


def _cycles(edges: dict[tuple[str, str], str]) -> list[str]:
    return [
        f"{a} <-> {b}: {where} and {edges[(b, a)]}"
        for (a, b), where in sorted(edges.items())
        if a < b and (b, a) in edges
    ]


def test_no_two_packages_import_each_other() -> None:
    cycles = _cycles(_unit_imports(ROOT))
    assert not cycles, "\n".join(cycles)


READERS = ("inspect", "explore")


def test_inspect_and_explore_read_runs_without_training() -> None:
    # a run's folder is read through aiayn.config.run, not the training package
    edges = _unit_imports(ROOT)
    assert not [where for (a, b), where in edges.items() if b == "training" and a in READERS]


def test_the_cycle_checker_sees_a_lazy_cycle(tmp_path: Path) -> None:
    for name, body in [("interop", "training"), ("training", "interop")]:
        path = tmp_path / "aiayn" / name / "m.py"
        path.parent.mkdir(parents=True)
        path.write_text(f"def f():\n    from aiayn.{body}.m import f\n")
    assert len(_cycles(_unit_imports(tmp_path / "aiayn"))) == 1


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "aiayn" / "nn" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from aiayn.training.loop import fit\n")
    assert imports(bad) == [(2, "training")]
