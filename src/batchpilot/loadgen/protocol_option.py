"""The request-protocol options shared by commands that send load: --protocol, --model,
--max-tokens, --input-name, --features, --body-template, --header, --ca-bundle, the --path
they may replace, and the token-stream protocols' --prompt-tokens, --output-tokens,
--ttft-p99-ms and --tpot-p99-ms; `tune` takes the same vocabulary, its requests otherwise
the runtime's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from batchpilot.loadgen.lengths import DEFAULT_LENGTHS, LENGTHS_SYNTAX, describe_dist, parse_lengths
from batchpilot.loadgen.protocols import (
    APPLIES_TO,
    REFERENCE,
    REFERENCE_PATH,
    STREAM_PROTOCOLS,
    RequestProtocol,
    body_template_text,
    kserve_v2,
    openai,
    openai_stream,
    parse_headers,
    template_protocol,
)
from batchpilot.loadgen.tokens import TokenSla

PROTOCOLS = ("reference", "v2", "openai", "openai-chat", *STREAM_PROTOCOLS, "template")
F = TypeVar("F", bound=Callable[..., Any])


# how loadtest judges the TTFT and TPOT targets
_REPORTED = (
    "goodput counts the requests within it (and --tpot-p99-ms), the report says whether the p99 is"
)


def _stream_options(judged: str = _REPORTED) -> list[Callable[[F], F]]:
    """The token-stream protocols' options: lengths and the TTFT and TPOT targets
    (`judged`: what the command does with them)."""
    return [
        click.option(
            "--prompt-tokens",
            default=None,
            metavar="DIST",
            help="openai-stream, openai-chat-stream: each request's prompt length in tokens "
            f"(about one word a token): {LENGTHS_SYNTAX}; a file gives both lengths "
            f"[default {describe_dist(DEFAULT_LENGTHS.prompt)}].",
        ),
        click.option(
            "--output-tokens",
            default=None,
            metavar="DIST",
            help="openai-stream, openai-chat-stream: each request's output length, asked "
            "with max_tokens = min_tokens and ignore_eos: same forms as --prompt-tokens "
            f"[default {describe_dist(DEFAULT_LENGTHS.output)}].",
        ),
        click.option(
            "--ttft-p99-ms",
            type=click.FloatRange(0, None, min_open=True),
            default=None,
            help="openai-stream, openai-chat-stream: the time-to-first-token target, ms: "
            f"{judged}.",
        ),
        click.option(
            "--tpot-p99-ms",
            type=click.FloatRange(0, None, min_open=True),
            default=None,
            help="openai-stream, openai-chat-stream: the time-per-output-token target, "
            "judged like --ttft-p99-ms.",
        ),
    ]


def _applying(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """A decorator applying `options` in order (the first is the first in --help)."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


# the --protocol choices of a command whose requests are otherwise the runtime's own
RUNTIME_PROTOCOLS = ("v2", "openai", "openai-chat", *STREAM_PROTOCOLS)


def _tensor_options() -> list[Callable[[F], F]]:
    """--input-name and --features: one FP32 tensor described by hand."""
    return [
        click.option(
            "--input-name",
            default=None,
            help="v2: send one FP32 tensor of this name instead of the inputs the model's "
            "metadata declares [default: from the metadata; INPUT with --features].",
        ),
        click.option(
            "--features",
            type=click.IntRange(1, 65_536),
            default=None,
            help="v2: values per item (the tensor is [size, features]) [default 1].",
        ),
    ]


def _max_tokens_option() -> Callable[[F], F]:
    return click.option(
        "--max-tokens",
        type=click.IntRange(1, 1_000_000),
        default=None,
        help="openai, openai-chat: max_tokens of every request [default 16].",
    )


