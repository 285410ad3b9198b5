#!/usr/bin/env bash
# The container-kill fencing demo: mini-broker on docker compose, with real containers.
#
#   scripts/compose-demo.sh            build the image, run the story, print the verdict, tear down
#   scripts/compose-demo.sh --keep     leave the cluster (and its volumes) running afterwards
#   scripts/compose-demo.sh --down     only remove what a previous run left (containers, volumes)
#
# Options: --no-build (reuse the image), --project NAME (compose project, default minibroker-demo),
# --ci (no colours; the same checks). Environment: MINIBROKER_IMAGE (default minibroker:local),
# COMPOSE (e.g. "docker-compose"; default: `docker compose` if present, else `docker-compose`).
#
# The story (every step is checked; any violation makes the script exit non-zero):
#   1. producer instance A runs a transactional workload with transactional id X in its own
#      container and commits a few transactions;
#   2. `docker pause` A in the middle of a transaction (a GC pause); instance B starts with the same
#      id in a new container; B's InitProducerId bumps the epoch and aborts A's open transaction;
#   3. `docker unpause` A: it is fenced, says so and exits non-zero;
#   4. the coordinator that owns X crashes (SIGKILL) during B's commits; the restart policy brings
#      it back, it reloads __transaction_state and finishes what was decided; B carries on;
#   5. a partition leader crashes mid-transaction; it restarts with its log and producer state;
#   6. a read_committed consumer reads everything back: every committed record exactly once,
#      nothing of A's aborted transaction. The verdict is printed; non-zero exit on violation.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

project="minibroker-demo"
keep=0
build=1
ci=0
down_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) keep=1 ;;
    --no-build) build=0 ;;
    --ci) ci=1 ;;
    --down) down_only=1 ;;
    --project) project="$2"; shift ;;
    --project=*) project="${1#--project=}" ;;
    -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compose-demo: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

image="${MINIBROKER_IMAGE:-minibroker:local}"
export MINIBROKER_IMAGE="$image"
txn_id="${DEMO_TRANSACTIONAL_ID:-payments-app}"
topic="demo"
label="org.minibroker.demo=$project"
workdir="$(mktemp -d "${TMPDIR:-/tmp}/compose-demo.XXXXXX")"

# ------------------------------------------------------------------------------------------------
# Output: a timeline with seconds since the start, and a tally of checks.
# ------------------------------------------------------------------------------------------------
t0=$(date +%s.%N)
if [[ $ci -eq 0 && -t 1 ]]; then
  bold=$'\e[1m'; green=$'\e[32m'; red=$'\e[31m'; dim=$'\e[2m'; reset=$'\e[0m'
else
  bold=""; green=""; red=""; dim=""; reset=""
fi
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%6.1fs", b - a }'; }
say() { printf '%s[%s]%s %s\n' "$dim" "$(elapsed)" "$reset" "$*"; }
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$reset"; }
passed=0
failed=0
check() { # check "what" command...
  local what="$1"; shift
  if "$@"; then
    passed=$((passed + 1)); say "${green}PASS${reset} $what"
  else
    failed=$((failed + 1)); say "${red}FAIL${reset} $what"
  fi
}
die() { say "${red}ERROR${reset} $*"; exit 1; }

# ------------------------------------------------------------------------------------------------
# Compose and containers.
# ------------------------------------------------------------------------------------------------
if [[ -n "${COMPOSE:-}" ]]; then
  read -r -a compose_cmd <<<"$COMPOSE"
elif docker compose version >/dev/null 2>&1; then
  compose_cmd=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
  compose_cmd=(docker-compose)
else
  echo "compose-demo: neither 'docker compose' nor 'docker-compose' is installed" >&2
  exit 2
fi
compose() { "${compose_cmd[@]}" -p "$project" -f "$repo/docker-compose.yml" "$@"; }

services=(coordinator-1 coordinator-2 leader-1 leader-2 leader-3)

