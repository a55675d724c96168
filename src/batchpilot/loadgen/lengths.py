"""Prompt and output lengths (in tokens) of generative requests: drawn per request from a
distribution, seeded, so every process sharing a schedule gives each request the same
pair (`draw_lengths`).

A distribution is written as `fixed:N`, `uniform:LO-HI` (inclusive), `lognormal:MEDIAN,
SIGMA` (exp of a normal around ln MEDIAN, rounded and held within 1..MAX_TOKENS) or
`file:PATH`, a JSON-lines file of `{"prompt_tokens": P, "output_tokens": O}` pairs, one
of which each request takes at random, both lengths together."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from batchpilot.models import Frozen

# The longest prompt or answer a request asks for: beyond any served context window.
MAX_TOKENS = 1_048_576
# The most pairs a lengths file may hold: they travel to every load worker with its share.
MAX_PAIRS = 100_000
LENGTHS_SYNTAX = (
    "fixed:N, uniform:LO-HI, lognormal:MEDIAN,SIGMA or file:PATH (JSON lines of "
    '{"prompt_tokens": P, "output_tokens": O})'
)

Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class Fixed(Frozen):
    kind: Literal["fixed"] = "fixed"
    tokens: Tokens


class Uniform(Frozen):
    kind: Literal["uniform"] = "uniform"
    low: Tokens
    high: Tokens


class LogNormal(Frozen):
    kind: Literal["lognormal"] = "lognormal"
    median: Tokens
    sigma: Annotated[float, Field(gt=0, le=5)]


LengthDist = Annotated[Fixed | Uniform | LogNormal, Field(discriminator="kind")]


class TokenLengths(Frozen):
    """Where each request's (prompt tokens, output tokens) come from: a pairs file, or a
    distribution for each."""

    prompt: LengthDist | None = None
    output: LengthDist | None = None
    pairs: Annotated[tuple[tuple[Tokens, Tokens], ...], Field(max_length=MAX_PAIRS)] = ()
    source: str | None = None  # the pairs file, for the report

    def describe(self) -> str:
        if self.pairs:
            return f"pairs from {self.source or 'a file'} ({len(self.pairs)})"
        return f"prompt {describe_dist(self.prompt)}, output {describe_dist(self.output)}"


def describe_dist(dist: Fixed | Uniform | LogNormal | None) -> str:
    if isinstance(dist, Fixed):
        return f"fixed:{dist.tokens}"
    if isinstance(dist, Uniform):
        return f"uniform:{dist.low}-{dist.high}"
    if isinstance(dist, LogNormal):
        return f"lognormal:{dist.median},{dist.sigma:g}"
    return "none"


def draw_lengths(lengths: TokenLengths, n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of `n` requests in schedule order, the same for a
    seed in every process."""
    rng = random.Random(f"batchpilot-lengths:{seed}")
    if lengths.pairs:
        return [lengths.pairs[rng.randrange(len(lengths.pairs))] for _ in range(n)]
    if lengths.prompt is None or lengths.output is None:
        raise ValueError("token lengths need a prompt and an output distribution, or pairs")
    return [(_draw(lengths.prompt, rng), _draw(lengths.output, rng)) for _ in range(n)]


# Output lengths drawn to find a long answer (`long_output_tokens`).
LONG_OUTPUT_DRAWS = 1000


def long_output_tokens(lengths: TokenLengths) -> int:
    """A long answer of these lengths: the 99th percentile of seeded draws."""
    outputs = sorted(o for _, o in draw_lengths(lengths, LONG_OUTPUT_DRAWS, 0))
    return outputs[int(0.99 * (len(outputs) - 1))]


def _draw(dist: Fixed | Uniform | LogNormal, rng: random.Random) -> int:
    if isinstance(dist, Fixed):
        return dist.tokens
    if isinstance(dist, Uniform):
        return rng.randint(dist.low, dist.high)
    value = round(dist.median * math.exp(rng.gauss(0.0, dist.sigma)))
    return min(max(value, 1), MAX_TOKENS)


