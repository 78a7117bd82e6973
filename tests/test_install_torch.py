"""scripts/install_torch.sh against package indexes built here from tiny stand-in wheels (no network, no real
torch): it takes the `+cpu` build where one exists, takes a plain torch that brings no CUDA package, and where only a
CUDA build exists it installs nothing, says how to get the CPU build in one message and exits 2 (unless told to take
the CUDA build)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import venv
import zipfile
from pathlib import Path

import pip
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_torch.sh"
CUDA_DEP = "nvidia-fake-cublas"


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), cuda: str | None = None) -> None:
    """A pure-Python wheel holding one module named as the package, with torch's `__version__` and `version.cuda`
    (and its metadata): enough for pip to resolve and install, and for the script to read what is installed."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": f"__version__ = {version!r}\n\n\nclass version:\n    cuda = {cuda!r}\n",
        f"{info}/METADATA": "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                                      *(f"Requires-Dist: {r}" for r in requires)]) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def _venv(path: Path) -> Path:
    """A virtualenv whose pip is this interpreter's (a .pth onto pip's folder alone: no torch visible, no ensurepip)."""
    venv.create(path, with_pip=False)
    site = next(path.glob("lib/python3*/site-packages"))
    only_pip = path / "only-pip"  # pip's package alone: its site-packages also holds this interpreter's torch
    only_pip.mkdir()
    (only_pip / "pip").symlink_to(Path(pip.__file__).parent, target_is_directory=True)
    (site / "test_pip.pth").write_text(f"{only_pip}\n")
    return path


def _run(venv_path: Path, wheels: Path, index: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with pip reading no config file: only the stand-in wheels in `wheels` and, as its main index,
    `index` (a local PEP 503 folder; None: no index)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "CASCADE_"))}
    where = {"PIP_INDEX_URL": index.as_uri()} if index else {"PIP_NO_INDEX": "1"}
    clean.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1",
                 **where, **env)
    return subprocess.run(["bash", str(SCRIPT), str(venv_path)], env=clean, capture_output=True, text=True,
                          timeout=120)


def _installed(venv_path: Path) -> dict[str, str]:
    out = subprocess.run([str(venv_path / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                         env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line and line.startswith(("torch",
                                                                                                         "nvidia")))


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, CUDA_DEP, "1.0")
    return folder


def test_the_cpu_build_is_taken_where_one_exists_beside_the_cuda_one(tmp_path: Path, wheels: Path) -> None:
    _wheel(wheels, "torch", "2.13.0", (CUDA_DEP,))
    _wheel(wheels, "torch", "2.13.0+cpu")
    env = _venv(tmp_path / "venv")
    result = _run(env, wheels)
    assert result.returncode == 0, result.stderr
    assert _installed(env) == {"torch": "2.13.0+cpu"}
    again = _run(env, wheels)  # idempotent: a torch 2.13.0 already there is kept
    assert again.returncode == 0 and "installing" not in again.stdout


def test_a_plain_torch_that_brings_no_cuda_package_is_taken(tmp_path: Path, wheels: Path) -> None:
    _wheel(wheels, "torch", "2.13.0")
    env = _venv(tmp_path / "venv")
    result = _run(env, wheels)
    assert result.returncode == 0, result.stderr
    assert _installed(env) == {"torch": "2.13.0"}


def test_only_a_cuda_build_installs_nothing_and_says_how_unless_allowed(tmp_path: Path, wheels: Path) -> None:
    _wheel(wheels, "torch", "2.13.0", (CUDA_DEP,), cuda="13.0")
    env = _venv(tmp_path / "venv")
    refused = _run(env, wheels)
    assert refused.returncode == 2
    message = refused.stderr.strip().splitlines()[-1]
    assert "only a CUDA build of torch==2.13.0" in message and "CASCADE_TORCH_INDEX_URL" in message
    assert "CASCADE_ALLOW_CUDA_TORCH=1" in message
    assert _installed(env) == {}
    allowed = _run(env, wheels, CASCADE_ALLOW_CUDA_TORCH="1")
    assert allowed.returncode == 0, allowed.stderr
    assert _installed(env) == {"torch": "2.13.0", CUDA_DEP: "1.0"}
    kept = _run(env, wheels)  # a CUDA build already there is kept, with a warning
    assert kept.returncode == 0 and "is a CUDA build" in kept.stderr


def test_an_index_given_in_cascade_torch_index_url_is_searched_for_the_cpu_build(tmp_path: Path,
                                                                                  wheels: Path) -> None:
    _wheel(wheels, "torch", "2.13.0", (CUDA_DEP,))
    cpu_index = tmp_path / "cpu-index" / "simple" / "torch"  # a PEP 503 index holding only the CPU build
    cpu_index.mkdir(parents=True)
    _wheel(cpu_index, "torch", "2.13.0+cpu")
    name = "torch-2.13.0+cpu-py3-none-any.whl"
    (cpu_index / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>\n')
    env = _venv(tmp_path / "venv")
    empty = tmp_path / "empty-index" / "simple"
    empty.mkdir(parents=True)
    result = _run(env, wheels, empty, CASCADE_TORCH_INDEX_URL=cpu_index.parent.as_uri())
    assert result.returncode == 0, result.stderr
    assert _installed(env) == {"torch": "2.13.0+cpu"}
