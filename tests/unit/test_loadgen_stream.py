"""Token-stream load against a real HTTP server whose timing is known (tokenserver): TTFT,
ITL and TPOT come out as the server paced them, token counts exactly, goodput counts
exactly the requests that met both targets, and broken streams are errors by kind.

The timing bounds are the server's sleeps with a wide margin for a busy machine; they
bound what the server did, never how fast the client is."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from loopback import serving

from batchpilot.loadgen.arrivals import as_arrival, schedule
from batchpilot.loadgen.cli import loadtest
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.lengths import Fixed, LogNormal, TokenLengths, draw_lengths
from batchpilot.loadgen.protocols import openai_stream, speaking
from batchpilot.loadgen.result import LoadResult
from batchpilot.loadgen.tokens import StreamSummary, TokenSla
from batchpilot.loadgen.workers import run_load_workers
from batchpilot.models import RequestMix
from support.tokenserver import SLOW_DECODE_EVERY, SLOW_FIRST_EVERY, TokenServer, serving_in_thread

RATE = 20.0
DURATION_S = 1.0
SEED = 3
OUTPUT = 8
# the stream protocols draw lengths instead: the mix is not used
MIX = RequestMix.default()
LENGTHS = TokenLengths(prompt=Fixed(tokens=16), output=Fixed(tokens=OUTPUT))


def _count() -> int:
    return len(schedule(RATE, DURATION_S, as_arrival("constant"), SEED))


async def _run(
    server: TokenServer,
    model: str,
    *,
    lengths: TokenLengths = LENGTHS,
    chat: bool = False,
    sla: TokenSla | None = None,
    workers: int = 0,
) -> LoadResult:
    protocol = openai_stream(model, lengths=lengths, chat=chat, sla=sla)
    async with serving(server.app()) as url:
        with speaking(protocol):
            if workers:
                return await run_load_workers(
                    url, workers=workers, rate=RATE, duration_s=DURATION_S, mix=MIX,
                    arrival="constant", timeout_s=5.0, seed=SEED,
                )  # fmt: skip
            return await run_load(
                url, rate=RATE, duration_s=DURATION_S, mix=MIX, arrival="constant",
                timeout_s=5.0, seed=SEED,
            )  # fmt: skip


def _stream(result: LoadResult) -> StreamSummary:
    assert result.stream is not None
    return result.stream


async def test_ttft_itl_and_tpot_are_the_servers_pacing() -> None:
    server = TokenServer()
    result = await _run(server, "m")
    n = _count()
    assert (result.ok, result.errors) == (n, {})
    stream = _stream(result)
    assert (stream.streams, stream.output_tokens) == (n, OUTPUT * n)
    assert stream.output_tokens_per_s == pytest.approx(OUTPUT * n / DURATION_S)
    # one TTFT and one TPOT a request, a gap between each two of its tokens
    assert (stream.ttft.count, stream.tpot.count, stream.itl.count) == (n, n, (OUTPUT - 1) * n)
    # the server sleeps 40 ms before the first token and 10 ms before each next one
    assert 35.0 <= stream.ttft.p50_ms <= 80.0
    assert 8.0 <= stream.itl.p50_ms <= 25.0
    assert 9.0 <= stream.tpot.p50_ms <= 25.0
    assert result.latency.p50_ms >= 40.0 + 10.0 * (OUTPUT - 1)
    # no target: every whole stream is good
    assert stream.good == n
    assert stream.ttft_p99_met is None
    assert stream.tpot_p99_met is None


async def test_requests_ask_for_their_drawn_lengths_and_a_streamed_usage() -> None:
    server = TokenServer()
    lengths = TokenLengths(
        prompt=LogNormal(median=20, sigma=0.5), output=LogNormal(median=6, sigma=0.5)
    )
    result = await _run(server, "m", lengths=lengths)
    n = _count()
    drawn = draw_lengths(lengths, n, SEED)
    assert result.ok == n
    assert _stream(result).output_tokens == sum(o for _, o in drawn)
    by_position = {int(b["prompt"].split()[0]): b for b in server.bodies}
    assert sorted(by_position) == list(range(n))
    for k, (prompt, output) in enumerate(drawn):
        body = by_position[k]
        assert len(body["prompt"].split()) == prompt
        assert (body["max_tokens"], body["min_tokens"]) == (output, output)
        assert body["ignore_eos"] is True
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("model", "itls"),
    [
        ("m-nousage", OUTPUT - 1),  # tokens counted from the chunks
        ("m-pairs", OUTPUT // 2 - 1),  # two tokens a chunk: usage counts them
    ],
)
async def test_output_tokens_come_from_usage_else_the_chunks(model: str, itls: int) -> None:
    result = await _run(TokenServer(), model)
    n = _count()
    stream = _stream(result)
    assert result.ok == n
    assert stream.output_tokens == OUTPUT * n
    assert stream.itl.count == itls * n


async def test_chat_streams_are_read_from_their_deltas() -> None:
    server = TokenServer()
    result = await _run(server, "m", chat=True)
    n = _count()
    assert result.ok == n
    assert _stream(result).output_tokens == OUTPUT * n
    assert all(b["messages"][0]["role"] == "user" for b in server.bodies)


def _expected_good(n: int, *, tpot: bool) -> int:
    return sum(
        1
        for k in range(n)
        if k % SLOW_FIRST_EVERY != 0 and not (tpot and k % SLOW_DECODE_EVERY == 0)
    )


@pytest.mark.parametrize("with_tpot", [True, False])
async def test_goodput_counts_exactly_the_requests_within_both_targets(with_tpot: bool) -> None:
    # every 4th request's first token comes after 200 ms, every 5th decodes at 60 ms a token
    sla = TokenSla(ttft_ms=120.0, tpot_ms=40.0 if with_tpot else None)
    result = await _run(TokenServer(), "m-slow", sla=sla)
    n = _count()
    stream = _stream(result)
    assert result.ok == n
    assert stream.good == _expected_good(n, tpot=with_tpot)
    assert stream.goodput_rps == pytest.approx(stream.good / DURATION_S)
    # a quarter of the first tokens are late: the p99 breaks its target
    assert stream.ttft_p99_met is False
    assert stream.tpot_p99_met is (False if with_tpot else None)


@pytest.mark.parametrize(
    ("model", "kind"),
    [
        ("m-nodone", "stream_incomplete"),
        ("m-error", "stream_error"),
        ("m-malformed", "stream_malformed"),
        ("m-empty", "stream_empty"),
        ("m-abort", "connection"),
        ("m-400", "400"),
        ("m-500", "500"),
    ],
)
async def test_broken_streams_are_errors_by_kind(model: str, kind: str) -> None:
    result = await _run(TokenServer(), model)
    n = _count()
    assert (result.ok, result.requests, result.errors) == (0, n, {kind: n})
    stream = _stream(result)
    assert (stream.streams, stream.output_tokens, stream.ttft.count) == (0, 0, 0)


async def test_two_load_processes_share_the_stream_schedule_and_its_targets() -> None:
    server = TokenServer()
    sla = TokenSla(ttft_ms=120.0, tpot_ms=40.0)
    result = await _run(server, "m-slow", sla=sla, workers=2)
    n = _count()
    stream = _stream(result)
    assert len(result.worker_clients) == 2
    assert (result.ok, stream.streams, stream.output_tokens) == (n, n, OUTPUT * n)
    assert (stream.ttft.count, stream.itl.count) == (n, (OUTPUT - 1) * n)
    # each request sent once, by one of the two, with the lengths of the one schedule
    assert sorted(int(b["prompt"].split()[0]) for b in server.bodies) == list(range(n))
    assert {b["max_tokens"] for b in server.bodies} == {OUTPUT}
    # the targets travelled with the shares: each process judged its own requests
    assert stream.sla == sla
    assert stream.good == _expected_good(n, tpot=True)
    assert 35.0 <= stream.ttft.p50_ms <= 80.0


def test_loadtest_reports_the_token_figures_in_json_and_in_its_table(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt_tokens": 12, "output_tokens": 5}\n')
    server = TokenServer()
    args = [
        "--rate", str(RATE), "--duration", str(DURATION_S), "--arrival", "constant",
        "--seed", str(SEED), "--protocol", "openai-stream", "--model", "m-slow",
        "--prompt-tokens", f"file:{pairs}", "--ttft-p99-ms", "120", "--tpot-p99-ms", "40",
    ]  # fmt: skip
    with serving_in_thread(server.app()) as url:
        as_json = CliRunner().invoke(loadtest, [url, *args, "--json"])
        table = CliRunner().invoke(loadtest, [url, *args], env={"COLUMNS": "200"})
    assert as_json.exit_code == 0, as_json.output
    result = LoadResult.model_validate_json(as_json.output)
    n = _count()
    stream = _stream(result)
    assert (result.ok, stream.output_tokens) == (n, 5 * n)
    assert stream.sla == TokenSla(ttft_ms=120.0, tpot_ms=40.0)
    assert stream.good == _expected_good(n, tpot=True)
    assert json.loads(as_json.output)["stream"]["goodput_rps"] == stream.goodput_rps
    assert {len(b["prompt"].split()) for b in server.bodies} == {12}
    assert table.exit_code == 0, table.output
    for row in ("TTFT p50 / p90 / p99", "ITL p50 / p99", "TPOT p50 / p99", "output tokens"):
        assert row in table.output
    # the table comes from a run of its own: a busy machine may only make a request late
    judged = re.search(
        rf"\((\d+) of {n}; TTFT ≤ 120 ms \(p99 broken\), TPOT ≤ 40 ms \(p99 broken\)\)",
        table.output,
    )
    assert judged is not None, table.output
    assert 0 < int(judged[1]) <= _expected_good(n, tpot=True)
