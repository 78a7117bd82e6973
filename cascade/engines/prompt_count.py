"""A chat prompt's tokens as an embedded worker counts them: the model's own chat template (its directory's
`chat_template.jinja`) rendered the way `transformers serve` renders it, and the text encoded with the model's own
`tokenizer.json`, so that the count is the `prompt_tokens` the worker reports.

What `transformers serve` (5.x, cli/serving) does with a chat request for a text-only model, and so what this does:

* each message becomes `{"role", "content"}`, its content the text parts joined with one space ("" for none), plus
  its `tool_call_id`; `name` and `reasoning_content` are dropped (`BaseHandler.get_processor_inputs_from_messages`);
* the template is rendered in Jinja's immutable sandbox with `trim_blocks` and `lstrip_blocks`, a `tojson` that keeps
  non-ASCII text, `raise_exception`, `strftime_now`, the tokenizer's special tokens as variables and
  `add_generation_prompt` (transformers' `_compile_jinja_template`, `apply_chat_template`);
* the rendered text is encoded without adding special tokens.

Not counted here (`count` answers None, and the caller keeps a bound): tools, assistant turns that call tools (the
engine parses their arguments and renders them as JSON again), a template that raises. tests/engines/
test_prompt_count.py checks the counts against transformers' own functions.

Encoding releases the GIL (the Rust `encode_batch`; its `encode` holds the GIL for the whole text, which would stall
an event loop waiting on another thread), so a count can run in a worker thread beside the loop.

    counter = TemplateCounter.load(model_dir)   # ~0.8 s for Qwen2.5's tokenizer: once per model, off the loop
    counter.count(messages)                      # ~1.4 us a byte of GSM8K text, up to ~2.5 us of spaced digits
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cascade.schemas import ChatMessage

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# tokenizer_config.json's `tokenizer_class`es whose transformers class normalizes to NFC (tests/engines/
# test_prompt_count.py checks each prepared model's pipeline against the worker's).
NFC_CLASSES = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast", "Qwen3_5Tokenizer"})
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def engine_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]] | None:
    """`messages` as `transformers serve` hands them to a text-only model's chat template; None when one calls tools
    (not counted here)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.tool_calls:
            return None
        content = m.content if isinstance(m.content, str) else " ".join(p.text for p in m.content or ())
        message: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


class TemplateCounter:
    """One model's tokenizer and chat template; `render` and `tokens` are safe to call from several threads."""

    def __init__(self, tokenizer: Any, tokenizer_id: str, template: Any, special: dict[str, str]) -> None:
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer
        self.tokenizer_id = tokenizer_id  # the sha256 of its tokenizer.json (and class, where that adds NFC): shared
        self.template = template  # a compiled jinja2 Template
        self.special = special

    @classmethod
    def load(cls, model_dir: Path, tokenizers: dict[str, Any] | None = None) -> TemplateCounter:
        """`model_dir`'s counter; `tokenizers`: those already loaded, by the sha256 of their file (shared: Qwen2.5's
        0.5B and 1.5B ship one tokenizer, ~125 MB loaded). Raises ImportError (no `tokenizers` or `jinja2`: the
        embedded extra), OSError (a file missing or unreadable) or ValueError (a file that does not parse, no chat
        template)."""
        from tokenizers import Tokenizer

        config: dict[str, Any] = {}
        if (model_dir / TOKENIZER_CONFIG).is_file():
            config = json.loads((model_dir / TOKENIZER_CONFIG).read_text())
        template_file = model_dir / TEMPLATE_FILE
        source = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        if not isinstance(source, str):
            raise ValueError(f"{model_dir} has no chat template ({TEMPLATE_FILE}, or a string in {TOKENIZER_CONFIG})")
        raw = (model_dir / TOKENIZER_FILE).read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        tokenizers = {} if tokenizers is None else tokenizers
        tokenizer_class = config.get("tokenizer_class")
        key = f"{digest}:{tokenizer_class}" if tokenizer_class in NFC_CLASSES else digest
        if key not in tokenizers:
            try:
                tokenizer = Tokenizer.from_str(raw.decode())
            except Exception as e:  # tokenizers raises a bare Exception for a file it cannot read
                raise ValueError(f"{model_dir / TOKENIZER_FILE}: {e}") from e
            tokenizers[key] = _with_class_normalizer(tokenizer, tokenizer_class)
        special = {k: v for k in SPECIAL_TOKENS if isinstance(v := _token(config.get(k)), str)}
        return cls(tokenizers[key], key, compile_template(source), special)

    def render(self, messages: Sequence[ChatMessage]) -> str | None:
        """The prompt the worker encodes for `messages`, its generation prompt included; None when it is not counted
        here (tools called, or the template refuses the messages: any error it raises)."""
        prepared = engine_messages(messages)
        if prepared is None:
            return None
        try:
            return str(self.template.render(messages=prepared, tools=None, documents=None,
                                            add_generation_prompt=True, **self.special))
        except Exception:  # raise_exception, an undefined name, a type error: the worker refuses it too
            return None

    def tokens(self, text: str) -> int:
        """`text`'s tokens, no special token added (encode_batch: the GIL is released while it encodes)."""
        return len(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)

    def count(self, messages: Sequence[ChatMessage]) -> int | None:
        """`messages`' prompt tokens as the worker counts them (None: not counted here, as `render`)."""
        text = self.render(messages)
        return None if text is None else self.tokens(text)


def _with_class_normalizer(tokenizer: Any, tokenizer_class: object) -> Any:
    """`tokenizer` as the worker's tokenizer class rebuilds it: transformers 5's Qwen2 classes set an NFC normalizer
    that their tokenizer.json lacks, so a decomposed `é` (e and U+0301) is one token to the worker, two to the file."""
    if tokenizer_class not in NFC_CLASSES or tokenizer.normalizer is not None:
        return tokenizer
    from tokenizers import normalizers

    tokenizer.normalizer = normalizers.NFC()
    return tokenizer


def class_tokenizer(tokenizer: Any, model_dir: Path) -> Any:
    """`tokenizer` (model_dir's tokenizer.json) as its tokenizer_config.json's class rebuilds it for the worker."""
    config_file = model_dir / TOKENIZER_CONFIG
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    return _with_class_normalizer(tokenizer, config.get("tokenizer_class"))


def _token(value: object) -> object:
    """A special token as tokenizer_config.json writes it: its text, or an added token's object with its `content`."""
    return value.get("content") if isinstance(value, dict) else value


def compile_template(source: str) -> Any:
    """A chat template compiled as transformers compiles one (its `_cached_compile_jinja_template`, less the
    assistant-mask extension that rendering a prompt never uses)."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)
