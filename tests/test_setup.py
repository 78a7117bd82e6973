"""`make serve` on a fresh machine installs what the embedded default imports, and nothing the tests need.

The quickstart's first command installs only `scripts/bootstrap.sh`'s serve extras (Makefile, `install-serve`); CI
runs `make test`, which installs every extra, so a serve path that imports a test-only extra would pass CI and
fail a new user. This loads the embedded default's router in a process where every module that only a non-serve
extra provides cannot be imported.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _serve_extras() -> set[str]:
    recipe = re.search(r"^install-serve:\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None, "Makefile has no install-serve recipe"
    extras = re.search(r"bootstrap\.sh\s+(\S+)", recipe.group(1))
    assert extras is not None, recipe.group(1)
    return set(extras.group(1).split(","))


def _requirements() -> dict[str, set[str]]:
    """Direct requirements by extra ("" for the base), as distribution names, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {extra: {Requirement(line).name.lower().replace("_", "-") for line in lines}
            for extra, lines in groups.items()}


def _modules_only_in(extras: set[str], served: set[str], requirements: dict[str, set[str]]) -> list[str]:
    """Top-level modules of distributions that only extras outside `served` require."""
    allowed = set().union(*(requirements.get(e, set()) for e in served | {""}))
    blocked = set().union(*(requirements.get(e, set()) for e in extras)) - allowed
    modules = []
    for module, dists in metadata.packages_distributions().items():
        if {d.lower().replace("_", "-") for d in dists} <= blocked:
            modules.append(module)
    return sorted(modules)


def test_make_serve_installs_the_router_the_embedded_default_routes_with() -> None:
    from cascade.config.load import load_config
    from cascade.engines.embedded import EMBEDDED_TOML

    config = load_config(EMBEDDED_TOML)
    if config.routing.policy == "learned":
        assert "router" in _serve_extras(), "the embedded default needs scikit-learn/skops: add `router` to install-serve"


def test_the_embedded_defaults_router_loads_without_any_test_only_extra() -> None:
    requirements = _requirements()
    served = _serve_extras()
    blocked = _modules_only_in(set(requirements) - served - {""}, served, requirements)
    assert "matplotlib" in blocked  # the mapping found the packages of a test-only extra
    program = f"""
import sys
BLOCKED = {blocked!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} comes from an extra `make serve` does not install")
sys.meta_path.insert(0, Block())
from cascade.config.load import load_config
from cascade.engines.embedded import EMBEDDED_TOML
from cascade.router.signals import routing_signal
config = load_config(EMBEDDED_TOML)
routing_signal(config.routing, [t.name for t in config.tiers])
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_model_wheel_is_pinned_by_its_sha256_and_none_runs_code_at_interpreter_start() -> None:
    from cascade.engines.models import all_cards

    for card in all_cards():
        assert set(card.wheel_sha256) == set(card.packages), f"{card.name}: a wheel without its sha256"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in card.wheel_sha256.values())
        for pin in card.packages:
            name, version = pin.split("==")
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue  # not installed here (the test extras install them: scripts/bootstrap.sh)
            assert dist.version == version
            # A .pth file runs code at every interpreter start; these wheels are data (and an unused __init__.py).
            assert not [f for f in dist.files or [] if f.suffix == ".pth"], f"{pin} ships a .pth file"
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "--require-hashes" in script and "--only-binary :all:" in script
