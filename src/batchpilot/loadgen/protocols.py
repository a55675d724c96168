"""What a request looks like on the wire: the endpoint path, the body for a request of a
given size, and the headers. The reference server's synthetic body is the default; an
inference runtime speaks its own (the KServe v2 / Triton HTTP inference protocol, a raw
JSON template), chosen by its adapter (`batchpilot.runtimes`) or on the command line.

A protocol is put in force for a block of code (`speaking`) rather than passed down
every call: the capacity search, its warm-up and every step inside the block then send
that protocol's requests, and the code in between stays free of it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType

from batchpilot.loadgen.lengths import TokenLengths
from batchpilot.loadgen.streaming import OpenAIStream
from batchpilot.loadgen.tokens import TokenSla
from batchpilot.tls import verifying_context

JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
REFERENCE_PATH = "/v1/predict"
CA_BUNDLE = "the load's CA bundle"
# A CA bundle is sent to every load worker with each share: a few certificates are a few
# KiB, and even a whole public trust store is about 230 KiB.
MAX_CA_BUNDLE_BYTES = 1024 * 1024
SIZE_PLACEHOLDER = "{size}"
# The v2 protocol's tensor datatypes a float input may take.
V2_DATATYPES = ("FP32", "FP64")


def synthetic_body(size: int) -> bytes:
    """The reference server's synthetic request: it fabricates an input of `size` items."""
    return json.dumps({"synthetic": {"size": size}}).encode()


@dataclass(frozen=True)
class RequestProtocol:
    """How every request of a run is sent: POST `path` (appended to each base URL)
    with `body(size)` and `headers`. https URLs are always verified: against the
    system's trust store, or only against the CA certificates in the PEM file `ca_file`
    or the PEM text `ca_pem` (a server behind a private CA), for the URL's host or for
    `server_name` when it is set."""

    name: str
    path: str
    body: Callable[[int], bytes]
    headers: Mapping[str, str] = field(default_factory=lambda: JSON_HEADERS)
    ca_file: str | None = None
    # what a load worker got from its sender, which read it from its own file
    ca_pem: str | None = field(default=None, repr=False)
    # The name https certificates are verified against and sent as SNI, where the URLs
    # reach the server by an address its certificate does not carry (a pod IP).
    server_name: str | None = None
    # A token-stream run (`loadgen.streaming`): each request's body is built from its
    # drawn lengths and position, and `body` is not used.
    stream: OpenAIStream | None = None

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"request path must start with '/', got {self.path!r}")

    def tls(self) -> ssl.SSLContext | bool:
        """What the client's connector verifies https with (True: the system's trust
        store). ValueError when the CA bundle is not a usable PEM bundle."""
        if self.ca_file is None and self.ca_pem is None:
            return True
        return verifying_context(ca_pem=self.ca_pem, ca_file=self.ca_file, what=CA_BUNDLE)

    def ca_bundle_pem(self) -> str | None:
        """The CA bundle's PEM text (None: the system's trust store), as it is sent to
        load workers. ValueError when its file cannot be read or is over
        MAX_CA_BUNDLE_BYTES."""
        if self.ca_pem is not None or self.ca_file is None:
            return self.ca_pem
        try:
            with open(self.ca_file, "rb") as bundle:
                data = bundle.read(MAX_CA_BUNDLE_BYTES + 1)
        except OSError as exc:
            raise ValueError(
                f"{CA_BUNDLE} (file {self.ca_file}) cannot be read: {exc.strerror or exc}"
            ) from None
        if len(data) > MAX_CA_BUNDLE_BYTES:
            raise ValueError(
                f"{CA_BUNDLE} (file {self.ca_file}) is over {MAX_CA_BUNDLE_BYTES} bytes, the "
                "most sent to load workers; give only the CA certificates that sign the target"
            )
        return data.decode("ascii", errors="replace")


def client_tls() -> ssl.SSLContext | bool:
    """The TLS verification of the protocol in force (True: the system's trust store)."""
    protocol = in_force()
    return True if protocol is None else protocol.tls()


def client_server_name() -> str | None:
    """The name the protocol in force verifies https certificates against (None: each
    URL's host)."""
    protocol = in_force()
    return None if protocol is None else protocol.server_name


REFERENCE = RequestProtocol("reference", REFERENCE_PATH, synthetic_body)

