#!/usr/bin/env bash
# The container-kill fencing demo: mini-broker on docker compose, with real containers.
#
#   scripts/compose-demo.sh            build the image, run the story, print the verdict, tear down
#   scripts/compose-demo.sh --keep     leave the cluster (and its volumes) running afterwards
#   scripts/compose-demo.sh --down     only remove what a previous run left (containers, volumes)
#
# Options: --no-build (reuse the image), --project NAME (compose project, default
# minibroker-demo), --ci (no colours; the same checks), --break-fencing (a self-test of the
# checker: the partition leaders run with UNSAFE_SKIP_EPOCH_CHECK, the crash steps are skipped,
# and the script exits 0 only if the final check catches A's zombie write).
# Environment: MINIBROKER_IMAGE (default minibroker:local), COMPOSE (e.g. "docker-compose";
# default: `docker compose` if the plugin is there, else `docker-compose`).
#
# The story (every step is checked; any violation makes the script exit non-zero):
#   1. producer instance A runs a transactional `minibroker produce` with transactional id X in
#      its own container and commits transactions;
#   2. `docker pause` A in the middle of a transaction (a GC pause); instance B starts with the
#      same id in a new container; B's InitProducerId bumps the epoch and aborts A's open
#      transaction;
#   3. `docker unpause` A: a partition leader refuses its stale epoch; A exits non-zero;
#   4. the coordinator that owns X is crashed (SIGKILL of its process) while one of B's commits is
#      in PrepareCommit; Docker's restart policy brings it back, it reloads __transaction_state
#      and completes the commit; B carries on;
#   5. a partition leader is crashed mid-transaction; it restarts with its log and producer state;
#   6. a read_committed consumer reads everything back: every committed record exactly once,
#      nothing of A's aborted transaction. The verdict is printed; non-zero exit on violation.
# The takeover is also drawn as an SVG sequence diagram from the id's epoch history
# (`minibroker transactions history --svg`), to target/compose-demo-timeline.svg
# (COMPOSE_DEMO_TIMELINE to change it).
# Needs bash, docker, docker compose or docker-compose, python3, readelf; root for step 4's
# firewall rule (see docker/README.md).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

project="minibroker-demo"
keep=0
build=1
ci=0
down_only=0
break_fencing=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --keep) keep=1 ;;
    --no-build) build=0 ;;
    --ci) ci=1 ;;
    --down) down_only=1 ;;
    --break-fencing) break_fencing=1 ;;
    --project) project="$2"; shift ;;
    --project=*) project="${1#--project=}" ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compose-demo: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

image="${MINIBROKER_IMAGE:-minibroker:local}"
export MINIBROKER_IMAGE="$image"
# The cluster secret every node signs and checks internal requests with: fresh for each run
# unless the caller set one.
if [[ -z "${MINIBROKER_CLUSTER_SECRET:-}" ]]; then
  MINIBROKER_CLUSTER_SECRET="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
fi
export MINIBROKER_CLUSTER_SECRET
txn_id="${DEMO_TRANSACTIONAL_ID:-payments-app}"
topic="demo"
label="org.minibroker.demo=$project"
workdir="$(mktemp -d "${TMPDIR:-/tmp}/compose-demo.XXXXXX")"
# Where the takeover picture goes (kept after the run).
timeline_svg="${COMPOSE_DEMO_TIMELINE:-$repo/target/compose-demo-timeline.svg}"

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
  rm -rf "$workdir"
  exit 2
fi
compose_files=(-f "$repo/docker-compose.yml")
if [[ $break_fencing -eq 1 ]]; then
  # DANGER, on purpose: leaders that skip the producer-epoch check, so a zombie's writes land.
  cat >"$workdir/break-fencing.yml" <<'YAML'
services:
  leader-1: { environment: { UNSAFE_SKIP_EPOCH_CHECK: "true" } }
  leader-2: { environment: { UNSAFE_SKIP_EPOCH_CHECK: "true" } }
  leader-3: { environment: { UNSAFE_SKIP_EPOCH_CHECK: "true" } }
YAML
  compose_files+=(-f "$workdir/break-fencing.yml")
