"""The output parsers SGLang can run, by the names its `--reasoning-parser` / `--tool-call-parser` accept.

Without a reasoning parser SGLang returns a reasoning model's thinking inside `content` (never
`reasoning_content`); without a tool-call parser it returns a call as text (never `tool_calls`).
Which parser fits a model is on its card (models/gpu-models/*.toml); the names are SGLang 0.5.23's,
copied from its source: sglang/srt/parser/reasoning_parser_names.py (REASONING_PARSER_NAMES) and
sglang/srt/function_call/parser_names.py (TOOL_CALL_PARSER_NAMES); server_args.py adds "auto" to both
(detect from the chat template or checkpoint metadata). A newer SGLang may know more: add them here.
"""

from __future__ import annotations

from cascade.errors import ConfigError

SGLANG_VERSION = "0.5.23"

REASONING_PARSERS = frozenset({
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots", "glm45", "ling3",
    "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo", "muse", "poolside_v1", "qwen3",
    "qwen3-thinking", "minimax", "minimax-append-think", "minimax-m3", "nanbeige", "step3", "step3p5", "mistral",
    "nemotron_3", "granite_thinking_parser", "interns1", "gemma4", "inkling", "iquest_q1", "cohere_command4",
    "gigachat35", "response_template", "auto",
})

TOOL_CALL_PARSERS = frozenset({
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4",
    "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3",
    "llama3", "mimo", "minicpm5", "mistral", "muse", "poolside_v1", "pythonic", "qwen", "qwen25", "qwen3_coder",
    "spark25", "step3", "step3p5", "minimax-m2", "minimax-m3", "nanbeige", "trinity", "interns1", "hermes",
    "hunyuan", "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1", "response_template", "auto",
})

_KNOWN = {"reasoning_parser": REASONING_PARSERS, "tool_call_parser": TOOL_CALL_PARSERS}


def check_parser(key: str, name: str, where: str) -> None:
    """A ConfigError naming `where`, the key and every valid name unless `name` is "" (no parser) or one
    SGLang accepts for `key` ("reasoning_parser" or "tool_call_parser")."""
    if name and name not in _KNOWN[key]:
        valid = ", ".join(sorted(_KNOWN[key]))
        raise ConfigError(f"{where}: {key} `{name}` is not one SGLang {SGLANG_VERSION} accepts for "
                          f"--{key.replace('_', '-')}; use one of: {valid} (or "" for none)")
