"""Why prefill and decode pull the knobs apart: TTFT p99 and TPOT p99 against the offered
rate for two token budgets (`max_num_batched_tokens`) of a real vLLM engine.

vLLM's CPU build (scripts/engines) serves the tiny random-weight Llama model it writes,
with chunked prefill on and the batch cap fixed (`--max-num-seqs`); only the token budget
differs between the two series. Each point is `batchpilot loadtest --protocol
openai-stream` at one Poisson rate for `--duration` seconds, long prompts and short
answers (384 and 64 tokens by default), so that a prompt's prefill is large beside the
decode tokens of a step. Each engine start is followed by a 4 s run that is not recorded
(a fresh engine's first requests are slower). Each repeat starts the engine once per
budget, the order of the budgets alternating between repeats, and sweeps every rate; a
point is the median over
the repeats, with their spread. With `--plot FILE` (matplotlib, the plot extra) the two
panels are drawn into FILE (.svg, .png or .pdf).

    python benchmarks/token_budget.py [--json] [--budgets 64,1024] [--max-num-seqs 16] \\
        [--rates 2,8,16,24,32] [--duration 12] [--repeats 2] [--prompt-tokens 384] \\
        [--output-tokens 64] [--plot FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import results
from batchpilot.runtimes.vllm.knobs import VllmKnobs
from batchpilot.runtimes.vllm.process import ENGINE, MAX_MODEL_LEN, MODEL, VllmProcess, engine_dir

RUN_TIMEOUT_S = 600
WARMUP_S = 4.0


def loadtest(url: str, rate: float, args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One loadtest run's TTFT and TPOT p99 (ms), output tokens/s and errors."""
    command = [
        sys.executable, "-m", "batchpilot", "loadtest", url,
        "--protocol", "openai-stream", "--model", MODEL,
        "--rate", f"{rate:g}", "--duration", f"{args.duration:g}", "--seed", str(seed),
        "--prompt-tokens", f"fixed:{args.prompt_tokens}",
        "--output-tokens", f"fixed:{args.output_tokens}",
        "--timeout", "120", "--json",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"loadtest at {rate:g} req/s failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    stream = out["stream"]
    return {
        "ttft_p99_ms": stream["ttft"]["p99_ms"],
        "tpot_p99_ms": stream["tpot"]["p99_ms"],
        "output_tokens_per_s": stream["output_tokens_per_s"],
        "errors": float(sum(out["errors"].values())),
        "ok": float(out["ok"]),
    }


async def sweep(
    budget: int, args: argparse.Namespace, rates: list[float], seed: int
) -> list[dict[str, float]]:
    """Start the engine at `budget` and run every rate against it."""
    knobs = VllmKnobs(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=True,
    )
    async with VllmProcess(None, knobs, threads=args.threads) as server:
        # a freshly started engine's first requests are slower (allocations, caches): a
        # short run at the lowest rate first, not recorded
        warm = argparse.Namespace(**{**vars(args), "duration": WARMUP_S})
        await asyncio.to_thread(loadtest, server.url, rates[0], warm, seed - 1)
        points = []
        for k, rate in enumerate(rates):
            point = await asyncio.to_thread(loadtest, server.url, rate, args, seed + k)
            print(
                f"budget {budget} {rate:g} req/s: TTFT p99 {point['ttft_p99_ms']:.1f} ms, "
                f"TPOT p99 {point['tpot_p99_ms']:.2f} ms",
                file=sys.stderr,
            )
            points.append(point)
        return points


def summarise(runs: list[list[dict[str, float]]], rates: list[float]) -> list[dict[str, Any]]:
    """Per rate: the median of each figure over the repeats, and its spread."""
    rows = []
    for i, rate in enumerate(rates):
        row: dict[str, Any] = {"rate_rps": rate}
        for key in ("ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s", "errors"):
            values = [run[i][key] for run in runs]
            row[key] = statistics.median(values)
            row[f"{key}_spread"] = [min(values), max(values)]
        rows.append(row)
    return rows


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    figure, (ttft, tpot) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for series in result["series"]:
        rates = [row["rate_rps"] for row in series["points"]]
        label = f"max_num_batched_tokens {series['token_budget']}"
        for axes, key in ((ttft, "ttft_p99_ms"), (tpot, "tpot_p99_ms")):
            medians = [row[key] for row in series["points"]]
            low = [
                m - row[f"{key}_spread"][0]
                for m, row in zip(medians, series["points"], strict=True)
            ]
            high = [
                row[f"{key}_spread"][1] - m
                for m, row in zip(medians, series["points"], strict=True)
            ]
            axes.errorbar(rates, medians, yerr=[low, high], marker="o", capsize=3, label=label)
    request = result["request"]
    ttft.set_title("time to first token, p99")
    tpot.set_title("time per output token, p99")
    for axes in (ttft, tpot):
        axes.set_xlabel("offered rate (req/s, Poisson)")
        axes.set_ylabel("ms")
        axes.set_yscale("log")
        # plain numbers on the log axis (3, 4, 6 ms), not powers of ten
        axes.yaxis.set_major_formatter(ticker.ScalarFormatter())
        axes.yaxis.set_minor_formatter(ticker.ScalarFormatter())
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.suptitle(
        f"vLLM CPU, tiny Llama, max_num_seqs {result['max_num_seqs']}, chunked prefill; "
        f"{request['prompt_tokens']} prompt + {request['output_tokens']} output tokens"
    )
    figure.savefig(path)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--budgets", default="64,1024", help="token budgets, comma-separated")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--rates", default="2,8,16,24,32", help="req/s, comma-separated")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per point")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=384)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="the engine's CPU threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="draw the panels here")
    results.add_options(parser)
    args = parser.parse_args()
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error("--budgets and --rates must be numbers separated by commas")
    if len(budgets) < 2 or min(budgets) < args.max_num_seqs:
        parser.error("give two or more --budgets, each at least --max-num-seqs")
    if not rates or min(rates) <= 0 or args.repeats < 1 or args.duration <= 0:
        parser.error("--rates and --duration must be above 0, --repeats at least 1")
    if args.prompt_tokens + args.output_tokens > MAX_MODEL_LEN:
        parser.error(f"prompt and output tokens must fit the model's {MAX_MODEL_LEN}")
    if not (engine_dir() / "bin" / "python").is_file():
        print(f"not recorded: {ENGINE} is not installed (scripts/engines)", file=sys.stderr)
        return 1
    recorder = results.start("token_budget", args, runtimes={"vllm": ENGINE})
    runs: dict[int, list[list[dict[str, float]]]] = {b: [] for b in budgets}
    for repeat in range(args.repeats):
        order = budgets if repeat % 2 == 0 else list(reversed(budgets))
        for budget in order:
            seed = args.seed + 1000 * repeat
            runs[budget].append(asyncio.run(sweep(budget, args, rates, seed)))
    result: dict[str, Any] = {
        "max_num_seqs": args.max_num_seqs,
        "request": {
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "duration_s": args.duration,
            "arrival": "poisson",
        },
        "repeats": args.repeats,
        "series": [{"token_budget": b, "points": summarise(runs[b], rates)} for b in budgets],
    }
    # the same points in one list, for the record's table
    result["points"] = [
        {"token_budget": series["token_budget"], **row}
        for series in result["series"]
        for row in series["points"]
    ]
    recorder.save(result)
    if args.plot is not None:
        plot(result, args.plot)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