_IN_FORCE: ContextVar[RequestProtocol | None] = ContextVar("batchpilot_request_protocol")


def in_force() -> RequestProtocol | None:
    """The protocol put in force around the running code, None when none was."""
    return _IN_FORCE.get(None)


@contextlib.contextmanager
def speaking(protocol: RequestProtocol | None) -> Iterator[None]:
    """Send `protocol`'s requests inside the block (None: leave things as they are).
    Tasks started inside inherit it, as context variables do."""
    if protocol is None:
        yield
        return
    token = _IN_FORCE.set(protocol)
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def v2_path(model: str, version: str | None = None) -> str:
    """The inference endpoint of the KServe v2 / Triton HTTP protocol."""
    _check_name("model name", model)
    if version is None:
        return f"/v2/models/{model}/infer"
    _check_name("model version", version)
    return f"/v2/models/{model}/versions/{version}/infer"


def v2_body(
    size: int,
    *,
    input_name: str = "INPUT",
    features: int = 1,
    datatype: str = "FP32",
) -> bytes:
    """A v2 inference request for `size` items: one input tensor of shape
    [size, features], all ones (the servers batch along the first dimension)."""
    if size < 1 or features < 1:
        raise ValueError(f"size and features must be >= 1, got {size} and {features}")
    if datatype not in V2_DATATYPES:
        raise ValueError(f"datatype {datatype!r} is not one of {', '.join(V2_DATATYPES)}")
    tensor = {
        "name": input_name,
        "shape": [size, features],
        "datatype": datatype,
        "data": [1.0] * (size * features),
    }
    return json.dumps({"inputs": [tensor]}).encode()


