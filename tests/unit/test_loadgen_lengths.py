"""Prompt and output lengths of token-stream requests: seeded draws within their bounds,
pairs files kept as pairs, and specs that do not parse named with the forms allowed."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from pydantic import ValidationError

from batchpilot.loadgen.lengths import (
    DEFAULT_LENGTHS,
    LENGTHS_SYNTAX,
    MAX_TOKENS,
    Fixed,
    LogNormal,
    TokenLengths,
    Uniform,
    draw_lengths,
    parse_dist,
    parse_lengths,
)


def test_the_same_seed_draws_the_same_lengths_and_another_seed_others() -> None:
    lengths = TokenLengths(prompt=Uniform(low=1, high=1000), output=LogNormal(median=64, sigma=1))
    assert draw_lengths(lengths, 500, 7) == draw_lengths(lengths, 500, 7)
    assert draw_lengths(lengths, 500, 7) != draw_lengths(lengths, 500, 8)
    # a prefix of a longer draw: every request keeps its lengths whatever the run's size
    assert draw_lengths(lengths, 100, 7) == draw_lengths(lengths, 500, 7)[:100]


def test_uniform_covers_its_bounds_inclusive_and_fixed_is_fixed() -> None:
    lengths = TokenLengths(prompt=Uniform(low=3, high=6), output=Fixed(tokens=9))
    drawn = draw_lengths(lengths, 2000, 1)
    assert {p for p, _ in drawn} == {3, 4, 5, 6}
    assert {o for _, o in drawn} == {9}


def test_lognormal_centres_on_its_median_within_the_token_bounds() -> None:
    lengths = TokenLengths(
        prompt=LogNormal(median=200, sigma=0.5), output=LogNormal(median=2, sigma=5)
    )
    drawn = draw_lengths(lengths, 20_000, 2)
    prompts = [p for p, _ in drawn]
    assert 190 <= statistics.median(prompts) <= 210
    # a wide spread is held within 1..MAX_TOKENS
    outputs = [o for _, o in drawn]
    assert min(outputs) == 1
    assert max(outputs) == MAX_TOKENS


def test_a_pairs_file_gives_both_lengths_together(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        '{"prompt_tokens": 10, "output_tokens": 1}\n\n{"prompt_tokens": 20, "output_tokens": 2}\n'
    )
    lengths = parse_lengths(f"file:{path}", None, default=DEFAULT_LENGTHS)
    assert lengths.pairs == ((10, 1), (20, 2))
    drawn = draw_lengths(lengths, 200, 0)
    assert set(drawn) == {(10, 1), (20, 2)}
    # the same file in both options is the same pairs
    assert parse_lengths(f"file:{path}", f"file:{path}", default=DEFAULT_LENGTHS) == lengths


def test_parse_takes_each_form_and_defaults_what_is_not_given() -> None:
    assert parse_dist("128", "--x") == Fixed(tokens=128)
    assert parse_dist("fixed:5", "--x") == Fixed(tokens=5)
    assert parse_dist(" uniform:1-10 ", "--x") == Uniform(low=1, high=10)
    assert parse_dist("lognormal:300,0.7", "--x") == LogNormal(median=300, sigma=0.7)
    lengths = parse_lengths(None, "uniform:4-8", default=DEFAULT_LENGTHS)
    assert (lengths.prompt, lengths.output) == (DEFAULT_LENGTHS.prompt, Uniform(low=4, high=8))


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("fixed:0", "a token count must be 1 to"),
        ("fixed:ten", "token counts must be whole numbers"),
        ("uniform:5", "uniform needs LO-HI"),
        ("uniform:9-3", "uniform's LO 9 is above its HI 3"),
        ("lognormal:100", "lognormal needs MEDIAN,SIGMA"),
        ("lognormal:100,0", "SIGMA must be > 0"),
        ("lognormal:100,wide", "SIGMA must be a number"),
        ("lognormal:100,nan", "SIGMA must be > 0"),
        ("gamma:3", "is not one of"),
    ],
)
def test_bad_specs_say_why_and_list_the_allowed_forms(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=r"^--prompt-tokens ") as caught:
        parse_dist(spec, "--prompt-tokens")
    assert reason in str(caught.value)
    assert LENGTHS_SYNTAX in str(caught.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "holds no pairs"),
        ("{oops\n", "line 1 of lengths file"),
        ('{"prompt_tokens": 3}\n', "must be an object with prompt_tokens and output_tokens"),
        ('{"prompt_tokens": 3, "output_tokens": 0}\n', "token counts must be whole numbers"),
        ('{"prompt_tokens": true, "output_tokens": 2}\n', "token counts must be whole numbers"),
        ("[1, 2]\n", "must be an object"),
    ],
)
def test_bad_pairs_files_name_the_line(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match="lengths file") as caught:
        parse_lengths(None, f"file:{path}", default=DEFAULT_LENGTHS)
    assert reason in str(caught.value)


def test_a_pairs_file_beside_another_distribution_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gives both the prompt and the output lengths"):
        parse_lengths(f"file:{tmp_path}/a.jsonl", "fixed:3", default=DEFAULT_LENGTHS)
    with pytest.raises(ValueError, match="gives both"):
        parse_lengths(f"file:{tmp_path}/a", f"file:{tmp_path}/b", default=DEFAULT_LENGTHS)
    with pytest.raises(ValueError, match="cannot read lengths file"):
        parse_lengths(f"file:{tmp_path}/missing.jsonl", None, default=DEFAULT_LENGTHS)


def test_models_refuse_lengths_out_of_bounds() -> None:
    with pytest.raises(ValidationError):
        Fixed(tokens=MAX_TOKENS + 1)
    with pytest.raises(ValidationError):
        LogNormal(median=10, sigma=0)
    with pytest.raises(ValueError, match="need a prompt and an output"):
        draw_lengths(TokenLengths(prompt=Fixed(tokens=1)), 1, 0)
