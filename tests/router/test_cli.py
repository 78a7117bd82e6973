"""`cascade router train` and `cascade router eval --json` end to end on a small CSV (in-process)."""

from __future__ import annotations

import json

import pytest

from cascade.cli import main
from tests.router.conftest import synthetic_outcomes


@pytest.fixture
def csv_path(tmp_path):
    prompts, correct = synthetic_outcomes(n=200, seed=1)
    lines = ["prompt,weak,strong"] + [f'"{p}",{w},{s}' for p, (w, s) in zip(prompts, correct, strict=True)]
    path = tmp_path / "outcomes.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_then_eval_prints_the_contract_keys_and_writes_a_png(tmp_path, csv_path, capsys) -> None:
    router = tmp_path / "router"
    args = ["--outcomes", str(csv_path), "--tiers", "weak,strong"]
    assert main(["router", "train", *args, "--out", str(router), "--train-fraction", "0.5", "--C", "0.1",
                 "--cv-folds", "3", "--json"]) == 0
    train_metrics = json.loads(capsys.readouterr().out)
    assert set(train_metrics) == {"cross_validated", "holdout"}
    assert all(len(report["apgr_ci95"]) == 2 for report in train_metrics.values())
    png = tmp_path / "curve.png"
    assert main(["router", "eval", *args, "--router", str(router), "--holdout", "--plot", str(png), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"n", "apgr", "auc", "ece", "cpt"} <= set(result) and set(result["cpt"]) == {"50", "80", "95"}
    assert result["n"] == 100 and result["apgr"] == train_metrics["holdout"]["apgr"]
    low, high = result["apgr_ci95"]
    assert low < result["apgr"] < high and high - low > 0.05  # 100 prompts: a wide bootstrap interval
    assert result["apgr_ci95"] == train_metrics["holdout"]["apgr_ci95"]  # seeded: the same rows, the same interval
    assert result["in_sample"] is False and png.exists()
    assert result["out_of_domain"] == train_metrics["holdout"]["out_of_domain"] <= 0.05  # same template
    points = {row["name"]: row for row in result["operating_points"]}
    assert list(points) == ["all weak", "all strong", "fast", "balanced", "best", "oracle"]
    assert points["all strong"]["tier_fractions"] == [0.0, 1.0] and points["all weak"]["cost"] == 0.0
    assert points["oracle"]["accuracy"] >= max(row["accuracy"] for row in result["operating_points"])
    assert [row["name"] for row in train_metrics["cross_validated"]["operating_points"]] == list(points)
    # The named points beside the random-route null, in sample and out of fold, in the card and in eval's JSON.
    for null in (result["random_null"], train_metrics["cross_validated"]["random_null"]):
        assert {"draws", "seed", "folds", "resamples", "token_reference", "points"} <= set(null)
        assert null["draws"] == 100 and [p["name"] for p in null["points"]] == ["fast", "balanced", "best"]
        for point in null["points"]:
            for mode in ("in_sample", "out_of_fold"):
                assert set(point[mode]) == {"router", "null", "router_minus_null"}
                assert set(point[mode]["null"]["accuracy"]) == {"mean", "ci95"}
                low, high = point[mode]["router_minus_null"]["accuracy"]["ci95"]
                assert low <= high
    assert result["random_null"]["folds"] == 5 and train_metrics["cross_validated"]["random_null"]["folds"] == 3


def test_eval_with_the_wrong_number_of_tiers_is_one_line_and_exit_2(tmp_path, csv_path, capsys) -> None:
    router = tmp_path / "router"
    assert main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out", str(router),
                 "--C", "0.1", "--cv-folds", "0"]) == 0
    capsys.readouterr()
    code = main(["router", "eval", "--outcomes", str(csv_path), "--tiers", "weak,strong,strong2",
                 "--router", str(router), "--plot", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "has 2 tiers" in err[0]


def test_train_on_a_missing_column_is_one_line_and_exit_2(tmp_path, csv_path, capsys) -> None:
    code = main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,medium", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "missing column(s) medium" in err[0]


@pytest.mark.parametrize("quantile", ["1", "-0.1", "1.5"])
def test_a_domain_quantile_outside_0_to_1_is_one_line_and_exit_2(tmp_path, csv_path, capsys, quantile) -> None:
    code = main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out", str(tmp_path / "r"),
                 f"--domain-quantile={quantile}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--domain-quantile must be in [0, 1)" in err[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, message", [(["--null-draws", "99"], "100 to 10,000 draws"),
                                            (["--null-draws", "10001"], "100 to 10,000 draws"),
                                            (["--folds", "1"], "2 to 20 folds"), (["--folds", "21"], "2 to 20 folds")])
def test_eval_refuses_a_null_outside_its_limits_in_one_line(tmp_path, csv_path, capsys, flags, message) -> None:
    router = tmp_path / "router"
    assert main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out", str(router),
                 "--C", "0.1", "--cv-folds", "0"]) == 0
    capsys.readouterr()
    code = main(["router", "eval", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--router", str(router),
                 "--plot", "none", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]


def test_train_refuses_too_few_null_draws_before_fitting(tmp_path, csv_path, capsys) -> None:
    code = main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out", str(tmp_path / "r"),
                 "--null-draws", "50"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "100 to 10,000 draws" in err[0] and not (tmp_path / "r").exists()


def test_eval_prints_the_null_beside_the_operating_points(tmp_path, csv_path, capsys) -> None:
    router = tmp_path / "router"
    assert main(["router", "train", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--out", str(router),
                 "--C", "0.1", "--cv-folds", "0"]) == 0
    capsys.readouterr()
    assert main(["router", "eval", "--outcomes", str(csv_path), "--tiers", "weak,strong", "--router", str(router),
                 "--plot", "none"]) == 0
    out = capsys.readouterr().out
    assert "random-route null (100 draws, seed 0, nested over 5 folds; cost)" in out
    assert out.count("in sample") == 3 and out.count("out of fold") == 3
