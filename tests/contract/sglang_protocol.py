"""SGLang's own OpenAI protocol models, loaded from the pinned wheel without torch, CUDA or SGLang's dependencies.

The wheel (tests/fixtures/sglang/sglang-pin.txt) is installed `--no-deps` into `$VENV/sglang-protocol` by
scripts/install_sglang_protocol.sh, outside site-packages: `import sglang` keeps failing in the venv (so
`cascade deploy` still reports a missing SGLang). What is loaded from it, unmodified:

- `sglang/srt/entrypoints/openai/protocol.py` (the pydantic request/response models of the chat route). It
  needs pydantic, msgspec and `openai.types` (the Responses API models it reuses; the `openai` SDK of the dev
  extra has them), and tries `xgrammar`, falling back to `Any` when it is missing, as SGLang itself does.
- `sglang/srt/entrypoints/openai/sse_utils.py` (the msgspec encoder of the chat route's text chunks; msgspec only)
  and `usage_processor.py` (how the route fills `usage`; protocol.py only).
- `sglang/srt/sampling/sampling_params.py` on its own (`load_sampling_params`: the ranges its `verify` refuses; it
  needs torch, which the venv has for the embedded engine).

Two modules are stood in for while they load, and removed from `sys.modules` afterwards:

- `sglang`: its `__init__` imports the frontend language and Hugging Face patches (torch, transformers). The
  stand-in is a bare package whose `__path__` is the wheel's `sglang/` directory, so the submodules above are
  SGLang's files, found by the ordinary import system (`srt`, `entrypoints`, `openai` are namespace packages).
- `sglang.utils`: imports IPython, requests and pybase64 at its top, for one function protocol.py uses
  (`convert_json_schema_to_str`, in `to_sampling_params`). The stand-in holds that function compiled from the
  wheel's own `utils.py` source (found by name with `ast`), so it is still SGLang's code.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import types
import typing
from pathlib import Path

import pydantic

ROOT = Path(__file__).parents[2]
PIN_FILE = ROOT / "tests" / "fixtures" / "sglang" / "sglang-pin.txt"
INSTALL = "scripts/install_sglang_protocol.sh"


def pinned() -> str:
    """The pinned requirement, e.g. `sglang==0.5.23`."""
    lines = [line.strip() for line in PIN_FILE.read_text().splitlines()]
    return next(line for line in lines if line.startswith("sglang=="))


def install_dir() -> Path:
    """Where scripts/install_sglang_protocol.sh puts the wheel for the venv running the tests."""
    return Path(sys.prefix) / "sglang-protocol"


def missing() -> str | None:
    """Why the pinned wheel cannot be loaded (not installed, or another version), else None."""
    stamp = install_dir() / ".pin"
    if not stamp.is_file():
        return f"{pinned()} is not installed in {install_dir()}: run {INSTALL}"
    if stamp.read_text().strip() != pinned():
        return f"{install_dir()} holds {stamp.read_text().strip()}, the pin is {pinned()}: run {INSTALL}"
    return None


class SGLangProtocol(typing.NamedTuple):
    protocol: types.ModuleType  # sglang.srt.entrypoints.openai.protocol
    sse_utils: types.ModuleType  # sglang.srt.entrypoints.openai.sse_utils
    usage_processor: types.ModuleType  # sglang.srt.entrypoints.openai.usage_processor
    version: str


def load() -> SGLangProtocol:
    protocol, sse_utils, usage_processor = _imported(
        "sglang.srt.entrypoints.openai.protocol", "sglang.srt.entrypoints.openai.sse_utils",
        "sglang.srt.entrypoints.openai.usage_processor", built="sglang.srt.entrypoints.openai.protocol")
    return SGLangProtocol(protocol, sse_utils, usage_processor, pinned().partition("==")[2])


def load_sampling_params() -> types.ModuleType:
    """`sglang/srt/sampling/sampling_params.py`: `SamplingParams.verify`, the ranges SGLang refuses a request past,
    and `MAX_STOP_COUNT`. It imports torch (its watermarking module), so only the tests of those bounds load it."""
    (module,) = _imported("sglang.srt.sampling.sampling_params")
    return module


def _imported(*names: str, built: str = "") -> list[types.ModuleType]:
    """The wheel's modules `names`, imported under the stand-ins, every sglang module removed from `sys.modules`
    after; the pydantic models of module `built` are built while it is importable."""
    if (why := missing()) is not None:
        raise RuntimeError(why)
    package = install_dir() / "sglang"
    stand_ins = {"sglang": _bare_package(package), "sglang.utils": _utils(package / "utils.py")}
    clashing = [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]
    if clashing:
        raise RuntimeError(f"sglang modules are already imported ({', '.join(sorted(clashing))})")
    sys.modules.update(stand_ins)
    try:
        modules = [importlib.import_module(name) for name in names]
        if built:
            # Built now, while their module is importable (pydantic resolves a postponed model through it).
            for model in vars(sys.modules[built]).values():
                if (isinstance(model, type) and issubclass(model, pydantic.BaseModel)
                        and model.__module__ == built and not model.__pydantic_complete__):
                    model.model_rebuild()
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
    return modules


def _bare_package(path: Path) -> types.ModuleType:
    module = types.ModuleType("sglang")
    module.__path__ = [str(path)]
    module.__file__ = None
    return module


def _utils(path: Path) -> types.ModuleType:
    tree = ast.parse(path.read_text(), str(path))
    functions = [node for node in tree.body
                 if isinstance(node, ast.FunctionDef) and node.name == "convert_json_schema_to_str"]
    if len(functions) != 1:
        raise RuntimeError(f"{path} no longer defines convert_json_schema_to_str: update {__file__}")
    module = types.ModuleType("sglang.utils")
    # What the function's body and annotations name from sglang/utils.py's imports.
    module.__dict__.update(json=json, BaseModel=pydantic.BaseModel, Union=typing.Union, Type=type)
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module
