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

Packed weights are named by integer handles in the Python modules' tables; each handle and its
weight is passed on to the C++ tables (``set_packed``, ``set_int8``), which hold them weakly
as the Python tables do.
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
    _pass_on_known_weights()
    return True


def loaded() -> bool:
    return _STATE.get("loaded") is True


def _pass_on_known_weights() -> None:
    """Hand the weights packed before the library was loaded to its tables."""
    from aiayn.nn import fp32_kernels, int8_kernel

    for handle, packed in fp32_kernels.live_weights():
        set_packed(handle, packed)
    for handle, weight in int8_kernel.live_weights():
        set_int8(handle, weight)


def set_packed(handle: int, packed: torch.Tensor) -> None:
    """Make ``packed`` the fp32 weight that ``handle`` names in C++ too (when loaded)."""
    if loaded():
        from aiayn.nn.cpu_kernels import PACKED_ROW_MULTIPLE

        torch.ops.aiayn._native_set_packed(handle, packed, PACKED_ROW_MULTIPLE)


def set_int8(handle: int, weight: Any) -> None:
    """Make fbgemm's packed ``weight`` the one ``handle`` names in C++ too (when loaded)."""
    if loaded():
        torch.ops.aiayn._native_set_int8(handle, weight)