# Container ids by service, looked up once (`docker-compose ps` is slow; ids survive restarts).
declare -A cid_cache=()
lookup_cids() { local s; for s in "$@"; do cid_cache[$s]="$(compose ps -q "$s" 2>/dev/null | head -n1)"; done; }
cid() { if [[ -n "${cid_cache[$1]:-}" ]]; then echo "${cid_cache[$1]}"; else compose ps -q "$1" | head -n1; fi; }
cname() { docker inspect -f '{{.Name}}' "$(cid "$1")" | sed 's#^/##'; }
cstate() { # health status if the container has a healthcheck, else its run state
  docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$1" 2>/dev/null || echo missing
}
restart_count() { docker inspect -f '{{.RestartCount}}' "$1"; }

teardown() {
  docker ps -aq --filter "label=$label" | xargs -r docker rm -f >/dev/null 2>&1 || true
  compose down -v --remove-orphans >/dev/null 2>&1 || true
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $keep -eq 1 && $down_only -eq 0 ]]; then
    say "--keep: the cluster is still up. Remove it with: $0 --down --project $project"
  else
    say "tearing down: containers, network and volumes of project $project"
    teardown
  fi
  rm -rf "$workdir"
  exit "$rc"
}
trap on_exit EXIT
trap 'say "interrupted"; exit 130' INT TERM

if [[ $down_only -eq 1 ]]; then
  exit 0
fi

