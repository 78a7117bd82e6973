"""A small chat model as a step scorer: "is the reasoning so far correct?", read from one prefill.

The model (an embedded instruct model, cascade/engines/verifier_model.py) is shown the question and the
partial branch in its own chat template, followed by a fixed judging question and the start of its answer
turn. One forward pass over that prompt, no decoding, gives the next-token logits; the score is

    P(yes) / (P(yes) + P(no)),

where P(yes) sums the probabilities of the first tokens of "Yes", " Yes", "yes", " yes" (likewise for no).
The softmax normaliser cancels, so only those few logits are needed: sigmoid(logsumexp(yes) -
logsumexp(no)). The score is in [0, 1]; its level is the model's own (small models lean to one answer:
SmolLM2-135M gives ~0.2 to most steps, Qwen2.5-Coder-0.5B ~0.43), so a phase-1 threshold is chosen per model,
while phase 2 only compares branches with each other. Two prompt styles (`judge_messages`): "judge", the
steps quoted in one user turn (default), and "self", the steps as the model's own answer so far.

It is served by `cascade scorer-server` (cascade/engines/scorer_server.py) over SGLang's PRM wire format,
`POST /classify` with Qwen2.5-Math-PRM inputs (cascade/branches/prm_client.py: `prm_input`), so the gateway
scores with the same client as a GPU PRM. The server reads the question and the steps back out of that
input (`parse_prm_input`) and renders its own judging prompt (`judge_messages`).

No torch here: the gateway imports this module's neighbours, and the online path never loads torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, Protocol

import msgspec

from cascade.branches.prm_client import STEP_MARKER
from cascade.branches.scoring import STEP_SEPARATOR

# Changing any of these changes every score: benchmark again (benchmarks/reasoning/verifier_scorer.py).
JUDGE_INSTRUCTION = "Here is a math problem and the beginning of a student's step-by-step solution."
JUDGE_QUESTION = "Is the reasoning so far correct? Answer Yes or No."
SELF_QUESTION = "Is your reasoning so far correct? Answer Yes or No."
Prompt = Literal["judge", "self"]
PROMPTS: tuple[Prompt, ...] = ("judge", "self")
YES_SPELLINGS = ("Yes", " Yes", "yes", " yes")
NO_SPELLINGS = ("No", " No", "no", " no")

_PRM_INPUT = re.compile(
    # The system part is atomic: it ends at the first <|im_end|>, and a question full of chat markers is not tried
    # against every later one (quadratic).
    r"\A<\|im_start\|>system\n(?>.*?<\|im_end\|>\n)<\|im_start\|>user\n(?P<question>.*?)<\|im_end\|>\n"
    r"<\|im_start\|>assistant\n(?P<response>.*)\Z", re.DOTALL)


class Scored(msgspec.Struct, frozen=True, kw_only=True):
    """One input's score and what it cost: its prompt's tokens, how many of them came from the prefix cache,
    and the seconds its forward pass took (a padded batch's time divided among its inputs)."""

    score: float
    prompt_tokens: int
    cached_tokens: int = 0
    seconds: float = 0.0


class Tokenizer(Protocol):
    """What the token lookup needs of a (Hugging Face) tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def judge_messages(question: str, steps: list[str], prompt: Prompt = "judge") -> list[dict[str, str]]:
    """The chat the verifier reads (its template adds the answer turn's start).

    "judge" (default): one user message with the problem, the steps so far (blank-line separated, as the
    branch wrote them) and the judging question. "self": the problem as the user's turn, the steps as the
    model's own answer so far, then the user asks SELF_QUESTION (the model judging "its own" reasoning)."""
    solution = STEP_SEPARATOR.join(step.strip() for step in steps if step.strip()) or "(no steps yet)"
    if prompt == "self":
        return [{"role": "user", "content": question.strip()}, {"role": "assistant", "content": solution},
                {"role": "user", "content": SELF_QUESTION}]
    content = (f"{JUDGE_INSTRUCTION}\n\nProblem:\n{question.strip()}\n\nSolution so far:\n{solution}\n\n"
               f"{JUDGE_QUESTION}")
    return [{"role": "user", "content": content}]


def parse_prm_input(text: str) -> tuple[str, list[str]]:
    """(question, steps) of a Qwen2.5-Math-PRM input as `prm_input` renders it: the inverse of `prm_input`
    for text without markers of its own. Raises ValueError, naming what is wrong, for anything else."""
    match = _PRM_INPUT.match(text)
    if match is None:
        raise ValueError("`text` is not a PRM input: expected the Qwen2.5-Math-PRM chat rendering "
                         "(<|im_start|>system ... <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n"
                         "{step}<extra_0>...), as cascade's PRM client sends")
    response = match["response"]
    if response and not response.endswith(STEP_MARKER):
        raise ValueError(f"`text` must end right after a step's {STEP_MARKER} marker (the step being scored)")
    steps = [step.strip() for step in response.split(STEP_MARKER) if step.strip()]
    return match["question"], steps


def answer_token_ids(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(yes ids, no ids): the first token of each spelling in YES_SPELLINGS / NO_SPELLINGS, deduplicated, in
    spelling order. A spelling whose first token is shared by the other side (a tokenizer that splits " Yes"
    into " " + "Yes") is dropped from both; none left on a side is an error."""
    yes = _first_tokens(tokenizer, YES_SPELLINGS)
    no = _first_tokens(tokenizer, NO_SPELLINGS)
    shared = set(yes) & set(no)
    yes, no = [t for t in yes if t not in shared], [t for t in no if t not in shared]
    if not yes or not no:
        raise ValueError(f"the tokenizer has no distinct first tokens for {YES_SPELLINGS} vs {NO_SPELLINGS}")
    return yes, no


def _first_tokens(tokenizer: Tokenizer, spellings: Sequence[str]) -> list[int]:
    ids: list[int] = []
    for spelling in spellings:
        tokens = tokenizer.encode(spelling, add_special_tokens=False)
        if tokens and tokens[0] not in ids:
            ids.append(tokens[0])
    return ids


def yes_probability(yes_logits: Sequence[float], no_logits: Sequence[float]) -> float:
    """P(yes) / (P(yes) + P(no)) from the logits of the yes and no tokens at the answer position."""
    z = _logsumexp(yes_logits) - _logsumexp(no_logits)
    if math.isnan(z):  # both sides impossible: no opinion
        return 0.5
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    if math.isinf(top):
        return top
    return top + math.log(math.fsum(math.exp(v - top) for v in values))