fi
compose() { "${compose_cmd[@]}" -p "$project" "${compose_files[@]}" "$@"; }

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
  # A run stopped half-way may leave containers paused: unpause them so they can be removed.
  { docker ps -q --filter "label=$label" --filter status=paused
    docker ps -q --filter "label=com.docker.compose.project=$project" --filter status=paused
  } | xargs -r docker unpause >/dev/null 2>&1 || true
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
  docker run --rm --network "$network" --label "$label" -e RUST_LOG=warn -e NO_COLOR=1 \
    "$image" minibroker "$@"
}
mb_start() { # mb_start NAME args...: a long-running CLI in a named, detached container
  local name="$1"; shift
  docker run -d --name "$project-$name" --network "$network" --label "$label" \
    -e RUST_LOG=warn -e NO_COLOR=1 "$image" minibroker "$@" >/dev/null
  echo "$project-$name"
}
describe() { # the coordinator's view of the transactional id, as JSON
  mb --json transactions describe "$txn_id"
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

# The coordinator's view of X as "PID EPOCH STATE PARTITIONS" (STATE as Ongoing, PrepareCommit,
# ...; PARTITIONS: how many partitions the open transaction has).
txn_view() { describe 2>/dev/null | checker txn-view; }
# Polls txn_view until a condition over pid, epoch, state and parts holds; prints the view.
wait_txn() { # wait_txn timeout_seconds 'python condition'
  local timeout="$1" cond="$2" view=""
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
running() { [[ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" == true ]]; }
wait_exit() { # wait_exit container timeout_seconds: prints the exit code, or "timeout"
  local c="$1" timeout="$2"
  local deadline=$(( $(date +%s) + timeout ))
  while running "$c"; do
    (( $(date +%s) < deadline )) || { echo timeout; return 0; }
    sleep 0.3
  done
  docker inspect -f '{{.State.ExitCode}}' "$c"
}
# Rejects new TCP connections from service $1 to service $2's port 9092, from inside $1's network
# namespace (needs root and nsenter/iptables on the host; fails otherwise).
block_markers() {
  local pid ip
  pid="$(docker inspect -f '{{.State.Pid}}' "$(cid "$1")")"
  ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(cid "$2")")"
  [[ "$pid" -gt 0 && -n "$ip" ]] || return 1
  command -v nsenter >/dev/null && command -v iptables >/dev/null || return 1
  nsenter -t "$pid" -n iptables -I OUTPUT -p tcp -d "$ip" --dport 9092 -j REJECT --reject-with tcp-reset 2>/dev/null
}
need_b_running() { running "$b" || die "producer B finished before step '$1' (the workload was too short for this machine)"; }
leader_state() { # leader_state partition: the leader's producer state for X's PID on demo-<p>
  mb --json producers "$topic" "$1" 2>/dev/null | checker producer-state "$pid"
}

# A writes 500 records per transaction (one second of A at its pace), so that a pause nearly
# always finds every partition in its open transaction AND records of it still to send: A's next
# request when it wakes up is then a Produce to a partition leader, not its EndTxn. (With 50, a
# pause found A between its last record and its commit one time in ~10, and the
# --break-fencing self-test, which needs that Produce to land, failed.) B writes 10 per
# transaction, so that it commits often.
a_per_txn=500
per_txn=10

# ================================================================================================
step "2. Producer instance A: transactional id '$txn_id' in its own container"
# A writes "A-0", "A-1", ... round robin over the 3 partitions, 500 records per transaction, and
# would go on for a long time: it is stopped by the fencing below, not by its record count.
# A is paced (--throughput, records/s): its producer pipeline would otherwise queue a whole
# transaction in microseconds and a pause would nearly always find it waiting for its commit.
produce_a=(produce --topic "$topic" --transactional-id "$txn_id" --records 1000000 --per-txn "$a_per_txn" --throughput 500 --value-prefix A)
a="$(mb_start producer-a "${produce_a[@]}")"
say "container $a: minibroker ${produce_a[*]}"
view="$(wait_txn 60 'epoch >= 2')" || die "A did not commit two transactions (coordinator: $view)"
read -r pid e1 _ <<<"$view"; t1=$(date +%s.%N)
sleep 2
read -r _ e2 _ <<<"$(txn_view)"; t2=$(date +%s.%N)
rate=$(awk -v e="$(( e2 - e1 ))" -v a="$t1" -v b="$t2" 'BEGIN { r = e / (b - a); printf "%.1f", (r < 1 ? 1 : r) }')
say "A commits ~$rate transactions/s (PID $pid; every commit bumps the epoch, transaction version 2)"

paused_view=""
for attempt in $(seq 1 20); do
  docker pause "$a" >/dev/null
  # A request A had already sent still lands; read the coordinator once things are quiet.
  sleep 1
  view="$(txn_view)"
  # Every partition already in the transaction: A's next request when it wakes up is a Produce
  # straight to a partition leader, which must refuse it on the epoch alone.
  if checker txn-cond "$view" 'state == "Ongoing" and parts == 3'; then paused_view="$view"; break; fi
  docker unpause "$a" >/dev/null # paused between two transactions: try again
  sleep 0.$(( RANDOM % 5 + 1 ))
done
[[ -n "$paused_view" ]] || die "could not pause A inside a transaction"
read -r a_pid a_epoch _ <<<"$paused_view"
a_init_epoch="$(docker logs "$a" 2>&1 | sed -n 's/.*initialised .*: PID [0-9-]* epoch \([0-9]*\).*/\1/p' | head -n1)"
[[ -n "$a_init_epoch" ]] || die "A did not print its initial epoch"
a_committed_txns=$(( a_epoch - a_init_epoch ))
say "PAUSE $a (docker pause: a GC pause) in the middle of a transaction"
say "      coordinator: PID $a_pid epoch $a_epoch state Ongoing; A started at epoch $a_init_epoch and committed $a_committed_txns transactions"
say "      A's open transaction: records A-$(( a_committed_txns * a_per_txn )) onwards on all 3 partitions, not committed"

# ================================================================================================
step "3. Producer instance B: the same transactional id, in a new container"
# B is paced too, so that it is still running (and mid-transaction often) during steps 5 and 6
# however fast the machine: at most 300 records/s (30 transactions/s), and as many records as A
# writes in 20 s, but at least 45 s of B (an unpaced B commits 100+ transactions/s and could be
# done before step 6).
b_rate=300
b_records=$(awk -v r="$rate" -v n="$a_per_txn" -v m="$per_txn" -v b="$b_rate" 'BEGIN { x = int(r * n * 20); if (x < b * 45) x = b * 45; if (x > 40000) x = 40000; print x - x % m }')
produce_b=(--json produce --topic "$topic" --transactional-id "$txn_id" --records "$b_records" --per-txn "$per_txn" --throughput "$b_rate" --value-prefix B)
b="$(mb_start producer-b "${produce_b[@]}")"
say "container $b: minibroker ${produce_b[*]}"
view="$(wait_txn 60 "pid == $a_pid and epoch > $a_epoch")" \
  || die "B's InitProducerId did not bump the epoch (coordinator: $view)"
read -r b_pid b_epoch b_state _ <<<"$view"
say "      B's InitProducerId: the coordinator aborted A's open transaction and bumped the epoch"
say "      why B starts at least 2 above A's $a_epoch: epoch $(( a_epoch + 1 )) was spent fencing A (the ABORT markers"
say "      of A's open transaction carry it), and B's InitProducerId, retried once that abort completed,"
say "      bumped once more to $(( a_epoch + 2 )); every commit of B since then bumps it again (one epoch per transaction)"
say "      coordinator: PID $b_pid epoch $b_epoch state $b_state"
check "B took over A's PID ($b_pid) with a higher epoch ($a_epoch -> $b_epoch; B is already committing)" \
  test "$b_pid" = "$a_pid" -a "$b_epoch" -gt "$a_epoch"
# The takeover as a picture, drawn from the id's epoch history at the coordinator (kept bounded:
# drawn now, while the fence is among its last changes).
if mkdir -p "$(dirname "$timeline_svg")" && mb transactions history "$txn_id" --svg - >"$timeline_svg" 2>/dev/null; then
  say "      the takeover as a sequence diagram (epoch history at the coordinator): $timeline_svg"
fi
if ls0="$(leader_state 0)" && [[ -n "$ls0" ]]; then
  say "      leader-1 ($topic-0) holds producer $pid at $ls0: A's epoch $a_epoch is stale there too"
fi

# ================================================================================================
step "4. docker unpause A: the zombie wakes up"
docker unpause "$a" >/dev/null
say "UNPAUSE $a: A goes on with PID $a_pid epoch $a_epoch, as if nothing happened"
a_rc="$(wait_exit "$a" 90)"
docker logs "$a" >"$workdir/a.out" 2>"$workdir/a.err" || true
say "      A exited with status $a_rc. Its last words:"
grep -v '^produced ' "$workdir/a.err" | tail -n 3 | sed 's/^/        | /'
check "A exited non-zero (status $a_rc)" test "$a_rc" != 0 -a "$a_rc" != timeout
# The safety property: A is refused on its stale epoch. A's next request is a Produce (every
# partition was already in its transaction), so the refusal comes from a partition leader:
# INVALID_PRODUCER_EPOCH. (Had it gone to the coordinator first, it would read PRODUCER_FENCED.)
# `minibroker produce` then aborts, as an application would, and the coordinator answers the
# abort with PRODUCER_FENCED: A says it was fenced and stops.
check "A says it was fenced by a newer instance" grep -q 'was fenced by a newer instance' "$workdir/a.err"
if grep -qiE 'invalid producer epoch|INVALID_PRODUCER_EPOCH' "$workdir/a.err"; then
  say "      A was refused by a partition leader: its Produce at epoch $a_epoch got INVALID_PRODUCER_EPOCH;"
  say "      its abort then got PRODUCER_FENCED from the coordinator"
elif grep -qi 'fenced' "$workdir/a.err"; then
  say "      A was fenced by the coordinator (PRODUCER_FENCED)"
fi

if [[ $break_fencing -eq 1 ]]; then
  say "--break-fencing: skipping the crash steps; straight to the check, which must catch A"
else
step "5. Crash the coordinator of '$txn_id' ($owner) between PrepareCommit and CompleteCommit"
need_b_running "coordinator crash"
# To crash the coordinator at a known point of a commit, stop its COMMIT markers from reaching
# leader-2: a firewall rule inside the coordinator's network namespace rejects its new connections
# to leader-2's port (B's own traffic, and leader-2's calls to the coordinator, are untouched). B's
# next EndTxn makes PrepareCommit durable and is answered; the markers then cannot all be written,
# so the transaction stays in PrepareCommit. The rule dies with the container's network namespace.
prep_epoch=""
c_owner="$(cid "$owner")"
if block_markers "$owner" leader-2; then
  say "BLOCK $owner -> leader-2 (iptables in $owner's network namespace): COMMIT markers for $topic-1 cannot be delivered"
  view="$(wait_txn 30 'state == "PrepareCommit"')" || die "B's commit did not reach PrepareCommit (coordinator: $view)"
  read -r _ prep_epoch _ <<<"$view"
  say "      coordinator: PID $b_pid epoch $prep_epoch state PrepareCommit (the commit is decided and durable; markers pending)"
  crash_why="B's commit at epoch $prep_epoch is decided but not complete"
else
  say "      (cannot enter $owner's network namespace here: crashing it at a random moment of B's commits)"
  crash_why="B is committing a transaction every few milliseconds"
fi
crash_started=$(date +%s)
crash_and_wait "$owner" "$crash_why"
resumed="$(docker logs --since "$crash_started" "$c_owner" 2>&1 | grep -E 'resuming markers|transaction state loaded' | sed 's/^[^ ]* *//' | head -n 3)"
[[ -n "$resumed" ]] && sed 's/^/        | /' <<<"$resumed"
if [[ -n "$prep_epoch" ]]; then
  view="$(wait_txn 60 "epoch > $prep_epoch")" || die "the commit did not complete after the restart (coordinator: $view)"
  check "the commit decided before the crash completed after the restart (epoch $prep_epoch -> $(cut -d' ' -f2 <<<"$view"))" true
  check "the restarted coordinator resumed the commit's markers from __transaction_state" \
    grep -q 'resuming markers.*Commit' <<<"$resumed"
else
  read -r _ prep_epoch _ <<<"$(txn_view)"
fi
view="$(wait_txn 60 "epoch >= $prep_epoch + 3")" \
  || die "B did not carry on after the coordinator restart (coordinator: $view)"
check "B carries on after the coordinator crash (now at epoch $(cut -d' ' -f2 <<<"$view"))" true

# ================================================================================================
step "6. Crash partition leader leader-1 in the middle of one of B's transactions"
need_b_running "leader crash"
before="$(leader_state 0 || true)"
view="$(wait_txn 30 'state == "Ongoing"')" || die "B has no open transaction (coordinator: $view)"
read -r _ kill_epoch _ <<<"$view"
say "      B's transaction at epoch $kill_epoch is open; leader-1 holds producer $pid at ${before:-?}"
crash_and_wait leader-1 "B's transaction at epoch $kill_epoch is open"
after="$(leader_state 0 || true)"
say "      leader-1 after the restart (state reloaded from its log file and checkpoint): producer $pid at ${after:-?}"
check "leader-1 kept producer $pid's state across the crash" test -n "$after"
view="$(wait_txn 60 "epoch >= $kill_epoch + 3")" \
  || die "B did not carry on after the leader restart (coordinator: $view)"
check "B carries on after the leader crash (now at epoch $(cut -d' ' -f2 <<<"$view"))" true

fi # --break-fencing

say "waiting for B to finish its $b_records records"
b_rc="$(wait_exit "$b" 300)"
docker logs "$b" >"$workdir/b.out" 2>"$workdir/b.err" || true
say "      B exited with status $b_rc: $(tail -n 1 "$workdir/b.out")"
[[ -s "$workdir/b.err" ]] && tail -n 3 "$workdir/b.err" | sed 's/^/        | /'
check "B exited 0 (status $b_rc)" test "$b_rc" = 0

# ================================================================================================
step "7. A read_committed consumer reads '$topic' from the beginning"
# EndTxn is answered once the commit is decided; its markers may still be on their way. Read only
# when the coordinator reports the last transaction complete, so that the LSO has caught up.
view="$(wait_txn 60 'state in ("CompleteCommit", "CompleteAbort", "Empty")')" \
  || die "the last transaction did not complete (coordinator: $view)"
say "      coordinator: PID $(cut -d' ' -f1 <<<"$view") epoch $(cut -d' ' -f2 <<<"$view") state $(cut -d' ' -f3 <<<"$view"): every marker is written"
mb --json consume --topic "$topic" --isolation read-committed --from-beginning >"$workdir/consumed.jsonl"
say "      $(wc -l <"$workdir/consumed.jsonl") records visible to read_committed"
verify_ok=1
checker verify --consumed "$workdir/consumed.jsonl" --per-txn "$a_per_txn" \
  --a-committed-txns "$a_committed_txns" --b-summary "$workdir/b.out" >"$workdir/verdict" || verify_ok=0
sed 's/^/      /' "$workdir/verdict"
check "every committed record exactly once, nothing of A's aborted transaction" test "$verify_ok" = 1

# ================================================================================================
if [[ $break_fencing -eq 1 ]]; then
  step "Verdict of the self-test (--break-fencing)"
  if grep -q 'ZOMBIE WRITE VISIBLE' "$workdir/verdict"; then
    say "${green}${bold}PASS${reset}: with the epoch check off, A's zombie write became visible and the checker caught it"
    echo "compose-break-fencing: 1 passed, 0 failed"
    exit 0
  fi
  say "${red}${bold}FAIL${reset}: the leaders skipped the epoch check but the checker reported no zombie write"
  echo "compose-break-fencing: 0 passed, 1 failed"
  exit 1
fi

step "Verdict"
say "image $image: $(( $(docker image inspect -f '{{.Size}}' "$image") / 1024 / 1024 )) MiB; cluster healthy ${up_secs} s after 'up'"
if [[ $failed -eq 0 ]]; then
  say "${green}${bold}PASS${reset}: the zombie was fenced and nothing committed was lost, with real containers paused and crashed"
else
  say "${red}${bold}FAIL${reset}: $failed check(s) failed"
fi
echo "compose: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
