"""Does the token-stream load measure what AIPerf measures? The time to first token and
the time per output token of `batchpilot loadtest --protocol openai-stream` against NVIDIA
AIPerf's, on the same server, at the same rates and lengths.

The server is the suite's token server (tests/support/tokenserver.py) in a process of its
own: the first token 40 ms after a request arrives, then one every 10 ms, exactly
`max_tokens` of them, whatever the prompt. Both instruments send Poisson arrivals at R
req/s, prompts of P tokens and outputs of O tokens (ignore_eos, min_tokens), N requests a
run; each repeat runs both, the order alternating. AIPerf's `inter_token_latency` is per
request ((end - first token) / (tokens - 1)): that is our TPOT, so TPOT is compared with
it, and TTFT with its `time_to_first_token`, at p50 and p99. A ratio is ours over AIPerf's,
per repeat and of the medians over repeats; the target is every ratio of the medians
within 10 %. Beside both, what the server itself timed over each run (its vLLM-named
histograms, 5 ms buckets, read before and after the run): the tails a client should come
close to, from above.

AIPerf comes from its own environment (scripts/aiperf); without it the run says so and
records nothing. AIPerf builds its prompts with a tokenizer: a word-level one is written
here (nothing is downloaded).

    python benchmarks/genai_accuracy.py [--json] [--rates 10,40] [--repeats 3] \\
        [--requests 200] [--prompt-tokens 32] [--output-tokens 16] [--aiperf DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import results

REPO = Path(__file__).resolve().parents[1]
TOKEN_SERVER = REPO / "tests" / "support" / "tokenserver.py"
AIPERF_VERSION = "0.13.0"
DEFAULT_AIPERF = (
    Path(os.environ.get("BATCHPILOT_CACHE") or Path.home() / ".cache" / "batchpilot")
    / "tools"
    / f"aiperf-{AIPERF_VERSION}"
)
MODEL = "m"  # the token server's plain behaviour
TOLERANCE = 0.10
# ours: the loadtest JSON's stream section; AIPerf: its profile export
METRICS = {
    "ttft": ("ttft", "time_to_first_token"),
    "tpot": ("tpot", "inter_token_latency"),
}
RUN_TIMEOUT_S = 600
# the token server's own histograms of what it timed, by our figure's name
SERVER_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
}


def server_buckets(url: str) -> dict[str, dict[float, float]]:
    """The server's histograms now: figure -> bucket bound (s) -> cumulative count."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, dict[float, float]] = {name: {} for name in SERVER_HISTOGRAMS}
    wanted = {f"{metric}_bucket": name for name, metric in SERVER_HISTOGRAMS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = wanted.get(sample.name)
            if name is not None:
                bound = float(sample.labels["le"])
                found[name][bound] = found[name].get(bound, 0.0) + sample.value
    return found


def quantile_ms(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """The q-quantile, ms, of what was observed between two readings of a histogram,
    interpolated linearly within its bucket (as PromQL's histogram_quantile)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower * 1000.0
            inside = cumulative - below
            share = (rank - below) / inside if inside else 0.0
            return (lower + (bound - lower) * share) * 1000.0
        lower, below = bound, cumulative
    return lower * 1000.0


def server_figures(
    before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
) -> dict[str, float]:
    return {
        f"{name}_{tag}_ms": quantile_ms(q, before[name], after[name])
        for name in SERVER_HISTOGRAMS
        for tag, q in (("p50", 0.5), ("p99", 0.99))
    }


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer AIPerf can load (tokenizer.json, tokenizer_config.json):
    the words the prompts are made of are single tokens, any other is <unk>."""
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    words = [*specials, "hello", *(str(i) for i in range(512))]
    words += [f"w{i}" for i in range(1024 - len(words))]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": word,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, word in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordLevel",
            "vocab": {word: i for i, word in enumerate(words)},
            "unk_token": "<unk>",
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": 4096,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


class TokenServer:
    """The token server in its own process, for a `with` block; `url` is its base URL."""

    def __enter__(self) -> TokenServer:
        self._process = subprocess.Popen(
            [sys.executable, str(TOKEN_SERVER)], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("listening on "):
            self._process.kill()
            raise RuntimeError(f"the token server did not start (said {line!r})")
        self.url = line.removeprefix("listening on ")
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()


def run_ours(url: str, rate: float, args: argparse.Namespace, seed: int) -> dict[str, float]:
    command = [
        sys.executable, "-m", "batchpilot", "loadtest", url,
        "--protocol", "openai-stream", "--model", MODEL,
        "--rate", str(rate), "--duration", str(args.requests / rate),
        "--arrival", "poisson", "--seed", str(seed),
        "--prompt-tokens", f"fixed:{args.prompt_tokens}",
        "--output-tokens", f"fixed:{args.output_tokens}",
        "--json",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"loadtest failed ({done.returncode}): {done.stderr[-2000:]}")
    stream = json.loads(done.stdout)["stream"]
    figures = {
        f"{name}_{q}_ms": float(stream[ours][f"{q}_ms"])
        for name, (ours, _) in METRICS.items()
        for q in ("p50", "p99")
    }
    figures["throughput_rps"] = float(json.loads(done.stdout)["achieved_rps"])
    return figures


def run_aiperf(
    aiperf: Path, url: str, rate: float, args: argparse.Namespace, seed: int, work: Path
) -> dict[str, float]:
    artifacts = work / f"aiperf-{rate:g}-{seed}"
    command = [
        str(aiperf / "bin" / "aiperf"), "profile",
        "--model", MODEL, "--url", url, "--endpoint-type", "completions", "--streaming",
        "--tokenizer", str(work / "tokenizer"),
        "--request-rate", str(rate), "--arrival-pattern", "poisson",
        "--request-count", str(args.requests),
        "--synthetic-input-tokens-mean", str(args.prompt_tokens),
        "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0",
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", f"min_tokens:{args.output_tokens}",
        "--random-seed", str(seed), "--ui-type", "none",
        "--artifact-dir", str(artifacts),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=work
    )
    export = artifacts / "profile_export_aiperf.json"
    if done.returncode != 0 or not export.exists():
        raise RuntimeError(f"aiperf failed ({done.returncode}): {done.stdout[-2000:]}")
    data = json.loads(export.read_text())
    figures = {
        f"{name}_{q}_ms": float(data[theirs][q])
        for name, (_, theirs) in METRICS.items()
        for q in ("p50", "p99")
    }
    figures["throughput_rps"] = float(data["request_throughput"]["avg"])
    return figures


def spread(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "relative_spread": (max(values) - min(values)) / median if median else 0.0,
    }


def compare(ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> dict[str, Any]:
    """The ratios, ours over AIPerf's: per repeat and of the medians over repeats."""
    out: dict[str, Any] = {}
    within: dict[str, bool] = {}
    for key in ours[0]:
        if key == "throughput_rps":
            continue
        per_repeat = [o[key] / t[key] for o, t in zip(ours, theirs, strict=True)]
        of_medians = statistics.median(o[key] for o in ours) / statistics.median(
            t[key] for t in theirs
        )
        name = key.removesuffix("_ms") + "_ratio"
        out[name] = {"of_medians": of_medians, "per_repeat": per_repeat}
        within[name] = abs(of_medians - 1.0) <= TOLERANCE
    out["within_10pct"] = within
    return out


def measure(args: argparse.Namespace, aiperf: Path) -> dict[str, Any]:
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="genai-accuracy-") as folder, TokenServer() as server:
        work = Path(folder)
        write_tokenizer(work / "tokenizer")
        for rate in rates:
            ours: list[dict[str, float]] = []
            theirs: list[dict[str, float]] = []
            server_ours: list[dict[str, float]] = []
            server_theirs: list[dict[str, float]] = []

            def timed(
                run: Callable[[], dict[str, float]],
                into: list[dict[str, float]],
                seen: list[dict[str, float]],
            ) -> None:
                before = server_buckets(server.url)
                into.append(run())
                seen.append(server_figures(before, server_buckets(server.url)))

            for repeat in range(args.repeats):
                seed = args.seed + repeat
                mine = functools.partial(run_ours, server.url, rate, args, seed)
                other = functools.partial(run_aiperf, aiperf, server.url, rate, args, seed, work)
                # alternate which instrument goes first: neither always gets a fresh server
                if repeat % 2 == 0:
                    timed(mine, ours, server_ours)
                    timed(other, theirs, server_theirs)
                else:
                    timed(other, theirs, server_theirs)
                    timed(mine, ours, server_ours)
                print(f"rate {rate:g}: repeat {repeat + 1}/{args.repeats} done", file=sys.stderr)
            rows.append(
                {
                    "rate_rps": rate,
                    "batchpilot": {k: spread([o[k] for o in ours]) for k in ours[0]},
                    "aiperf": {k: spread([t[k] for t in theirs]) for k in theirs[0]},
                    # what the server timed during each instrument's runs
                    "server_during_batchpilot": {
                        k: spread([f[k] for f in server_ours]) for k in server_ours[0]
                    },
                    "server_during_aiperf": {
                        k: spread([f[k] for f in server_theirs]) for k in server_theirs[0]
                    },
                    **compare(ours, theirs),
                    "runs": {"batchpilot": ours, "aiperf": theirs},
                }
            )
    every = all(all(row["within_10pct"].values()) for row in rows)
    return {
        "aiperf": f"aiperf {AIPERF_VERSION}",
        "server": "tests/support/tokenserver.py: first token after 40 ms, then one every 10 ms",
        "request": f"completions, stream, prompt {args.prompt_tokens} tokens, "
        f"output {args.output_tokens} tokens (ignore_eos, min_tokens)",
        "arrivals": "poisson, open loop",
        "requests_per_run": args.requests,
        "repeats": args.repeats,
        "rates": rows,
        "targets": {"ttft_tpot_p50_p99_within_10pct_of_aiperf": every},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rates", default="10,40", help="req/s, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="requests per run")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--aiperf", type=Path, default=DEFAULT_AIPERF, help="its environment")
    results.add_options(parser)
    args = parser.parse_args()
    if args.repeats < 1 or args.requests < 20 or args.output_tokens < 2:
        parser.error("need --repeats >= 1, --requests >= 20, --output-tokens >= 2")
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if not rates or min(rates) <= 0:
        parser.error("--rates must be above 0")
    if not (args.aiperf / "bin" / "aiperf").exists():
        result: dict[str, Any] = {
            "skipped": f"AIPerf {AIPERF_VERSION} is not installed in {args.aiperf}: "
            "install it with scripts/aiperf"
        }
        print("not recorded: the comparison did not run", file=sys.stderr)
    else:
        recorder = results.start("genai_accuracy", args, runtimes={"aiperf": AIPERF_VERSION})
        result = measure(args, args.aiperf)
        recorder.save(result)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
