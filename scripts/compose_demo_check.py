#!/usr/bin/env python3
"""Helpers of scripts/compose-demo.sh: routing and the final exactly-once check.

  compose_demo_check.py owner TOPOLOGY.toml TRANSACTIONAL_ID
      The compose service of the coordinator that owns the id (cluster::Topology's routing:
      Java's String.hashCode, sign bit masked, mod transaction_state_partitions; state partition p
      belongs to the coordinator at index p mod C of the coordinators sorted by id).
  compose_demo_check.py txn-view  < `minibroker transactions describe ID --json`
      Prints "PID EPOCH STATE PARTITIONS" (STATE as Empty, Ongoing, PrepareCommit, ...).
  compose_demo_check.py txn-cond "PID EPOCH STATE PARTITIONS" 'condition over pid, epoch, state, parts'
      Exit status 0 when the condition holds.
  compose_demo_check.py producer-state PID  < `minibroker producers TOPIC P --json`
      One line about producer PID's state at that leader (exit 1 if the leader has none).
  compose_demo_check.py verify --consumed FILE --per-txn N --a-committed-txns K --b-summary FILE
      The exactly-once verdict (see `verify`); exit 1 on any violation.
"""
import json
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def java_string_hash(key):
    h = 0
    data = key.encode("utf-16-le")
    for i in range(0, len(data), 2):
        unit = data[i] | (data[i + 1] << 8)
        h = (h * 31 + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def load_topology(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def owner(topology_path, txn_id):
    topology = load_topology(topology_path)
    partitions = topology["transaction_state_partitions"]
    state_partition = (java_string_hash(txn_id) & 0x7FFFFFFF) % partitions
    coordinators = sorted(topology["coordinators"], key=lambda n: n["id"])
    node = coordinators[state_partition % len(coordinators)]
    # Service name = the host part of the address (the compose topology uses service names).
    print(node["address"].rsplit(":", 1)[0])


STATES = {
    "EMPTY": "Empty",
    "ONGOING": "Ongoing",
    "PREPARECOMMIT": "PrepareCommit",
    "PREPAREABORT": "PrepareAbort",
    "COMPLETECOMMIT": "CompleteCommit",
    "COMPLETEABORT": "CompleteAbort",
}
STATE_NUMBERS = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"]


def normalise_state(value):
    if isinstance(value, int):
        return STATE_NUMBERS[value] if 0 <= value < len(STATE_NUMBERS) else str(value)
    key = str(value).upper().replace("TXN_STATE_", "").replace("_", "").replace("-", "")
    return STATES.get(key, str(value))


def first_description(doc):
    """The transaction description inside `transactions describe --json` output."""
    if isinstance(doc, list):
        return first_description(doc[0]) if doc else None
    if not isinstance(doc, dict):
        return None
    if any(k in doc for k in ("producer_id", "pid", "producerId")):
        return doc
    for value in doc.values():
        if isinstance(value, (dict, list)):
            found = first_description(value)
            if found is not None:
                return found
    return None


def pick(d, *names):
    for name in names:
        if name in d:
            return d[name]
    raise KeyError(names[0])


def txn_view(text):
    """stdin: `transactions describe ID --json`; stdout: "PID EPOCH STATE"."""
    doc = None
    for line in reversed([l for l in text.splitlines() if l.strip()]):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if doc is None:
        doc = json.loads(text)
    d = first_description(doc)
    if d is None:
        return 1
    pid = pick(d, "producer_id", "pid", "producerId")
    epoch = pick(d, "producer_epoch", "epoch", "producerEpoch")
    state = normalise_state(pick(d, "state", "txn_state"))
    parts = len(d.get("partitions") or [])
    print(f"{pid} {epoch} {state} {parts}")
    return 0


def txn_cond(view, condition):
    pid, epoch, state, parts = view.split()
    env = {"pid": int(pid), "epoch": int(epoch), "state": state, "parts": int(parts)}
    return 0 if eval(condition, {}, env) else 1


def producer_state(text, pid):
    """stdin: `producers TOPIC P --json`; stdout: the state of producer `pid`, if present."""
    for p in json.loads(text or "[]"):
        if int(p.get("producer_id", -1)) == int(pid):
            start = p.get("current_txn_start_offset", -1)
            print(
                f"epoch {p.get('producer_epoch')}, last sequence {p.get('last_sequence')}, "
                f"open transaction {'from offset ' + str(start) if start >= 0 else 'none'}"
            )
            return 0
    return 1


def verify(args):
    """The exactly-once check over what a read_committed consumer saw.

    A committed exactly `a_committed_txns` whole transactions before it was paused: records
    A-0 .. A-(a_committed_txns * per_txn - 1). Its open transaction (A-k for larger k) was aborted
    by B's InitProducerId, and anything A sent after it woke up must have been rejected: none of
    it may be visible. B committed every record it reports (records_committed), B-0 .. B-(n-1).
    Every expected record must be visible exactly once, per partition in the order it was sent,
    and nothing else may be visible.
    """
    per_txn = args["per_txn"]
    a_expected = args["a_committed_txns"] * per_txn
    problems = []
    b_expected = None
    try:
        with open(args["b_summary"]) as f:
            lines = [l for l in f.read().splitlines() if l.strip().startswith("{")]
        summary = json.loads(lines[-1])
        b_expected = int(summary["records_committed"])
    except (OSError, IndexError, KeyError, ValueError) as e:
        problems.append(f"B reported no summary ({e}): B's committed records are unknown")

    seen = {}
    last_n = {}
    unexpected = []
    out_of_order = []
    with open(args["consumed"]) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            value = r["value"]
            seen[value] = seen.get(value, 0) + 1
            prefix, _, num = value.partition("-")
            if prefix not in ("A", "B") or not num.isdigit():
                unexpected.append(value)
                continue
            n = int(num)
            key = (prefix, r.get("partition"))
            if key in last_n and n <= last_n[key]:
                out_of_order.append(value)
            last_n[key] = n

    def report(name, expected_count):
        expected = [f"{name}-{i}" for i in range(expected_count)]
        missing = [v for v in expected if seen.get(v, 0) == 0]
        dups = [v for v in expected if seen.get(v, 0) > 1]
        extra = sorted(
            (v for v in seen if v.startswith(name + "-") and v[len(name) + 1:].isdigit()
             and int(v[len(name) + 1:]) >= expected_count),
            key=lambda v: int(v[len(name) + 1:]),
        )
        return expected, missing, dups, extra

    _, a_missing, a_dups, a_extra = report("A", a_expected)
    print(f"A: {a_expected} records committed before the pause ({args['a_committed_txns']} transactions): "
          f"{a_expected - len(a_missing)} visible, {len(a_missing)} missing, {len(a_dups)} duplicated")
    print(f"A: records of its aborted transaction or sent after it was fenced (A-{a_expected} onwards): "
          f"{len(a_extra)} visible")
    if a_missing:
        problems.append(f"committed records of A are missing: {a_missing[:5]}")
    if a_dups:
        problems.append(f"records of A are duplicated: {a_dups[:5]}")
    if a_extra:
        problems.append(f"ZOMBIE WRITE VISIBLE: records of A's aborted/fenced transaction: {a_extra[:5]}")
    if b_expected is not None:
        _, b_missing, b_dups, b_extra = report("B", b_expected)
        print(f"B: {b_expected} records committed: {b_expected - len(b_missing)} visible, "
              f"{len(b_missing)} missing, {len(b_dups)} duplicated, {len(b_extra)} unexpected")
        if b_missing:
            problems.append(f"COMMITTED RECORDS LOST: B's {b_missing[:5]} (of {len(b_missing)})")
        if b_dups:
            problems.append(f"records of B are duplicated: {b_dups[:5]}")
        if b_extra:
            problems.append(f"records of B that it did not report as committed: {b_extra[:5]}")
    if unexpected:
        problems.append(f"records nobody wrote: {unexpected[:5]}")
    if out_of_order:
        problems.append(f"records out of order within a partition: {out_of_order[:5]}")
    for p in problems:
        print(f"VIOLATION: {p}")
    print("verdict: " + ("PASS" if not problems else f"FAIL ({len(problems)} violations)"))
    return 0 if not problems else 1


def parse_flags(argv):
    out = {}
    it = iter(argv)
    for flag in it:
        name = flag.lstrip("-").replace("-", "_")
        value = next(it)
        out[name] = int(value) if value.lstrip("-").isdigit() else value
    return out


def main(argv):
    if len(argv) >= 2 and argv[1] == "producer-state":
        return producer_state(sys.stdin.read(), argv[2])
    if len(argv) >= 2 and argv[1] == "verify":
        return verify(parse_flags(argv[2:]))
    if len(argv) >= 2 and argv[1] == "owner":
        owner(argv[2], argv[3])
        return 0
    if len(argv) >= 2 and argv[1] == "txn-view":
        return txn_view(sys.stdin.read())
    if len(argv) >= 2 and argv[1] == "txn-cond":
        return txn_cond(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
