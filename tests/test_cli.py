"""The CLI contract: fast --help without heavy imports, one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cascade.cli import main

HEAVY = ("torch", "litestar", "sklearn", "transformers")
COMMANDS = [[], ["serve"], ["models"], ["models", "prepare"], ["models", "list"], ["fake-server"],
            ["optimize"], ["optimize", "plan"], ["optimize", "allocate"], ["optimize", "drift"], ["deploy"],
            ["router"], ["router", "train"], ["router", "eval"], ["loadgen"], ["label"], ["bench"],
            ["bench", "branches"], ["profile"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "cascade")
def test_help_imports_no_heavy_module(command: list[str]) -> None:
    probe = (
        "import sys\nfrom cascade.cli import main\n"
        f"try:\n    main({[*command, '--help']!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_bad_config_is_one_line_and_exit_2(tmp_path) -> None:
    bad = tmp_path / "cascade.toml"
    bad.write_text('[gateway]\nprot = 1\n[[tiers]]\nname = "a"\nbackends = []\n')
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "serve", "--config", str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key `prot` in `gateway`" in lines[0]


def test_missing_plan_is_one_line_and_exit_2(tmp_path) -> None:
    good = tmp_path / "cascade.toml"
    good.write_text('[[tiers]]\nname = "a"\nbackends = [{ kind = "openai", url = "http://127.0.0.1:9", model = "m" }]\n')
    result = subprocess.run(
        [sys.executable, "-m", "cascade.cli", "serve", "--config", str(good), "--plan", str(tmp_path / "no.json")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot read plan" in result.stderr


def test_several_gateway_processes_need_a_config_without_embedded_workers() -> None:
    result = subprocess.run([sys.executable, "-m", "cascade.cli", "serve", "--processes", "2"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--processes > 1 needs a --config" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--n", "2", "--m", "3"], "`--m` must be between 1 and --n (2)"),
    (["--methods", "vanilla,magic"], "--methods"),
    (["--sweep", "4-2"], "--sweep"),
    (["--rate", "0"], "--rate"),
])
def test_bench_branches_bad_options_are_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["bench", "branches", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_version_names_the_installed_package(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("cascade ")


def test_a_command_whose_extra_is_missing_says_which_pip_install_adds_it_in_one_line(tmp_path) -> None:
    table = tmp_path / "latency.json"
    table.write_text('{"gpus": 2, "tiers": [{"name": "a", "latency_s": {"1": 1.0, "2": 0.5}}]}')
    # A fresh process without highspy, as on a machine with only `make serve`'s extras.
    script = ("import sys; sys.modules['highspy'] = None; from cascade.cli import main; "
              f"sys.exit(main(['optimize', 'allocate', '--table', {str(table)!r}, '--json']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "`highspy`" in done.stderr and "'.[optimizer]'" in done.stderr
