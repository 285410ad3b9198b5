#!/usr/bin/env python3
"""Helpers of scripts/compose-demo.sh: routing and the final exactly-once check.

  compose_demo_check.py owner TOPOLOGY.toml TRANSACTIONAL_ID
      The compose service of the coordinator that owns the id (cluster::Topology's routing:
      Java's String.hashCode, sign bit masked, mod transaction_state_partitions; state partition p
      belongs to the coordinator at index p mod C of the coordinators sorted by id).
  compose_demo_check.py txn-view  < `minibroker transactions describe ID --json`
      Prints "PID EPOCH STATE" (STATE as Empty, Ongoing, PrepareCommit, ...).
  compose_demo_check.py txn-cond "PID EPOCH STATE" 'python condition over pid, epoch, state'
      Exit status 0 when the condition holds.
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
    print(f"{pid} {epoch} {state}")
    return 0


def txn_cond(view, condition):
    pid, epoch, state = view.split()
    env = {"pid": int(pid), "epoch": int(epoch), "state": state}
    return 0 if eval(condition, {}, env) else 1


def main(argv):
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
