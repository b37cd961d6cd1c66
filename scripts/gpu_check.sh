#!/usr/bin/env bash
# The studio on a GPU, one prepared check (issue 30; docs/benchmarks.md, "GPU check").
#
#   scripts/gpu_check.sh [--cpu] [STEP ...]
#
# Runs these steps in order (all six by default), each under its own time limit inside one overall budget, each
# writing $OUT/STEP.json (OUT defaults to ./gpu-out) and one line to stdout as it ends; what the steps print besides
# goes to $OUT/gpu_check.log. The Python is benchmarks/gpu_check.py (one subcommand per step).
#   training  python -m benchmarks.training at q05: ours against TRL A2PO and TRL GRPO (TRL skipped, and said so in
#             the JSON, where trl does not import)
#   decode    the rollout engine's ms per decode step (batch 64, 256 new tokens) against the bandwidth floor
#   lora      ours with LoRA on the same work: peak memory against TRL A2PO's (read from training.json)
#   studio    one studio job through app.runtime.worker and a SQLite file, SmolLM2-135M-shaped random model
#   methods   ours A*-PO against ours GRPO on the q05 work, filter_all_incorrect off
#   engines   the engines side by side on step 1's work: ours with the native decoder, with vLLM colocated (with and
#             without sleep mode) and TRL A2PO and GRPO (step 1's runs, read from training.json), epoch time, decode
#             ms/step and peak memory; and one A*-PO step at 1e-6 from a checkpoint stored in bf16 (the share of
#             weights it changes). One table: $OUT/engines.md, and engines.json. An engine not installed is "not
#             measured: <why>": on the lent GPU machine vLLM (shared/reference/gpu-checks.md), on the CPU vLLM's sleep
#             mode (CUDA only). With --cpu, vLLM runs from .venv-vllm (vLLM's CPU build, `make .venv-vllm/.installed`)
#             when this Python has none.
# --cpu runs them at a tiny size on the CPU (tests/a2po/test_gpu_check.py does; a few minutes of CPU, one of them vLLM's
# start). Without a GPU the tiny sizes are used anyway. PYTHON picks the interpreter (default .venv/bin/python, else
# python3); GPU_CHECK_BUDGET the overall seconds (default 560 on a GPU, 300 with --cpu), shared out among the steps.
#
# On the GPU machine (python 3.12, torch 2.11, transformers 5.17; accelerate, peft, pandas, pyarrow, xxhash, fsspec,
# huggingface-hub, pyyaml, tqdm are there: shared/reference/gpu-checks.md) the steps import seven packages that are
# not: datasets (+ dill, multiprocess) in every trainer, trl for step 1's peers, and sqlalchemy, alembic (+ mako) for
# step 4's store. An import audit of every step's processes (python -X importtime, here) found nothing else: the
# worker imports neither gradio nor plotly, and math-verify only for a reward this check does not use. 6.7 MB in
# all. Download them here, once (pip download: nothing is installed here):
#
#   echo /.whl/ >> .git/info/exclude   # .gitignore has it too
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0 sqlalchemy==2.1.9 alembic==1.20.1 \
#     mako==1.4.3
#
# and call the device tool's run with carry [".whl"], a timeout_s of 600 (the budget, 560 s, plus slack) and:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
#     PYTHON=python3 || exit; scripts/gpu_check.sh
#
# Only 8 files come back from $OUT: the six JSON files, engines.md and the log are eight. To rerun one step: name it
# (`scripts/gpu_check.sh decode`); lora reads training.json from an earlier run in the same $OUT when there is one.
set -u
cd "$(dirname "$0")/.."

cpu=""
steps=()
for arg in "$@"; do
    case "$arg" in
        --cpu) cpu="--cpu" ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        training|decode|lora|studio|methods|engines) steps+=("$arg") ;;
        *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
    esac
done
[ ${#steps[@]} -gt 0 ] || steps=(training decode lora studio methods engines)

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
# Each step's own limit, in percent of the budget (a busy CPU slows the --cpu steps several times over: a test gives
# them a larger budget); the budget caps them all together.
if [ -n "$cpu" ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    budget=${GPU_CHECK_BUDGET:-300}
    declare -A share=([training]=25 [decode]=10 [lora]=10 [studio]=15 [methods]=15 [engines]=45)
else
    budget=${GPU_CHECK_BUDGET:-560}
    declare -A share=([training]=54 [decode]=11 [lora]=13 [studio]=18 [methods]=21 [engines]=20)
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$OUT/gpu_check.log"
: > "$log"

ok=0
for step in "${steps[@]}"; do
    left=$((budget - SECONDS))
    secs=$((budget * share[$step] / 100))
    [ "$left" -lt "$secs" ] && secs=$left
    if [ "$secs" -lt 10 ]; then
        "$PYTHON" -m benchmarks.gpu_check failed "$step" --out "$OUT" --rc 124 --limit 0
        continue
    fi
    echo "=== $step (limit ${secs} s)" >> "$log"
    # SIGTERM reaches the step's whole process group (its workers and benchmark runs too); SIGKILL 10 s later.
    timeout -k 10 "$secs" "$PYTHON" -m benchmarks.gpu_check "$step" --out "$OUT" --workdir "$work" \
        --timeout $((secs - 10)) $cpu 2>> "$log"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        ok=$((ok + 1))
    else
        "$PYTHON" -m benchmarks.gpu_check failed "$step" --out "$OUT" --rc "$rc" --limit "$secs"
    fi
done
echo "gpu_check: ${ok} of ${#steps[@]} steps ok in ${SECONDS} s; results in $OUT"
[ "$ok" -eq ${#steps[@]} ]