def kserve_v2(
    model: str,
    *,
    input_name: str = "INPUT",
    features: int = 1,
    datatype: str = "FP32",
    version: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> RequestProtocol:
    """The KServe v2 / Triton HTTP inference protocol for one model and input tensor."""
    _check_name("input name", input_name)
    v2_body(1, input_name=input_name, features=features, datatype=datatype)  # validates

    def body(size: int) -> bytes:
        return v2_body(size, input_name=input_name, features=features, datatype=datatype)

    return RequestProtocol("v2", v2_path(model, version), body, with_json(headers or {}))


# One word of the generated prompts: a common word that most tokenizers keep as one token.
PROMPT_WORD = "hello"
OPENAI_COMPLETIONS_PATH = "/v1/completions"
OPENAI_CHAT_PATH = "/v1/chat/completions"


def openai_body(size: int, *, model: str, max_tokens: int, chat: bool) -> bytes:
    """An OpenAI-style completion (or chat completion) request whose prompt is `size`
    words, about `size` tokens, asking for at most `max_tokens` tokens back."""
    if size < 1 or max_tokens < 1:
        raise ValueError(f"size and max_tokens must be >= 1, got {size} and {max_tokens}")
    prompt = " ".join([PROMPT_WORD] * size)
    body: dict[str, object] = {"model": model, "max_tokens": max_tokens}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode()


DEFAULT_MAX_TOKENS = 16


def openai(
    model: str,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    chat: bool = False,
    headers: Mapping[str, str] | None = None,
) -> RequestProtocol:
    """OpenAI-style completions (`chat`: chat completions), as vLLM-like servers serve
    them: the mix's sizes are prompt lengths in words, `max_tokens` caps every answer."""
    if not model.strip():
        raise ValueError("the model name must not be empty")
    openai_body(1, model=model, max_tokens=max_tokens, chat=chat)  # validates

    def body(size: int) -> bytes:
        return openai_body(size, model=model, max_tokens=max_tokens, chat=chat)

    return RequestProtocol(
        "openai-chat" if chat else "openai",
        OPENAI_CHAT_PATH if chat else OPENAI_COMPLETIONS_PATH,
        body,
        with_json(headers or {}),
    )


# the token-stream protocols (loadgen.streaming): TTFT, ITL, TPOT and goodput measured
STREAM_PROTOCOLS = ("openai-stream", "openai-chat-stream")

# which protocols each protocol-specific option belongs to
APPLIES_TO = {
    "--model": ("v2", "openai", "openai-chat", *STREAM_PROTOCOLS),
    "--input-name": ("v2",),
    "--features": ("v2",),
    "--max-tokens": ("openai", "openai-chat"),
    "--body-template": ("template",),
    "--prompt-tokens": STREAM_PROTOCOLS,
    "--output-tokens": STREAM_PROTOCOLS,
    "--ttft-p99-ms": STREAM_PROTOCOLS,
    "--tpot-p99-ms": STREAM_PROTOCOLS,
}


def openai_stream(
    model: str,
    *,
    lengths: TokenLengths,
    chat: bool = False,
    sla: TokenSla | None = None,
    headers: Mapping[str, str] | None = None,
) -> RequestProtocol:
    """Streaming OpenAI-style completions (`chat`: chat completions): each request's
    prompt and output lengths drawn from `lengths`, TTFT, ITL and TPOT measured from the
    stream, goodput judged against `sla`."""
    if not model.strip():
        raise ValueError("the model name must not be empty")
    spec = OpenAIStream(model=model, chat=chat, lengths=lengths, sla=sla or TokenSla())
    return RequestProtocol(
        "openai-chat-stream" if chat else "openai-stream",
        OPENAI_CHAT_PATH if chat else OPENAI_COMPLETIONS_PATH,
        _no_sized_body,
        with_json(headers or {}),
        stream=spec,
    )


def _no_sized_body(size: int) -> bytes:
    raise ValueError("a token-stream protocol builds each request from its lengths, not a size")


# the largest body a --body-template file may hold
MAX_BODY_TEMPLATE_BYTES = 1024 * 1024


def body_template_text(value: str) -> str:
    """A --body-template value: the JSON body itself (it starts with '{' or '['), or the
    path of a file holding it. ValueError naming the file when it cannot be read."""
    if value.lstrip().startswith(("{", "[")):
        return value
    try:
        with open(value, "rb") as file:
            data = file.read(MAX_BODY_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ValueError(
            f"--body-template {value}: not JSON (which starts with '{{' or '[') and not a "
            f"file that can be read: {exc.strerror or exc}"
        ) from None
    if len(data) > MAX_BODY_TEMPLATE_BYTES:
        raise ValueError(f"--body-template {value}: over {MAX_BODY_TEMPLATE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--body-template {value}: not UTF-8 text: {exc}") from None


def template_protocol(
    template: str,
    *,
    path: str,
    headers: Mapping[str, str] | None = None,
    require_size: bool = True,
) -> RequestProtocol:
    """A raw JSON body with `{size}` standing for the request's size, e.g.
    '{"instances": [[{size}]]}'. The template must be valid JSON once a size is put in,
    and contain the placeholder unless `require_size` is off (one sample body sent for
    every size)."""
    if require_size and SIZE_PLACEHOLDER not in template:
        raise ValueError(
            f"the body template has no {SIZE_PLACEHOLDER} placeholder for the request size: "
            f"{template[:80]!r}"
        )
    try:
        json.loads(template.replace(SIZE_PLACEHOLDER, "1"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the body template is not valid JSON with {SIZE_PLACEHOLDER} set to 1: {exc}"
        ) from None

    def body(size: int) -> bytes:
        return template.replace(SIZE_PLACEHOLDER, str(size)).encode()

    return RequestProtocol("template", path, body, with_json(headers or {}))


def parse_headers(items: Sequence[str]) -> dict[str, str]:
    """`K:V` pairs (as `--header` takes them) as a mapping. Raises ValueError naming the
    pair that is malformed."""
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            raise ValueError(
                f"header {item!r} is not NAME:VALUE (e.g. 'Authorization: Bearer TOKEN')"
            )
        result[name] = value.strip()
    return result


def with_json(headers: Mapping[str, str]) -> Mapping[str, str]:
    """The headers given, with a JSON content type unless they set their own."""
    merged = dict(JSON_HEADERS)
    if any(k.lower() == "content-type" for k in headers):
        merged = {}
    merged.update(headers)
    return MappingProxyType(merged)


def with_headers(protocol: RequestProtocol, extra: Mapping[str, str]) -> RequestProtocol:
    """`protocol` also sending `extra`, each replacing a header of the same name (any
    case)."""
    if not extra:
        return protocol
    replaced = {name.lower() for name in extra}
    kept = {k: v for k, v in protocol.headers.items() if k.lower() not in replaced}
    return dataclasses.replace(protocol, headers=MappingProxyType({**kept, **extra}))


def _check_name(what: str, name: str) -> None:
    if not name or "/" in name or any(c.isspace() for c in name):
        raise ValueError(f"{what} {name!r} must be non-empty, without '/' or spaces")
