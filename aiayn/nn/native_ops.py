"""The decoding products in C++ (aiayn/nn/native/decoding_ops.cpp): built once per machine,
loaded into the process that captures a decoding step.

A captured step (aiayn/generate/captured.py) is C++ that inductor generated, and it calls each
of its products -- ``aiayn::packed_linear`` (fp32, oneDNN) and ``aiayn::int8_dynamic_linear``
(int8, fbgemm) -- through PyTorch's dispatcher.  Their Python implementations make every such
call re-enter the interpreter (take its lock, box the arguments, run a Python function) before
it reaches the kernel; the C++ ones go straight there.  Both run the same kernel on the same
packed weight, so their outputs are equal bit for bit (tests/nn/test_native_ops.py).

The source is compiled as inductor compiles a step: by the C++ compiler inductor uses
(``$CXX``, else ``g++``), against the installed PyTorch's headers and libraries, into the
folder of inductor's own cache (aiayn/generate/captured.py, ``use_inductor_cache``) under a
name that hashes the source, the compiler's version, the flags and PyTorch's version, so a new
PyTorch or a changed source builds again.  The build
takes some ten seconds and happens once per machine; concurrent processes wait on one lock
and a half-written library is never loaded (it is written under a temporary name and
renamed).  Only a process that captures a step loads it (``load``), where the capture itself
costs more.  Without a compiler, or if the build fails, the reason is logged once and the
Python implementations serve the operators as before; ``AIAYN_NATIVE_OPS=off`` chooses them.

Packed weights are named by integer handles, in a ``WeightTable`` per operator; each handle and
its weight is handed on to the operator's C++ table, which holds it weakly as the Python
table does.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "decoding_ops.cpp"
_STATE: dict[str, str | bool] = {}  # "loaded": True once loaded; "why": why not


def compiler() -> str | None:
    """The C++ compiler: ``$CXX`` or ``g++``, where it is on the PATH."""
    return shutil.which(os.environ.get("CXX", "g++"))


def _flags() -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libs = library_paths()
    return [
        "-O2",
        "-std=c++20",
        "-fPIC",
        "-shared",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in include_paths()),
        *(f"-L{p}" for p in libs),
        *(f"-Wl,-rpath,{p}" for p in libs),
        "-lc10",
        "-ltorch_cpu",
    ]


def _library_path(folder: Path, cxx: str, flags: list[str]) -> Path:
    """Where in ``folder`` the build of this source, compiler, flags and PyTorch lives."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), version.stdout.encode(), " ".join(flags).encode()):
        key.update(part)
    key.update(f"{torch.__version__} {torch.version.git_version} {sys.platform}".encode())
    return folder / "aiayn-native" / f"decoding_ops-{key.hexdigest()[:16]}.so"


def _build(cxx: str, flags: list[str], target: Path) -> None:
    """Compile SOURCE into ``target`` unless it is there, holding a lock beside it (so two
    processes build once) and renaming a finished file into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            done = subprocess.run(
                [cxx, str(SOURCE), *flags, "-o", tmp], capture_output=True, text=True
            )
            if done.returncode:
                tail = done.stderr.strip().splitlines()[-3:]
                raise RuntimeError(f"{cxx} exited with {done.returncode}: {' '.join(tail)}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def wanted() -> bool:
    """False when ``AIAYN_NATIVE_OPS`` is ``off`` (or ``0``/``false``/``none``)."""
    setting = os.environ.get("AIAYN_NATIVE_OPS", "on").strip().lower()
    return setting not in ("off", "0", "false", "none")


def load(folder: Path) -> bool:
    """Build into ``folder`` (once per machine) and load the C++ products; True when they
    serve the operators.  Tried once per process: a failure is logged and the Python ones
    serve."""
    if "loaded" in _STATE:
        return bool(_STATE["loaded"])
    if not wanted():
        _STATE.update(loaded=False, why="AIAYN_NATIVE_OPS is off")
        return False
    cxx = compiler()
    try:
        if cxx is None:
            raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX', 'g++')}) on the PATH")
        flags = _flags()
        target = _library_path(folder, cxx, flags)
        _build(cxx, flags, target)
        torch.ops.load_library(str(target))
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        _STATE.update(loaded=False, why=str(err))
        log.warning("the C++ decoding products are not used (%s): the Python ones serve", err)
        return False
    _STATE["loaded"] = True
    for table in _TABLES:
        table.hand_on_all()
    return True


def loaded() -> bool:
    return _STATE.get("loaded") is True


class WeightTable:
    """Packed weights named by integer handles, held weakly (a freed weight leaves its handle
    naming nothing), and handed on to the C++ table that ``setter`` fills -- each weight as
    it is put, and those put before, when the library is loaded."""

    def __init__(self, setter: str, *extra: int) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._setter, self._extra = setter, extra  # extra: the setter's further arguments
        _TABLES.append(self)

    def put(self, handle: int, weight: Any) -> None:
        self._refs[handle] = weakref.ref(weight)
        if loaded():
            self._hand_on(handle, weight)

    def get(self, handle: int) -> Any | None:
        """The weight ``handle`` names, or None (never named, or freed)."""
        ref = self._refs.get(handle)
        return None if ref is None else ref()

    def forget(self, handle: int) -> None:
        self._refs.pop(handle, None)

    def hand_on_all(self) -> None:
        for handle in list(self._refs):
            weight = self.get(handle)
            if weight is not None:
                self._hand_on(handle, weight)

    def _hand_on(self, handle: int, weight: Any) -> None:
        getattr(torch.ops.aiayn, self._setter)(handle, weight, *self._extra)


_TABLES: list[WeightTable] = []
