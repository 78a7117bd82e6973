"""The metric and label names a PromQL expression reads, so that a test can check every dashboard panel and alert rule
against the series the gateway exports (tests/deploy/test_monitoring.py).

A scanner, not a parser: it knows PromQL's tokens well enough to tell a metric name from a function, an
aggregation, a keyword, a label name (inside `{...}`, `by (...)`, `on (...)`) or a duration (`[5m]`,
`offset 5m`), and refuses a function it does not know (a typo there would otherwise read as a metric name).
Prometheus itself (`promtool check rules`) checks the grammar where it is installed.

    scan('sum by (tier) (rate(cascade_requests_total{outcome!="ok"}[5m]))')
    # ({"cascade_requests_total"}, {"tier", "outcome"})
"""

from __future__ import annotations

import re


def _words(text: str) -> list[str]:
    return text.split()


# Prometheus 2.x/3.x functions and aggregation operators (prometheus/promql/parser/functions.go, lex.go).
FUNCTIONS = frozenset(_words("""
abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes clamp clamp_max clamp_min
cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg delta deriv exp floor
histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
histogram_sum holt_winters double_exponential_smoothing hour idelta increase irate label_join label_replace
last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month pi predict_linear
present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort sort_by_label
sort_by_label_desc sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector
year
"""))
AGGREGATIONS = frozenset(_words("sum min max avg group stddev stdvar count count_values "
                                 "bottomk topk quantile limitk limit_ratio"))
# Keywords followed by a parenthesised list of label names.
_LABEL_LISTS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_KEYWORDS = frozenset(["and", "or", "unless", "bool", "offset", "atan2"])
_MATCHERS = frozenset(("=", "!=", "=~", "!~"))

# Possessive quantifiers (Python 3.11+): a run of digits is never re-split when what follows fails, so scanning a
# long run costs linear time (tests/test_linear_patterns.py).
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\[\]]*+\])
  | (?P<duration>(?:\d++(?:ms|[smhdwy]))++(?![A-Za-z0-9_:]))
  | (?P<number>(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][+-]?\d++)?+|0x[0-9a-fA-F]++|(?:[iI]nf|NaN)(?![A-Za-z0-9_:]))
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){},@])
""", re.VERBOSE)


class PromQLError(ValueError):
    """An expression the scanner cannot read (an unknown function, a stray character, unbalanced brackets)."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"unexpected {expr[at:at + 20]!r} at {at} in {expr!r}")
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
        at = match.end()
    return out


def _skip_group(tokens: list[tuple[str, str]], at: int, opening: str, closing: str, expr: str) -> int:
    """The index after the group that opens at `at` (tokens[at] is `opening`)."""
    depth = 0
    for i in range(at, len(tokens)):
        if tokens[i] == ("op", opening):
            depth += 1
        elif tokens[i] == ("op", closing):
            depth -= 1
            if depth == 0:
                return i + 1
    raise PromQLError(f"unbalanced {opening!r} in {expr!r}")


def scan(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) that `expr` reads: metrics bare or before `{` or `[`; labels in matchers
    (`{tier="a"}`) and in `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` lists."""
    tokens, names, labels, at = _tokens(expr), set(), set(), 0
    if sum(t == ("op", "(") for t in tokens) != sum(t == ("op", ")") for t in tokens):
        raise PromQLError(f"unbalanced parentheses in {expr!r}")
    while at < len(tokens):
        kind, text = tokens[at]
        following = tokens[at + 1] if at + 1 < len(tokens) else ("", "")
        if (kind, text) == ("op", "{"):
            end = _skip_group(tokens, at, "{", "}", expr)
            labels |= {t for (k, t), nxt in zip(tokens[at:end], tokens[at + 1:end], strict=False)
                       if k == "name" and nxt[1] in _MATCHERS}
            at = end
            continue
        if kind != "name":
            at += 1
            continue
        if text in _LABEL_LISTS:
            if following == ("op", "("):
                end = _skip_group(tokens, at + 1, "(", ")", expr)
                labels |= {t for k, t in tokens[at + 2:end - 1] if k == "name"}
                at = end
            else:
                at += 1
            continue
        if following == ("op", "("):
            if text not in FUNCTIONS and text not in AGGREGATIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
        elif text not in _KEYWORDS and text not in AGGREGATIONS:  # `sum by (x) (...)`: the aggregation comes first
            names.add(text)
        at += 1
    return names, labels


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (bare, or before `{` or `[`)."""
    return scan(expr)[0]


def label_names(expr: str) -> set[str]:
    """Every label name `expr` matches on or groups by."""
    return scan(expr)[1]
