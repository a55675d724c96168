"""Request protocols: bodies and paths on the wire (v2, template, reference), headers,
full endpoint URLs, and the warm-up stopping at once on a target that refuses. The
targets are in-process aiohttp apps on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from batchpilot.loadgen.endpoints import base_of, endpoint_url
from batchpilot.loadgen.generator import run_load
from batchpilot.loadgen.protocols import (
    REFERENCE,
    in_force,
    kserve_v2,
    openai,
    parse_headers,
    speaking,
    template_protocol,
    v2_body,
)
from batchpilot.loadgen.warmup import RejectedError, closed_loop_rate
from batchpilot.models import RequestMix


def test_v2_body_is_one_fp32_tensor_shaped_from_the_size() -> None:
    body = json.loads(v2_body(3, input_name="x", features=2))
    assert body == {
        "inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [1.0] * 6}]
    }


def test_v2_protocol_path_and_headers() -> None:
    protocol = kserve_v2("resnet", version="2", headers={"Authorization": "Bearer t"})
    assert protocol.path == "/v2/models/resnet/versions/2/infer"
    assert protocol.headers == {"Content-Type": "application/json", "Authorization": "Bearer t"}
    assert kserve_v2("m").path == "/v2/models/m/infer"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: kserve_v2("a/b"), "model name 'a/b'"),
        (lambda: kserve_v2("m", datatype="INT8"), "datatype 'INT8' is not one of FP32, FP64"),
        (lambda: v2_body(0), "size and features must be >= 1"),
        (lambda: template_protocol('{"n": 1}', path="/p"), "no {size} placeholder"),
        (lambda: template_protocol('{"n": {size}', path="/p"), "not valid JSON"),
        (lambda: template_protocol('{"n": {size}}', path="p"), "must start with '/'"),
    ],
)
def test_bad_protocol_arguments_say_what_is_wrong(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        call()


def test_openai_prompts_are_size_words_and_max_tokens_caps_the_answer() -> None:
    completions = openai("llama", max_tokens=32)
    assert completions.path == "/v1/completions"
    assert json.loads(completions.body(3)) == {
        "model": "llama",
        "max_tokens": 32,
        "prompt": "hello hello hello",
    }
    chat = openai("llama", chat=True)
    assert chat.path == "/v1/chat/completions"
    assert json.loads(chat.body(2)) == {
        "model": "llama",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello hello"}],
    }
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        openai("llama", max_tokens=0)


def test_template_puts_the_size_in() -> None:
    protocol = template_protocol('{"instances": [[{size}]]}', path="/v1/models/m:predict")
    assert protocol.body(7) == b'{"instances": [[7]]}'


def test_a_body_template_without_a_size_is_one_sample_body_for_every_size() -> None:
    from batchpilot.loadgen.protocol_option import build_protocol

    protocol = build_protocol(
        protocol=None, model=None, max_tokens=None, input_name=None, features=None,
        body_template='{"text": "hello"}', headers=(), path="/predict",
    )  # fmt: skip
    assert (protocol.name, protocol.path) == ("template", "/predict")
    assert protocol.body(1) == protocol.body(64) == b'{"text": "hello"}'


def test_a_content_type_header_replaces_the_json_default() -> None:
    protocol = template_protocol(
        '{"n": {size}}', path="/p", headers={"content-type": "application/x-custom"}
    )
    assert dict(protocol.headers) == {"content-type": "application/x-custom"}


def test_headers_are_parsed_and_malformed_ones_named() -> None:
    assert parse_headers(["X-A: 1", "Authorization:Bearer a:b"]) == {
        "X-A": "1",
        "Authorization": "Bearer a:b",
    }
    with pytest.raises(ValueError, match="'no-colon' is not NAME:VALUE"):
        parse_headers(["no-colon"])
    with pytest.raises(ValueError, match="is not NAME:VALUE"):
        parse_headers(["bad name: 1"])


def test_a_full_endpoint_url_is_used_as_it_is() -> None:
    assert str(endpoint_url("http://h:1", "/v1/predict")) == "http://h:1/v1/predict"
    assert str(endpoint_url("http://h:1/v1/predict", "/v1/predict")) == "http://h:1/v1/predict"
    # a prefix (a proxy path) is kept and the path appended
    assert str(endpoint_url("http://h:1/svc", "/v1/predict")) == "http://h:1/svc/v1/predict"
    assert base_of("http://h:1/v1/predict/", "/v1/predict") == "http://h:1"
    assert base_of("http://h:1/svc", "/v1/predict") == "http://h:1/svc"


def test_no_protocol_is_in_force_outside_a_block() -> None:
    assert in_force() is None
    with speaking(REFERENCE):
        assert in_force() is REFERENCE
    assert in_force() is None


@dataclass
class Recorder:
    status: Callable[[int], int] = lambda n: 200
    seen: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, await request.read(), dict(request.headers)))
        status = self.status(len(self.seen))
        return web.Response(status=status, text="no such model\nsecond line")


@pytest.fixture
async def target() -> AsyncIterator[tuple[Recorder, str]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield recorder, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_run_load_sends_the_protocol_in_force(target: tuple[Recorder, str]) -> None:
    recorder, url = target
    protocol = kserve_v2("m", features=2, headers={"X-Tenant": "a"})
    with speaking(protocol):
        result = await run_load(
            url, rate=200, duration_s=0.1, mix=RequestMix.uniform(2), timeout_s=2.0, seed=1
        )
    assert result.requests > 0
    assert recorder.seen
    for path, body, headers in recorder.seen:
        assert path == "/v2/models/m/infer"
        assert json.loads(body)["inputs"][0]["shape"] == [2, 2]
        assert headers["X-Tenant"] == "a"
        assert headers["Content-Type"] == "application/json"


async def test_run_load_without_a_protocol_sends_the_reference_body(
    target: tuple[Recorder, str],
) -> None:
    recorder, url = target
    await run_load(url, rate=100, duration_s=0.05, mix=RequestMix.uniform(3), timeout_s=2.0)
    assert {(path, body) for path, body, _ in recorder.seen} == {
        ("/v1/predict", b'{"synthetic": {"size": 3}}')
    }


async def test_warmup_stops_at_the_first_refusal_with_status_url_and_first_line(
    target: tuple[Recorder, str],
) -> None:
    recorder, url = target
    recorder.status = lambda n: 404
    wrong: Callable[[], Awaitable[float]] = lambda: closed_loop_rate(  # noqa: E731
        url, concurrency=4, duration_s=30.0, mix=RequestMix.uniform(1), timeout_s=2.0
    )
    with pytest.raises(RejectedError) as caught:
        await wrong()
    assert str(caught.value) == (
        f"the target answered HTTP 404 to POST {url}/v1/predict: no such model"
    )
    # it stopped at once rather than after its 30 s: at most one round of requests
    assert len(recorder.seen) <= 4


async def test_warmup_counts_errors_after_a_success_as_load(
    target: tuple[Recorder, str],
) -> None:
    recorder, url = target
    recorder.status = lambda n: 200 if n == 1 else 503
    rate = await closed_loop_rate(
        url, concurrency=1, duration_s=0.2, mix=RequestMix.uniform(1), timeout_s=2.0
    )
    assert rate > 0
    assert len(recorder.seen) > 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--protocol", "v2"], "--protocol v2 needs --model"),
        (
            ["--model", "m"],
            "--model applies to --protocol v2 or openai or openai-chat or openai-stream or "
            "openai-chat-stream, not reference",
        ),
        (["--protocol", "v2", "--model", "m", "--max-tokens", "4"], "--max-tokens applies to"),
        (["--protocol", "openai", "--model", "m", "--features", "2"], "--features applies to"),
        (["--protocol", "openai-chat"], "--protocol openai-chat needs --model"),
        (["--protocol", "v2", "--model", "m", "--path", "/x"], "--path is set by --protocol v2"),
        (
            ["--protocol", "v2", "--model", "m", "--body-template", '{"n": {size}}'],
            "--body-template applies to --protocol template, not v2",
        ),
        (["--protocol", "template"], "needs --body-template"),
        (["--body-template", '{"n": {size}'], "the body template is not valid JSON"),
        (["--header", "oops"], "'oops' is not NAME:VALUE"),
        (["--protocol", "grpc"], "'grpc' is not one of"),
        (
            ["--protocol", "openai", "--model", "m", "--ttft-p99-ms", "100"],
            "--ttft-p99-ms applies to --protocol openai-stream or openai-chat-stream, not openai",
        ),
        (
            ["--protocol", "openai-stream", "--model", "m", "--max-tokens", "4"],
            "--max-tokens applies to --protocol openai or openai-chat, not openai-stream",
        ),
        (["--protocol", "openai-stream"], "--protocol openai-stream needs --model"),
        (
            ["--protocol", "openai-stream", "--model", "m", "--mix", "1:4"],
            "--mix applies to sized requests, not --protocol openai-stream",
        ),
        (
            ["--protocol", "openai-stream", "--model", "m", "--prompt-tokens", "uniform:9-3"],
            "--prompt-tokens 'uniform:9-3': uniform's LO 9 is above its HI 3; allowed: fixed:N, "
            "uniform:LO-HI, lognormal:MEDIAN,SIGMA or file:PATH",
        ),
        (
            ["--protocol", "openai-chat-stream", "--model", "m", "--output-tokens", "gamma:2"],
            "--output-tokens 'gamma:2' is not one of: fixed:N, uniform:LO-HI",
        ),
        (
            ["--protocol", "openai-stream", "--model", "m", "--tpot-p99-ms", "0"],
            "Invalid value for '--tpot-p99-ms'",
        ),
    ],
)
def test_loadtest_refuses_protocol_options_that_do_not_fit(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from batchpilot.loadgen.cli import loadtest

    done = CliRunner().invoke(
        loadtest, ["http://127.0.0.1:9", "--rate", "1", "--duration", "1", *args]
    )
    assert done.exit_code != 0, done.output
    assert message in done.output


def test_protocol_options_build_each_protocol() -> None:
    from batchpilot.loadgen.protocol_option import build_protocol

    none: dict[str, object] = {
        "protocol": None,
        "model": None,
        "max_tokens": None,
        "input_name": None,
        "features": None,
        "body_template": None,
        "headers": (),
        "path": None,
    }
    assert build_protocol(**none) is REFERENCE  # type: ignore[arg-type]
    v2 = build_protocol(**{**none, "protocol": "v2", "model": "m", "features": 4})  # type: ignore[arg-type]
    assert v2.path == "/v2/models/m/infer"
    assert json.loads(v2.body(2))["inputs"][0]["shape"] == [2, 4]
    template = build_protocol(**{**none, "body_template": '{"n": {size}}', "path": "/p"})  # type: ignore[arg-type]
    assert (template.name, template.path, template.body(5)) == ("template", "/p", b'{"n": 5}')
    chat = build_protocol(**{**none, "protocol": "openai-chat", "model": "m", "max_tokens": 3})  # type: ignore[arg-type]
    assert chat.path == "/v1/chat/completions"
    assert json.loads(chat.body(2))["max_tokens"] == 3
    reference = build_protocol(**{**none, "headers": ("X-A: 1",)})  # type: ignore[arg-type]
    assert reference.path == "/v1/predict"
    assert reference.headers["X-A"] == "1"
