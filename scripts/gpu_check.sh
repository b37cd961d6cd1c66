#!/usr/bin/env bash
# The studio on a GPU, one prepared check (issues 30 and 46; docs/benchmarks.md, "GPU check").
#
#   scripts/gpu_check.sh [--cpu] [STEP | core | more | all ...]
#
# One call runs one set of steps, each under its own share of the call's budget (benchmarks/gpu_check.py: SETS,
# SHARES, BUDGETS; a test checks that a set's shares add up to at most 100% and that one call ends within 6 minutes),
# each writing $OUT/STEP.json as it goes (OUT defaults to ./gpu-out: a step cut by its limit keeps what it measured)
# and one line to stdout as it ends; what the steps print besides goes to $OUT/gpu_check.log.
#   core (the default on a GPU; 340 s of steps):
#     training  benchmarks.training at q05, 16 prompts: ours at the default precision (fp32 master weights, bf16
#               autocast), ours with bf16 weights, TRL A2PO and TRL GRPO (TRL skipped, and said so, where trl does
#               not import): epoch time, peak memory, tokens/s, bytes held per parameter; the verdict for the default
#     learning  benchmarks.learning: a small transformer built there and taught 2-digit sums, then A*-PO and GRPO on
#               other sums: held-out accuracy before and after, loss/reward/log-ratio histories, CUDA's allocator
#   more (a later lease's call; 340 s): decode, lora, studio, methods, engines (the issue-30 and issue-36 steps)
# --cpu runs every step at a tiny size on the CPU (tests/a2po/test_gpu_check.py does; a few minutes of CPU). Without
# a GPU the tiny sizes are used anyway. PYTHON picks the interpreter (default .venv/bin/python, else python3);
# GPU_CHECK_BUDGET replaces the budget (seconds), shared out among the steps by the same shares.
#
# With a lent GPU, this runs first, as one call that leaves room for a full rerun in the 15 minutes (the machine's
# start, a minute or two, counts). On the GPU machine (python 3.12, torch 2.11, transformers 5.17; accelerate, peft,
# pandas, pyarrow, xxhash, fsspec, huggingface-hub, pyyaml, tqdm are there: shared/reference/gpu-checks.md) the core
# steps import four packages that are not: datasets (+ dill, multiprocess) in every trainer and trl for the peers;
# the `more` set's studio step also sqlalchemy, alembic (+ mako). Download them here, once (nothing is installed here):
#
#   echo /.whl/ >> .git/info/exclude   # .gitignore has it too
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0 sqlalchemy==2.1.9 alembic==1.20.1 \
#     mako==1.4.3
#
# and call the device tool's run with carry [".whl"], a timeout_s of 420 (the call's 360 s and the install) and:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
#     PYTHON=python3 || exit; scripts/gpu_check.sh
#
# Then fill docs/benchmarks.md's GPU table from training.json and learning.json, and give the machine back. If a step
# was cut, rerun it alone (`scripts/gpu_check.sh learning`). Only 8 files come back from $OUT: a set's JSON files and
# the log are at most seven (engines adds engines.md). The `more` set (a later lease) reads the core call's
# training.json from $OUT (lora's and engines' TRL figures): keep it in an ignored folder that travels (carry it) and
# start with `cp gpu-core/training.json "$OUT"/ && scripts/gpu_check.sh more`; without it engines measures ours and
# TRL again and runs past its share.
set -u
cd "$(dirname "$0")/.."

cpu=""
names=()
for arg in "$@"; do
    case "$arg" in
        --cpu) cpu="--cpu" ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "unknown option: $arg (see --help)" >&2; exit 2 ;;
        *) names+=("$arg") ;;
    esac
done

OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
[ -n "$cpu" ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The steps and their shares (percent of the budget), checked before anything runs: a wrong name runs nothing.
plan=$("$PYTHON" -m benchmarks.gpu_check plan $cpu "${names[@]}") || exit 2
budget=${GPU_CHECK_BUDGET:-$(sed -n 's/^budget //p' <<< "$plan")}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$OUT/gpu_check.log"
: > "$log"

ok=0
count=0
while read -r step share; do
    [ "$step" = budget ] && continue
    count=$((count + 1))
    left=$((budget - SECONDS))
    secs=$((budget * share / 100))
    [ "$left" -lt "$secs" ] && secs=$left
    if [ "$secs" -lt 10 ]; then
        "$PYTHON" -m benchmarks.gpu_check failed "$step" --out "$OUT" --rc 124 --limit 0 < /dev/null
        continue
    fi
    echo "=== $step (limit ${secs} s)" >> "$log"
    # SIGTERM reaches the step's whole process group (its workers and benchmark runs too); SIGKILL 10 s later.
    timeout -k 10 "$secs" "$PYTHON" -m benchmarks.gpu_check "$step" --out "$OUT" --workdir "$work" \
        --timeout $((secs - 10)) $cpu 2>> "$log" < /dev/null
    rc=$?
    if [ "$rc" -eq 0 ]; then
        ok=$((ok + 1))
    else
        "$PYTHON" -m benchmarks.gpu_check failed "$step" --out "$OUT" --rc "$rc" --limit "$secs" < /dev/null
    fi
done <<< "$plan"
echo "gpu_check: ${ok} of ${count} steps ok in ${SECONDS} s; results in $OUT"
[ "$ok" -eq "$count" ]