def runtime_protocol_options(judged: str) -> Callable[[F], F]:
    """--protocol, --max-tokens, the token-stream options, --input-name and --features, for
    a command whose requests are the runtime's own unless these say otherwise (`tune`,
    which has its own --model, --body-template, --header and --ca-bundle); the command
    receives protocol, max_tokens, prompt_tokens, output_tokens, ttft_p99_ms,
    tpot_p99_ms, input_name and features, and builds the protocol with `build_protocol`.
    `judged`: how the command judges the TTFT and TPOT targets, for their help."""
    options = [
        click.option(
            "--protocol",
            type=click.Choice(RUNTIME_PROTOCOLS, case_sensitive=False),
            default=None,
            help="Send these requests instead of the runtime's own: v2 (KServe v2 "
            "inference of --model, with --input-name/--features one FP32 tensor [size, "
            "features]), openai or openai-chat (completions with a prompt of size words), "
            "openai-stream or openai-chat-stream (streamed completions: TTFT, TPOT, goodput "
            "and output tokens/s measured, lengths from --prompt-tokens/--output-tokens) "
            "[default: the runtime's own requests, built from the model's metadata for "
            "Triton and MLServer; v2 with --input-name or --features].",
        ),
        _max_tokens_option(),
        *_stream_options(judged),
        *_tensor_options(),
    ]

    return _applying(options)


def protocol_options(judged: str = _REPORTED) -> Callable[[F], F]:
    """The options; the command receives protocol, model, max_tokens, prompt_tokens,
    output_tokens, ttft_p99_ms, tpot_p99_ms, input_name, features, body_template,
    headers, ca_bundle and path, and builds the protocol with `build_protocol`.
    `judged`: how the command judges the TTFT and TPOT targets, for their help."""
    options = [
        click.option(
            "--protocol",
            type=click.Choice(PROTOCOLS, case_sensitive=False),
            default=None,
            help="Request protocol: reference (the reference server's synthetic body), v2 "
            "(KServe v2 / Triton HTTP inference: the inputs the model's metadata declares, "
            "or with --input-name/--features one FP32 tensor [size, features]), openai "
            "or openai-chat (completions with a prompt of size words), openai-stream or "
            "openai-chat-stream (streamed completions: TTFT, ITL, TPOT, output tokens/s and "
            "goodput, lengths from --prompt-tokens/--output-tokens) or template "
            "(--body-template) [default reference, template with --body-template].",
        ),
        click.option(
            "--model", default=None, help="v2: the model in the path; openai: the model field."
        ),
        _max_tokens_option(),
        *_stream_options(judged),
        *_tensor_options(),
        click.option(
            "--body-template",
            default=None,
            metavar="JSON|FILE",
            help="A JSON body, or a file holding one, {size} standing for each request's "
            "size, e.g. '{\"instances\": [[{size}]]}' (sent to --path); without {size} every "
            "request sends this body.",
        ),
        click.option(
            "--header",
            "headers",
            multiple=True,
            help="Extra request header NAME:VALUE (repeatable).",
        ),
        click.option(
            "--ca-bundle",
            type=click.Path(dir_okay=False),
            default=None,
            help="https: trust only the CA certificates in this PEM file [default: the "
            "system's trust store]. Certificates are always verified.",
        ),
        click.option(
            "--path",
            default=None,
            help=f"Request path [default {REFERENCE_PATH}; v2: /v2/models/MODEL/infer].",
        ),
    ]

    return _applying(options)


