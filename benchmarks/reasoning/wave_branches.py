"""A live adaptive label run's branches, as outcome rows the GPU twin replays (cascade/testing/fakes/recorded.py).

`cascade label` on an adaptive reasoning tier (first wave W = 2 of N = 8; all 8 vote when the two disagree) writes
each question's outcome (answer, correctness, the chosen branch's tokens, all branches' decode tokens), not its
branches; the run's waves file says how many branches each question launched, and its logprobs file (no text) each
branch of the questions that launched all 8 (answer, correctness, tokens). Together they give the branches exactly:

* **first wave agreed** (2 launched): both branches gave the recorded answer (so the recorded correctness); the vote
  returns the shorter (the chosen branch: `output_tokens`), the other took `decode_tokens - output_tokens`;
* **all 8 launched**, with all 8 scored: each branch's answer and correctness from the logprobs file, its engine
  tokens its scored tokens + 1 (the scoring pass reads the text without the end-of-sequence token the engine
  counted), at most max_tokens (a cut branch has none);
* otherwise (no waves recorded, or branches missing): no row; the replay then answers the per-question outcome on
  every branch (recorded.py).

Each row keeps the outcome's own fields and adds `branches`; `check` counts the rows whose vote over the derived
branches (cascade's own `vote`, on the texts the replay serves) gives the recorded answer, chosen tokens and decode
tokens. On models/outcomes/gsm8k-train-embedded-reason-adaptive.jsonl: every answer and chosen length, and all
decode tokens but one question's (off by one token).

Usage: .venv/bin/python -m benchmarks.reasoning.wave_branches --outcomes LABELLED.jsonl --tier T --waves WAVES.jsonl
       --logprobs LOGPROBS.jsonl.gz [--max-tokens 512] --out rows.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import defaultdict
from pathlib import Path

import msgspec

from cascade.branches.sart import Finished, vote
from cascade.data.datasets import DatasetError
from cascade.data.outcomes import BranchOutcome, OutcomeRow, TierOutcome, read_rows, write_row
from cascade.repo_paths import recorded_path
from cascade.testing.fakes.recorded import CUT_SLACK_TOKENS, replay_text
from cascade.testing.scripts import fail, print_result


class Wave(msgspec.Struct):
    id: str
    saved: int  # branches launched


class Scored(msgspec.Struct):
    id: str
    branch: int
    tokens: int
    correct: bool
    answer: str | None = None


def branches_of(outcome: TierOutcome, launched: int, scored: dict[int, Scored], max_tokens: int
                ) -> list[BranchOutcome] | None:
    """The question's branches in sampling order (the chosen one first when the first wave agreed), or None."""
    answer = outcome.answer if isinstance(outcome.answer, str) else None
    if launched == 2 and outcome.output_tokens is not None and outcome.decode_tokens is not None:
        return [BranchOutcome(answer=answer, correct=bool(outcome.correct), output_tokens=tokens)
                for tokens in (outcome.output_tokens, outcome.decode_tokens - outcome.output_tokens)]
    if launched > 2 and sorted(scored) == list(range(launched)):
        return [BranchOutcome(answer=s.answer, correct=s.correct, output_tokens=min(s.tokens + 1, max_tokens))
                for s in (scored[b] for b in range(launched))]
    return None


def check(outcome: TierOutcome, branches: list[BranchOutcome], max_tokens: int) -> bool:
    """Whether the vote over `branches`, as the twin serves them, gives the recorded answer and tokens."""
    finished = [Finished(i, "".join(replay_text(b.answer, b.output_tokens, i)), None, b.output_tokens,
                         b.output_tokens < max_tokens - CUT_SLACK_TOKENS, None) for i, b in enumerate(branches)]
    voted = vote(finished)
    return (voted.answer == outcome.answer and finished[voted.chosen].tokens == outcome.output_tokens
            and sum(b.output_tokens for b in branches) == outcome.decode_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outcomes", required=True, help="the label run's outcome rows")
    parser.add_argument("--tier", required=True, help="its adaptive reasoning tier")
    parser.add_argument("--waves", required=True, help="the run's waves file (id, saved: branches launched)")
    parser.add_argument("--logprobs", required=True, help="the run's branch logprobs (.jsonl.gz, no text)")
    parser.add_argument("--max-tokens", type=int, default=512, help="the run's max_tokens")
    parser.add_argument("--out", required=True)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        rows = [row for _, row in read_rows(args.outcomes) if row.id is not None and args.tier in row.tiers]
        waves = {w.id: w.saved for w in msgspec.json.Decoder(list[Wave]).decode(
            b"[" + b",".join(line for line in Path(args.waves).read_bytes().splitlines() if line.strip()) + b"]")}
        scored: dict[str, dict[int, Scored]] = defaultdict(dict)
        with gzip.open(args.logprobs, "rb") as lines:
            decode = msgspec.json.Decoder(Scored).decode
            for line in lines:
                if line.strip():
                    s = decode(line)
                    scored[s.id][s.branch] = s
    except (DatasetError, OSError, msgspec.DecodeError) as exc:
        return fail(str(exc))
    written = matched = 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as sink:
        for row in rows:
            outcome = row.tiers[args.tier]
            branches = branches_of(outcome, waves.get(row.id or "", 0), scored[row.id or ""], args.max_tokens)
            if branches is None:
                continue
            write_row(sink, OutcomeRow(id=row.id, dataset=row.dataset, tiers={
                args.tier: msgspec.structs.replace(outcome, branches=branches)}))
            written += 1
            matched += check(outcome, branches, args.max_tokens)
    print_result({"rows": len(rows), "with_branches": written, "vote_matches_record": matched,
                  "out": recorded_path(out)}, args.json_out, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