# Waits until every given service is healthy; prints how long it took.
wait_healthy() { # wait_healthy timeout_seconds service...
  local timeout="$1"; shift
  local deadline=$(( $(date +%s) + timeout ))
  local s c st
  while :; do
    local pending=()
    for s in "$@"; do
      c="$(cid "$s")"
      st="$(cstate "$c")"
      [[ "$st" == healthy ]] || pending+=("$s:$st")
    done
    [[ ${#pending[@]} -eq 0 ]] && return 0
    if (( $(date +%s) >= deadline )); then
      say "not healthy after ${timeout}s: ${pending[*]}"
      for s in "$@"; do compose logs --tail 20 "$s" || true; done
      return 1
    fi
    sleep 0.5
  done
}

# Crashes a service's container the way a real crash looks to Docker: SIGKILL of its main
# process, so the restart policy applies. (`docker kill` counts as a manual stop: Docker does not
# restart the container then.) Falls back to `docker kill` + `docker start` when the process is not
# visible from here (Docker Desktop, a remote engine).
crash_and_wait() { # crash_and_wait service why
  local service="$1" why="$2"
  local c pid before
  c="$(cid "$service")"
  pid="$(docker inspect -f '{{.State.Pid}}' "$c")"
  before="$(restart_count "$c")"
  if [[ "$pid" -gt 0 ]] && kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null; then
    say "CRASH $service ($(cname "$service")): SIGKILL to its process (host pid $pid) -- $why"
    local deadline=$(( $(date +%s) + 30 ))
    until [[ "$(restart_count "$c")" -gt "$before" ]]; do
      (( $(date +%s) < deadline )) || die "$service was not restarted by its restart policy"
      sleep 0.2
    done
    say "      Docker restarted $service (restart policy unless-stopped, restart #$(restart_count "$c"))"
  else
    say "CRASH $service: docker kill -- $why (process not visible from this host)"
    docker kill "$c" >/dev/null
    docker start "$c" >/dev/null
    say "      docker start $service (docker kill is a manual stop: no automatic restart)"
  fi
  local t1; t1=$(date +%s.%N)
  wait_healthy 60 "$service" || die "$service did not come back healthy"
  say "      $service is healthy again ($(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the restart)"
}

# ------------------------------------------------------------------------------------------------
# The minibroker CLI, run in containers on the compose network.
# ------------------------------------------------------------------------------------------------
network=""
mb() { # one-shot CLI command; stdout is the command's output
  docker run --rm -i --network "$network" --label "$label" -e RUST_LOG=warn "$image" minibroker "$@"
}
mb_start() { # mb_start NAME args...: a long-running CLI in a named, detached container
  local name="$1"; shift
  docker run -d --name "$project-$name" --network "$network" --label "$label" \
    -e RUST_LOG=warn "$image" minibroker "$@" >/dev/null
  echo "$project-$name"
}
describe() { # the coordinator's view of the transactional id, as JSON
  mb transactions describe "$txn_id" --json
}
jget() { # jget FIELD <json: prints one top-level field (empty if absent)
  python3 -c 'import json,sys
d=json.load(sys.stdin)
if isinstance(d, list): d = d[0] if d else {}
if "transactions" in d and isinstance(d["transactions"], list): d = d["transactions"][0]
v=d.get(sys.argv[1], "")
print(json.dumps(v) if isinstance(v,(dict,list)) else v)' "$1"
}
checker() { python3 "$here/compose_demo_check.py" "$@"; }

# ================================================================================================
step "0. Build the image (static binaries, FROM scratch: nothing is pulled)"
teardown # leftovers of an earlier run of the same project
if [[ $build -eq 1 ]]; then
  "$repo/docker/build.sh"
else
  docker image inspect "$image" >/dev/null 2>&1 || die "image $image is missing: run without --no-build"
fi
say "image $image: $(( $(docker image inspect -f '{{.Size}}' "$image") / 1024 / 1024 )) MiB"

step "1. Start the cluster: 2 coordinators, 3 partition leaders (${compose_cmd[*]})"
up_start=$(date +%s.%N)
compose up -d --no-build
lookup_cids "${services[@]}"
wait_healthy 120 "${services[@]}" || die "the cluster did not become healthy"
up_secs=$(awk -v a="$up_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
say "all 5 nodes healthy ${up_secs} s after 'up' was run"
network="$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$(cid coordinator-1)")"
owner="$(checker owner "$repo/docker/topology.toml" "$txn_id")"
say "transactional id '$txn_id' belongs to $owner (state partition hash, as every node computes it)"

# The coordinator's view of X as "PID EPOCH STATE" (STATE like Ongoing, PrepareCommit, ...).
txn_view() { describe 2>/dev/null | checker txn-view; }
# Polls txn_view until the python condition over pid/epoch/state holds; prints the view.
wait_txn() { # wait_txn timeout_seconds 'python condition' -> "PID EPOCH STATE"
  local timeout="$1" cond="$2" view
  local deadline=$(( $(date +%s) + timeout ))
  while :; do
    view="$(txn_view || true)"
    if [[ -n "$view" ]] && checker txn-cond "$view" "$cond"; then
      echo "$view"; return 0
    fi
    (( $(date +%s) < deadline )) || { echo "$view"; return 1; }
    sleep 0.2
  done
}
container_exit() { docker inspect -f '{{.State.ExitCode}}' "$1"; }
wait_exit() { # wait_exit container timeout_seconds: exit code, or "timeout"
  local c="$1" timeout="$2"
  local deadline=$(( $(date +%s) + timeout ))
  while [[ "$(docker inspect -f '{{.State.Running}}' "$c")" == true ]]; do
    (( $(date +%s) < deadline )) || { echo timeout; return 0; }
    sleep 0.3
  done
  container_exit "$c"
}

# ================================================================================================
step "2. Producer instance A: transactional id '$txn_id' in its own container"
# A writes slowly (a pause between records) so that most of its time is spent inside an open
# transaction: that is where the pause must land.
a="$(mb_start producer-a "${produce_a[@]}")"
say "started container $a: ${produce_a[*]}"
view="$(wait_txn 60 'epoch >= 2 and state == "Ongoing"')" \
  || die "A did not get to its third transaction (coordinator says: $view)"
paused_view=""
for attempt in 1 2 3 4 5 6 7 8 9 10; do
  docker pause "$a" >/dev/null
  view="$(txn_view)"
  if checker txn-cond "$view" 'state == "Ongoing"'; then paused_view="$view"; break; fi
  # The pause landed between two transactions; let A open the next one and try again.
  docker unpause "$a" >/dev/null
  sleep 0.3
done
[[ -n "$paused_view" ]] || die "could not pause A inside a transaction"
read -r a_pid a_epoch _ <<<"$paused_view"
say "PAUSE $a (docker pause, a simulated GC pause) in the middle of a transaction:"
say "      coordinator: PID $a_pid, epoch $a_epoch, state Ongoing (A's records so far are uncommitted)"

# ================================================================================================
step "3. Producer instance B: the same transactional id, in a new container"
b="$(mb_start producer-b "${produce_b[@]}")"
say "started container $b: ${produce_b[*]}"
view="$(wait_txn 60 "pid == $a_pid and epoch > $a_epoch")" \
  || die "B's InitProducerId did not bump the epoch (coordinator says: $view)"
read -r b_pid b_epoch b_state <<<"$view"
say "      coordinator: PID $b_pid, epoch $b_epoch, state $b_state"
check "B got the same PID ($b_pid) with a higher epoch ($a_epoch -> $b_epoch)" \
  test "$b_pid" = "$a_pid" -a "$b_epoch" -gt "$a_epoch"

# ================================================================================================
step "4. docker unpause A: the zombie wakes up"
docker unpause "$a" >/dev/null
say "UNPAUSE $a: A carries on with PID $a_pid epoch $a_epoch"
a_rc="$(wait_exit "$a" 90)"
docker logs "$a" >"$workdir/a.out" 2>"$workdir/a.err" || true
say "      A exited with status $a_rc; what it said:"
sed 's/^/        | /' "$workdir/a.err" | tail -n 8
check "A exited non-zero (status $a_rc)" test "$a_rc" != 0 -a "$a_rc" != timeout
check "A says it was fenced" grep -qiE 'fenced' "$workdir/a.err" "$workdir/a.out"

# ================================================================================================
step "5. Crash the coordinator that owns '$txn_id' ($owner) during B's commits"
view="$(wait_txn 60 "epoch >= $b_epoch + 2")" || die "B is not committing (coordinator says: $view)"
read -r _ before_kill_epoch before_kill_state <<<"$view"
say "      coordinator before the crash: epoch $before_kill_epoch, state $before_kill_state (B has committed $(( before_kill_epoch - b_epoch )) transactions)"
crash_and_wait "$owner" "B is committing a transaction every few hundred ms"
view="$(txn_view)"
say "      $owner reloaded __transaction_state: PID $(cut -d' ' -f1 <<<"$view"), epoch $(cut -d' ' -f2 <<<"$view"), state $(cut -d' ' -f3 <<<"$view")"
view="$(wait_txn 60 "epoch >= $before_kill_epoch + 2")" \
  || die "B did not carry on after the coordinator restart (coordinator says: $view)"
read -r _ after_epoch _ <<<"$view"
check "B carries on after the coordinator crash (epoch $before_kill_epoch -> $after_epoch)" true

# ================================================================================================
step "6. Crash partition leader leader-1 in the middle of one of B's transactions"
view="$(wait_txn 60 'state == "Ongoing"')" || die "B has no open transaction (coordinator says: $view)"
read -r _ kill_epoch _ <<<"$view"
say "      B's transaction at epoch $kill_epoch is open"
crash_and_wait leader-1 "B's transaction at epoch $kill_epoch is open and writing to it"
view="$(wait_txn 60 "epoch >= $kill_epoch + 2")" \
  || die "B did not carry on after the leader restart (coordinator says: $view)"
check "B carries on after the leader crash" true

b_rc="$(wait_exit "$b" 180)"
docker logs "$b" >"$workdir/b.out" 2>"$workdir/b.err" || true
say "B finished its workload with status $b_rc"
tail -n 3 "$workdir/b.err" | sed 's/^/        | /'
check "B exited 0 (status $b_rc)" test "$b_rc" = 0

# ================================================================================================
step "7. A read_committed consumer checks the topic '$topic'"
mb "${consume_all[@]}" >"$workdir/consumed.out"
say "      read $(wc -l <"$workdir/consumed.out") lines with isolation read_committed"
if checker verify "$workdir/a.out" "$workdir/b.out" "$workdir/consumed.out" >"$workdir/verdict" ; then
  verify_ok=1
else
  verify_ok=0
fi
sed 's/^/      /' "$workdir/verdict"
check "every committed record exactly once, nothing of A's aborted transaction visible" test "$verify_ok" = 1

# ================================================================================================
step "Verdict"
say "image $image: $(( $(docker image inspect -f '{{.Size}}' "$image") / 1024 / 1024 )) MiB; cluster healthy ${up_secs} s after 'up'"
if [[ $failed -eq 0 ]]; then
  say "${green}${bold}PASS${reset}: fencing held with real containers (pause, crash and restart)"
else
  say "${red}${bold}FAIL${reset}: $failed check(s) failed"
fi
echo "compose: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
