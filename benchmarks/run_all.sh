#!/usr/bin/env bash
# Every benchmark, one after another (never two at once: they share the CPU), each
# JSON object saved under OUT (default reports/benchmarks). Run on a quiet machine.
# Each run also records itself under docs/benchmarks/results/<benchmark>/ (benchmarks/
# results.py); the index of those records is written again at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/benchmarks}
mkdir -p "$OUT"
py=.venv/bin/python
run() {
    local name=$1; shift
    local start=$SECONDS
    "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
    echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}
run server_efficiency $py benchmarks/server_efficiency.py --json
run capacity_spread $py benchmarks/capacity_spread.py --json --runs 3
run distributed_load $py benchmarks/distributed_load.py --json
run loadgen_accuracy $py benchmarks/loadgen_accuracy.py --json
# against Perf Analyzer and a local Triton: says "skipped" without scripts/perf-analyzer and scripts/runtimes triton
run loadgen_accuracy_triton $py benchmarks/loadgen_accuracy.py --target triton --json
# against AIPerf and the token server: says "skipped" without scripts/aiperf
run genai_accuracy $py benchmarks/genai_accuracy.py --json
run tune_local $py benchmarks/results.py wrap tune_local -- \
    .venv/bin/batchpilot tune --local --json --report "$OUT/tune_local_report"
run tune_under_noise $py benchmarks/tune_under_noise.py --json  # adds its own CPU bursts
run simulator_validation $py benchmarks/simulator_validation.py --json
run simulator_speed $py benchmarks/simulator_speed.py --json
run tuner_efficiency $py benchmarks/tuner_efficiency.py --json
run decision_quality $py benchmarks/decision_quality.py --json
# the sample's study through the operator on the e2e tier's local cluster (tests/e2e/kube/build.sh first)
run operator_study $py benchmarks/operator_study.py --json
$py benchmarks/results.py index
