"""PromQL text for the step source: label matchers added to a runtime's counter
selectors, and the latency units runtimes export. Pure functions, no Prometheus."""

from __future__ import annotations

import re

# A plain instant selector: `name`, `name{...}` or `{...}` (the form `Metrics` takes).
_SELECTOR = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)?\s*(\{(.*)\})?\s*$", re.DOTALL)
# how many milliseconds one of a histogram's unit is
MS_PER_UNIT: dict[str, float] = {"s": 1000.0, "ms": 1.0, "us": 1e-3}


def join_matchers(*matchers: str) -> str:
    """Matcher lists ('a="1"', '', 'b=~"2.."') as one, braces and blanks dropped."""
    parts = [m.strip().strip("{}").strip() for m in matchers]
    return ",".join(p for p in parts if p)


def with_matchers(selector: str, *matchers: str) -> str:
    """`selector` narrowed by `matchers`, which come first inside its braces:
    with_matchers('x{a="1"}', 'job="j"') == 'x{job="j",a="1"}'. ValueError when
    `selector` is not a plain instant selector (a function or an operator: the step
    source takes rate() of it and needs the series themselves)."""
    match = _SELECTOR.match(selector)
    if match is None or not (match.group(1) or match.group(2)):
        raise ValueError(
            f'{selector!r} is not a plain PromQL selector such as name, name{{label="v"}} '
            'or {__name__=~"a|b"}'
        )
    name = match.group(1) or ""
    inner = join_matchers(*matchers, match.group(3) or "")
    return f"{name}{{{inner}}}" if inner else name