def parse_dist(text: str, what: str) -> Fixed | Uniform | LogNormal:
    """`fixed:N`, `uniform:LO-HI` or `lognormal:MEDIAN,SIGMA` (a bare N is fixed).
    ValueError naming `what` (the option) and the forms allowed."""
    kind, sep, rest = text.strip().partition(":")
    if not sep:
        kind, rest = "fixed", text.strip()
    try:
        if kind == "fixed":
            return Fixed(tokens=_tokens(rest))
        if kind == "uniform":
            low, dash, high = rest.partition("-")
            if not dash:
                raise ValueError("uniform needs LO-HI")
            dist = Uniform(low=_tokens(low), high=_tokens(high))
            if dist.low > dist.high:
                raise ValueError(f"uniform's LO {dist.low} is above its HI {dist.high}")
            return dist
        if kind == "lognormal":
            median, comma, sigma = rest.partition(",")
            if not comma:
                raise ValueError("lognormal needs MEDIAN,SIGMA")
            spread = float(sigma)
            if not (math.isfinite(spread) and 0 < spread <= 5):
                raise ValueError(f"lognormal's SIGMA must be > 0 and ≤ 5, got {sigma.strip()}")
            return LogNormal(median=_tokens(median), sigma=spread)
    except ValueError as exc:
        raise ValueError(f"{what} {text!r}: {_reason(exc)}; allowed: {LENGTHS_SYNTAX}") from None
    raise ValueError(f"{what} {text!r} is not one of: {LENGTHS_SYNTAX}")


def _tokens(text: str) -> int:
    value = int(text.strip())
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"a token count must be 1 to {MAX_TOKENS}, got {value}")
    return value


def _reason(exc: ValueError) -> str:
    message = str(exc)
    if message.startswith("invalid literal for int()"):
        return "token counts must be whole numbers"
    if message.startswith("could not convert string to float"):
        return "SIGMA must be a number"
    return message.splitlines()[0]


def parse_lengths(prompt: str | None, output: str | None, *, default: TokenLengths) -> TokenLengths:
    """The lengths `--prompt-tokens` and `--output-tokens` describe (None: not given).
    `file:PATH` gives both lengths from its pairs: the other option is then left out or
    names the same file. ValueError naming the option and what is allowed."""
    files = {
        flag: spec.strip()[len("file:") :]
        for flag, spec in (("--prompt-tokens", prompt), ("--output-tokens", output))
        if spec is not None and spec.strip().startswith("file:")
    }
    if files:
        paths = set(files.values())
        other = output if "--prompt-tokens" in files else prompt
        if len(paths) > 1 or (len(files) == 1 and other is not None):
            raise ValueError(
                "a file:PATH of pairs gives both the prompt and the output lengths: name it "
                "in --prompt-tokens or --output-tokens (or the same file in both), not beside "
                "another distribution"
            )
        path = paths.pop()
        return TokenLengths(pairs=read_pairs(Path(path)), source=path)
    return TokenLengths(
        prompt=parse_dist(prompt, "--prompt-tokens") if prompt is not None else default.prompt,
        output=parse_dist(output, "--output-tokens") if output is not None else default.output,
    )


def read_pairs(path: Path) -> tuple[tuple[int, int], ...]:
    """The (prompt tokens, output tokens) pairs of a JSON-lines file; blank lines are
    skipped. ValueError naming the file and the line that is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read lengths file {str(path)!r}: {exc.strerror}") from None
    pairs: list[tuple[int, int]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        pairs.append(_pair(line, f"line {number} of lengths file {str(path)!r}"))
        if len(pairs) > MAX_PAIRS:
            raise ValueError(f"lengths file {str(path)!r} holds over {MAX_PAIRS} pairs")
    if not pairs:
        raise ValueError(f"lengths file {str(path)!r} holds no pairs")
    return tuple(pairs)


def _pair(line: str, where: str) -> tuple[int, int]:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON: {exc.msg}") from None
    if not isinstance(entry, dict) or {"prompt_tokens", "output_tokens"} - set(entry):
        raise ValueError(f"{where} must be an object with prompt_tokens and output_tokens")
    values = (entry["prompt_tokens"], entry["output_tokens"])
    if not all(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_TOKENS for v in values
    ):
        raise ValueError(f"{where}: token counts must be whole numbers 1 to {MAX_TOKENS}")
    return values[0], values[1]


DEFAULT_LENGTHS = TokenLengths(prompt=Fixed(tokens=256), output=Fixed(tokens=128))
