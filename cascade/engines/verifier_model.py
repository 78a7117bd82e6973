"""The verifier step scorer's model (cascade/branches/verifier.py has the method): an embedded chat model
scoring "is the reasoning so far correct?" from one prefill per input, on the CPU.

Two ways to run a list of inputs:

* **prefix cache on** (`prefix_cache_tokens > 0`, the default): inputs run one after another, and each
  reuses the key/value cache of the longest token prefix it shares with a recent input. SART scores a
  branch every K steps, so the next call for a branch repeats the previous one's question and steps and
  only the new step and the judging question are computed; the N branches of a request share the question.
  (What SGLang's radix cache does on a GPU.) The cache keeps the most recently used inputs' keys and values
  up to `prefix_cache_tokens` tokens in all.
* **prefix cache off**: one right-padded forward pass per `max_batch` inputs (causal attention: real tokens
  never see the padding, so each input's last hidden state is its own).

Either way only the yes/no rows of the output head are applied, to the last position's hidden state: the
score needs no other logit (the softmax normaliser cancels).
"""

from __future__ import annotations

import inspect
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cascade.branches.verifier import Prompt, Scored, answer_token_ids, judge_messages, yes_probability

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
MIN_REUSE_TOKENS = 8  # a shorter shared prefix (the chat template's start) is not worth a cache copy


class PrefixCache:
    """Key/value caches of recent inputs by token ids, least recently used dropped beyond `max_tokens`."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[int, tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self.tokens = 0
        self._next = 0

    def longest(self, ids: np.ndarray) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(length, keys/values) of the longest cached prefix of `ids` (0, None if none)."""
        best, best_key = 0, None
        for key, (cached, _) in self.entries.items():
            n = min(len(cached), len(ids))
            differ = np.flatnonzero(cached[:n] != ids[:n])
            common = int(differ[0]) if len(differ) else n
            if common > best:
                best, best_key = common, key
        if best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key][1]

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0

    def add(self, ids: np.ndarray, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if len(ids) > self.max_tokens:
            return
        self.entries[self._next] = (ids, kv)
        self._next += 1
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            _, (old, _) = self.entries.popitem(last=False)
            self.tokens -= len(old)


class VerifierModel:
    """A prepared embedded model directory (`cascade.engines.models.prepare`) loaded for scoring."""

    def __init__(self, model_dir: Path | str, *, dtype: str = "bfloat16", threads: int = 1,
                 prefix_cache_tokens: int = 16384, max_batch: int = 8, prompt: Prompt = "judge") -> None:
        torch.set_num_threads(threads)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[dtype]).eval()
        self.decoder = self.model.get_decoder()
        # transformers 5.x renamed `past_key_values` to `cache` (the old name warns); older ones have only it.
        takes_cache = "cache" in inspect.signature(self.decoder.forward).parameters
        self._cache_arg = "cache" if takes_cache else "past_key_values"
        self.yes_ids, self.no_ids = answer_token_ids(self.tokenizer)
        head = self.model.get_output_embeddings()
        rows = self.yes_ids + self.no_ids
        self._head_w = head.weight.detach()[rows].float()
        bias = getattr(head, "bias", None)
        self._head_b = None if bias is None else bias.detach()[rows].float()
        self.max_tokens = int(getattr(self.model.config, "max_position_embeddings", 0) or 32768)
        self.cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self.max_batch = max_batch
        self.prompt = prompt
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id or 0)

    def encode(self, question: str, steps: list[str]) -> list[int]:
        """Token ids of the judging prompt for (question, steps), ending where the answer's first token goes."""
        messages = judge_messages(question, steps, self.prompt)
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > self.max_tokens:
            # SGLang's wording for the same fault (tests/fixtures/sglang/classify_error_400_context_length.json).
            raise ValueError(f"The input ({len(ids)} tokens) is longer than the model's context length "
                             f"({self.max_tokens} tokens).")
        return ids

    def score(self, inputs: list[tuple[str, list[str]]]) -> list[Scored]:
        return self.score_ids([self.encode(q, steps) for q, steps in inputs])

    @torch.inference_mode()
    def score_ids(self, inputs: list[list[int]]) -> list[Scored]:
        if self.cache is not None:
            return [self._cached(np.asarray(ids, dtype=np.int64)) for ids in inputs]
        out: list[Scored] = []
        for start in range(0, len(inputs), self.max_batch):
            out += self._padded(inputs[start:start + self.max_batch])
        return out

    def _cached(self, ids: np.ndarray) -> Scored:
        assert self.cache is not None
        t0 = time.perf_counter()
        reuse, kv = self.cache.longest(ids)
        reuse = min(reuse, len(ids) - 1)  # the last token is always computed: its hidden state is the answer
        past = None
        if kv is not None and reuse >= MIN_REUSE_TOKENS:
            from transformers import DynamicCache

            past = DynamicCache(ddp_cache_data=[(k[:, :, :reuse], v[:, :, :reuse]) for k, v in kv])
        else:
            reuse = 0
        new = torch.from_numpy(ids[reuse:]).unsqueeze(0)
        output = self.decoder(input_ids=new, use_cache=True,
                              **{self._cache_arg: past if past is not None else _empty_cache()})
        self.cache.add(ids, _keys_values(getattr(output, "cache", None) or output.past_key_values))
        p = self._probability(output.last_hidden_state[:, -1])[0]
        return Scored(score=p, prompt_tokens=len(ids), cached_tokens=reuse, seconds=time.perf_counter() - t0)

    def _padded(self, batch: list[list[int]]) -> list[Scored]:
        t0 = time.perf_counter()
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, row in enumerate(batch):
            ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, :len(row)] = 1
        hidden = self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        last = torch.tensor([len(row) - 1 for row in batch])
        scores = self._probability(hidden[torch.arange(len(batch)), last])
        seconds = (time.perf_counter() - t0) / len(batch)
        return [Scored(score=s, prompt_tokens=len(row), cached_tokens=0, seconds=seconds)
                for s, row in zip(scores, batch, strict=True)]

    def _probability(self, hidden: torch.Tensor) -> list[float]:
        logits = hidden.float() @ self._head_w.T
        if self._head_b is not None:
            logits = logits + self._head_b
        n_yes = len(self.yes_ids)
        return [yes_probability(row[:n_yes], row[n_yes:]) for row in logits.tolist()]


def _empty_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


def _keys_values(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]
