"""Outcomes: one row per prompt with each tier's correctness, read from JSONL, a CSV or a folder of CSVs.

Formats (``tiers`` always names the tiers cheapest first):

* JSONL, as written by ``cascade label`` (the rows of `cascade.data.outcomes`): one object per line,
  ``{"id": "gsm8k-train:17", "prompt": "...", "tiers": {"<tier>": {"correct": bool, ...}, ...}}``.
  The group of a row (used for grouped cross-validation) is the part of ``id`` before the last ``:``.
  A tier's optional ``decode_tokens`` (all branches of a branched tier), else ``output_tokens``, and
  ``latency_s`` are kept as what the answer cost (`Outcomes.tokens`, `Outcomes.latency`; NaN where absent).
* CSV (the RouteLLM format): a ``prompt`` column and one boolean column per tier
  (``True``/``False``, ``true``/``false`` or ``1``/``0``). The group is the file's stem.
* A folder: every ``*.csv`` in it, sorted by name, concatenated (e.g. RouteLLM's ``mmlu/``, one file per subject).

Data is read in place; ``sha256`` fingerprints the bytes read so a router card can name its data.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cascade.data.datasets import DatasetError, load, shared_data_dir
from cascade.data.outcomes import OutcomeRow, decode_rows
from cascade.errors import ConfigError

__all__ = ["Outcomes", "load_outcomes", "parse_tiers", "shared_data_dir", "split_indices"]

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


@dataclass(frozen=True)
class Outcomes:
    """Prompts and a boolean correctness matrix ``correct[i, t]`` (prompt i, tier t, cheapest first)."""

    ids: list[str]
    prompts: list[str]
    correct: np.ndarray
    tiers: list[str]
    groups: list[str]
    sha256: str
    # What each answer cost, (n_prompts, n_tiers), NaN where the data does not say (CSV files).
    tokens: np.ndarray | None = None
    latency: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, index: np.ndarray) -> Outcomes:
        rows = [int(i) for i in index]
        return Outcomes(
            ids=[self.ids[i] for i in rows], prompts=[self.prompts[i] for i in rows],
            correct=self.correct[rows], tiers=self.tiers, groups=[self.groups[i] for i in rows],
            sha256=self.sha256, tokens=None if self.tokens is None else self.tokens[rows],
            latency=None if self.latency is None else self.latency[rows],
        )


def parse_tiers(spec: str) -> list[str]:
    tiers = [t.strip() for t in spec.split(",") if t.strip()]
    if len(tiers) < 2:
        raise ConfigError(f"--tiers needs at least two comma-separated tier names (cheapest first), got {spec!r}")
    if len(set(tiers)) != len(tiers):
        raise ConfigError(f"--tiers names a tier twice: {spec!r}")
    return tiers


def load_outcomes(path: str | Path, tiers: list[str]) -> Outcomes:
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise ConfigError(f"outcomes folder {path} holds no *.csv files")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"cannot read outcomes {path}: no such file or folder")
    digest = hashlib.sha256()
    parts = []
    for file in files:
        raw = file.read_bytes()
        digest.update(file.name.encode() + b"\0" + raw)
        parts.append(_read_jsonl(file, raw, tiers) if file.suffix == ".jsonl" else _read_csv(file, raw, tiers))
    ids = [i for p in parts for i in p[0]]
    prompts = [q for p in parts for q in p[1]]
    correct = np.concatenate([p[2] for p in parts]) if parts else np.zeros((0, len(tiers)), bool)
    groups = [g for p in parts for g in p[3]]
    if not prompts:
        raise ConfigError(f"outcomes {path} hold no rows")
    tokens = np.concatenate([p[4] for p in parts])
    latency = np.concatenate([p[5] for p in parts])
    return Outcomes(ids, prompts, correct, list(tiers), groups, digest.hexdigest(), tokens, latency)


_Part = tuple[list[str], list[str], np.ndarray, list[str], np.ndarray, np.ndarray]


def _read_csv(file: Path, raw: bytes, tiers: list[str]) -> _Part:
    csv.field_size_limit(sys.maxsize)
    reader = csv.DictReader(raw.decode("utf-8-sig").splitlines(keepends=True))
    columns = reader.fieldnames or []
    missing = [c for c in ["prompt", *tiers] if c not in columns]
    if missing:
        raise ConfigError(f"{file}: missing column(s) {', '.join(missing)}; columns are: {', '.join(columns)}")
    prompts, rows = [], []
    for line, record in enumerate(reader, start=2):
        prompts.append(record["prompt"])
        rows.append([_bool(record[t], file, line, t) for t in tiers])
    ids = [f"{file.stem}:{i}" for i in range(len(prompts))]
    unknown = np.full((len(prompts), len(tiers)), np.nan)
    return (ids, prompts, np.array(rows, dtype=bool).reshape(-1, len(tiers)), [file.stem] * len(prompts),
            unknown, unknown.copy())


def _read_jsonl(file: Path, raw: bytes, tiers: list[str]) -> _Part:
    ids, prompts, rows, groups, tokens, latency = [], [], [], [], [], []
    texts: dict[str, dict[str, str]] = {}  # dataset -> id -> prompt, loaded once per dataset
    try:
        for line, row in decode_rows(raw, file):
            missing = [t for t in tiers if t not in row.tiers]
            if missing:
                raise ConfigError(
                    f"{file}:{line}: no outcome for tier(s) {', '.join(missing)}; has {', '.join(row.tiers)}")
            results = [row.tiers[t] for t in tiers]
            ungraded = [t for t, r in zip(tiers, results, strict=True) if r.correct is None]
            if ungraded:
                raise ConfigError(f"{file}:{line}: tier(s) {', '.join(ungraded)} have no `correct`")
            row_id = row.id if row.id is not None else f"{file.stem}:{line}"
            ids.append(row_id)
            prompts.append(row.prompt if row.prompt is not None else _prompt_by_id(row, file, line, texts))
            rows.append([r.correct for r in results])
            tokens.append([np.nan if r.tokens_spent is None else float(r.tokens_spent) for r in results])
            latency.append([np.nan if r.latency_s is None else r.latency_s for r in results])
            groups.append(row_id.rsplit(":", 1)[0] if ":" in row_id else file.stem)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    shape = (-1, len(tiers))
    return (ids, prompts, np.array(rows, dtype=bool).reshape(shape), groups,
            np.array(tokens, dtype=float).reshape(shape), np.array(latency, dtype=float).reshape(shape))


def _prompt_by_id(row: OutcomeRow, file: Path, line: int, texts: dict[str, dict[str, str]]) -> str:
    if row.dataset is None or row.id is None:
        raise ConfigError(f"{file}:{line}: a row needs `prompt`, or `dataset` and `id` to look it up")
    if row.dataset not in texts:
        try:
            texts[row.dataset] = {p.id: p.prompt for p in load(row.dataset, data_dir=shared_data_dir())}
        except DatasetError as exc:
            raise ConfigError(f"{file}:{line}: cannot look up prompts of dataset `{row.dataset}`: {exc}") from None
    try:
        return texts[row.dataset][row.id]
    except KeyError:
        raise ConfigError(f"{file}:{line}: id `{row.id}` is not in dataset `{row.dataset}`") from None


def _bool(value: str | None, file: Path, line: int, column: str) -> bool:
    text = (value or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{file}:{line}: column {column} must be a boolean (True/False/1/0), got {value!r}")


def split_indices(n: int, train_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed random split: a ``numpy.random.RandomState(seed)`` permutation, the first
    ``floor(n * train_fraction)`` rows train and the rest test. With RouteLLM's GSM8K CSV, fraction 0.5
    and seed 0 this is the split on which FACTS.md's reference APGRs (length 0.64, oracle 1.12) reproduce."""
    if not 0.0 < train_fraction <= 1.0:
        raise ConfigError(f"train fraction must be in (0, 1], got {train_fraction}")
    order = np.random.RandomState(seed).permutation(n)
    n_train = int(np.floor(n * train_fraction)) if train_fraction < 1.0 else n
    return np.sort(order[:n_train]), np.sort(order[n_train:])