def build_protocol(
    *,
    protocol: str | None,
    model: str | None,
    max_tokens: int | None,
    input_name: str | None,
    features: int | None,
    body_template: str | None,
    headers: Sequence[str],
    path: str | None,
    prompt_tokens: str | None = None,
    output_tokens: str | None = None,
    ttft_p99_ms: float | None = None,
    tpot_p99_ms: float | None = None,
) -> RequestProtocol:
    """The protocol the options describe (all but --ca-bundle: `with_ca_bundle`).
    ValueError names the option that is wrong and what is allowed."""
    kind = (protocol or ("template" if body_template is not None else "reference")).lower()
    given = {
        "--model": model,
        "--input-name": input_name,
        "--features": features,
        "--max-tokens": max_tokens,
        "--body-template": body_template,
        "--prompt-tokens": prompt_tokens,
        "--output-tokens": output_tokens,
        "--ttft-p99-ms": ttft_p99_ms,
        "--tpot-p99-ms": tpot_p99_ms,
    }
    for flag, value in given.items():
        allowed = APPLIES_TO[flag]
        if value is not None and kind not in allowed:
            raise ValueError(f"{flag} applies to --protocol {' or '.join(allowed)}, not {kind}")
    if path is not None and not path.startswith("/"):
        raise ValueError(f"--path must start with '/', got {path!r}")
    extra = parse_headers(headers)
    if kind == "v2":
        if model is None:
            raise ValueError("--protocol v2 needs --model (the model name in the path)")
        if path is not None:
            raise ValueError("--path is set by --protocol v2 (/v2/models/MODEL/infer)")
        return kserve_v2(
            model, input_name=input_name or "INPUT", features=features or 1, headers=extra
        )
    if kind in STREAM_PROTOCOLS:
        if model is None:
            raise ValueError(f"--protocol {kind} needs --model (the request's model field)")
        if path is not None:
            raise ValueError(f"--path is set by --protocol {kind}")
        return openai_stream(
            model,
            lengths=parse_lengths(prompt_tokens, output_tokens, default=DEFAULT_LENGTHS),
            chat=kind == "openai-chat-stream",
            sla=TokenSla(ttft_ms=ttft_p99_ms, tpot_ms=tpot_p99_ms),
            headers=extra,
        )
    if kind in ("openai", "openai-chat"):
        if model is None:
            raise ValueError(f"--protocol {kind} needs --model (the request's model field)")
        if path is not None:
            raise ValueError(f"--path is set by --protocol {kind}")
        chat = kind == "openai-chat"
        return openai(model, max_tokens=max_tokens or 16, chat=chat, headers=extra)
    if kind == "template":
        if body_template is None:
            raise ValueError("--protocol template needs --body-template")
        return template_protocol(
            body_template_text(body_template),
            path=path or REFERENCE_PATH,
            headers=extra,
            require_size=False,
        )
    if path is None and not extra:
        return REFERENCE
    return RequestProtocol(
        "reference",
        path or REFERENCE_PATH,
        REFERENCE.body,
        {**REFERENCE.headers, **extra},
    )


def with_ca_bundle(request: RequestProtocol, ca_bundle: str | None) -> RequestProtocol:
    """`request` verifying https against only the CA certificates in file `ca_bundle`
    (None: as it is). ValueError, before any load, when the file is not a PEM bundle."""
    if ca_bundle is None:
        return request
    request = dataclasses.replace(request, ca_file=ca_bundle)
    try:
        request.tls()
    except ValueError as exc:
        raise ValueError(f"--ca-bundle: {exc}") from None
    return request


def reads_metadata(*, protocol: str | None, input_name: str | None, features: int | None) -> bool:
    """Whether `--protocol v2` builds its requests from the model's metadata: unless
    --input-name or --features describe the tensor by hand."""
    return (protocol or "").lower() == "v2" and input_name is None and features is None


# what to give when a server refuses the requests, per --protocol
_REFUSAL_FLAGS = {
    "reference": "--protocol v2 --model M (requests from the model's metadata) or "
    "--body-template (a body of the model's own), and --path",
    "v2": "--input-name and --features (one FP32 tensor) or --body-template (a body of the "
    "model's own)",
    "openai": "--model and --max-tokens, or --body-template, and --path",
    "openai-stream": "--model, --prompt-tokens and --output-tokens",
    "template": "--body-template and --path",
}


def refusal_hint(protocol: str | None, body_template: str | None = None) -> str:
    """The flags that set the requests of `--protocol protocol`, for a message about a
    server that refused them."""
    kind = (protocol or ("template" if body_template is not None else "reference")).lower()
    key = {"openai-chat": "openai", "openai-chat-stream": "openai-stream"}.get(kind, kind)
    return _REFUSAL_FLAGS[key]
