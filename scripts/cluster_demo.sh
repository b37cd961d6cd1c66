#!/usr/bin/env bash
# A lab's studio on one machine, end to end, as docs/cluster.md sets it up: a PostgreSQL server with a password
# (scram-sha-256 over TCP), a one-node Ray head, the studio with both (`--db postgresql+psycopg://...` and
# `--ray-address`), the teaching demo launched by pressing Train in Debian's chromium (`scripts/click_train.py`, the
# Run page saved as WORK_DIR/cluster-run.png) and followed to its end, its held-out accuracy before and after
# printed; then everything stopped again.
#
#   scripts/cluster_demo.sh [WORK_DIR] [--quick]     # --quick: 64 prompts, 1 epoch, through the API (/launch)
#
# Needs `make install` (or `pip install -e '.[app,cluster]'`) and PostgreSQL's server binaries
# (`apt-get install -y postgresql`). Uses ports 55432 (PostgreSQL), 6389 and 8275 (Ray) and 7895 (the studio).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=/tmp/a2po-cluster-demo QUICK=0
for arg in "$@"; do
  case $arg in
    -h|--help) sed -n '2,11s/^# \{0,1\}//p' "$ROOT/scripts/cluster_demo.sh"; exit 0 ;;
    --quick) QUICK=1 ;;
    -*) echo "cluster_demo.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) WORK=$arg ;;
  esac
done
PY=${PYTHON:-$ROOT/.venv/bin/python}; [[ -x $PY ]] || PY=python3
RAY=$(dirname "$PY")/ray; [[ -x $RAY ]] || RAY=ray
PG_BIN=${A2PO_POSTGRES_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
PG_PORT=55432 RAY_PORT=6389 DASHBOARD_PORT=8275 STUDIO_PORT=7895
PASSWORD="demo pass $(date +%s)"
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

say() { printf '\n== %s\n' "$*"; }
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

[[ -x $PG_BIN/initdb ]] || { echo "PostgreSQL's binaries are missing: apt-get install -y postgresql"; exit 2; }
rm -rf "$WORK"; mkdir -p "$WORK/data"
STUDIO_PID=""
cleanup() {
  say "stopping the studio, the Ray head and the database server"
  [[ -n $STUDIO_PID ]] && kill "$STUDIO_PID" 2>/dev/null && wait "$STUDIO_PID" 2>/dev/null || true
  "$RAY" stop --force >/dev/null 2>&1 || true
  as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -m fast stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

say "1. a PostgreSQL server on 127.0.0.1:$PG_PORT, role 'studio' with a password (scram-sha-256)"
mkdir -p "$WORK/pg"; [[ $(id -u) == 0 ]] && chown postgres "$WORK/pg" "$WORK"
as_pg "$PG_BIN/initdb" -D "$WORK/pg" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/server.log" \
  -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $WORK/pg" start >/dev/null
# Two commands: CREATE DATABASE cannot run inside the transaction one -c string makes.
as_pg "$PG_BIN/psql" -h "$WORK/pg" -p $PG_PORT -U postgres -q -c "CREATE ROLE studio LOGIN PASSWORD '$PASSWORD'" \
  -c "CREATE DATABASE studio OWNER studio"

say "2. a one-node Ray head: GCS 127.0.0.1:$RAY_PORT, Jobs API http://127.0.0.1:$DASHBOARD_PORT (private address)"
"$RAY" start --head --node-ip-address=127.0.0.1 --port=$RAY_PORT --dashboard-host=127.0.0.1 \
  --dashboard-port=$DASHBOARD_PORT --num-cpus="$(nproc)" --disable-usage-stats >/dev/null

say "3. the studio on both: the password in PGPASSWORD (workers get it through <data-dir>/.a2po-store-password)"
PGPASSWORD=$PASSWORD "$PY" -m app --port $STUDIO_PORT --data-dir "$WORK/data" \
  --db "postgresql+psycopg://studio@127.0.0.1:$PG_PORT/studio" --ray-address "http://127.0.0.1:$DASHBOARD_PORT" \
  > "$WORK/studio.log" 2>&1 &
STUDIO_PID=$!
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$STUDIO_PORT/" >/dev/null && break; sleep 1; done
head -1 "$WORK/studio.log"

if [[ $QUICK == 0 ]] && command -v chromium >/dev/null; then
  say "4. the teaching demo: Train pressed in chromium on the form as it opens, followed to its end"
  "$PY" scripts/click_train.py "http://127.0.0.1:$STUDIO_PORT/" --screenshot "$WORK/cluster-run.png"
  exit
fi
say "4. the teaching demo, launched as the Train button does (/launch), and followed to its end"
QUICK=$QUICK STUDIO_PORT=$STUDIO_PORT "$PY" - <<'EOF'
import os, time
from gradio_client import Client

client = Client(f"http://127.0.0.1:{os.environ['STUDIO_PORT']}/", verbose=False)
spec = {"name": "cluster-demo"}
if os.environ["QUICK"] == "1":
    spec |= {"dataset": {"num_prompts": 64, "eval_size": 32}, "config": {"num_train_epochs": 1}}
print("runs go to:", client.predict(api_name="/limits")["runs_go_to"])
run_id = client.predict(spec=spec, api_name="/launch")["run_id"]
started, shown = time.time(), None
while (status := client.predict(run_id=run_id, api_name="/status"))["status"] not in ("finished", "failed",
                                                                                        "stopped"):
    line = f"run {run_id}: {status['status']}, {status['stage'] or 'queued'}, {100 * (status['progress'] or 0):.0f}%"
    if line != shown:
        print(f"{time.time() - started:6.0f} s  {line}", flush=True)
        shown = line
    time.sleep(5)
accuracy = sorted((r["step"], r["value"]) for r in client.predict(run_id=run_id, after_id=0, api_name="/metrics")
                  if r["name"] == "eval_accuracy")
print(f"run {run_id} {status['status']} in {time.time() - started:.0f} s; held-out accuracy "
      f"{accuracy[0][1]:.1%} -> {accuracy[-1][1]:.1%}" if accuracy else status.get("error"))
raise SystemExit(0 if status["status"] == "finished" else 1)
EOF
