"""What HeadSplit's plug-in modules share: file names, tags and directories on the node, the errors."""

from __future__ import annotations

from pathlib import Path

from dit.analysis.run import AggregateError

CONFIG_FILE = "headsplit.json"
PLACEMENT_COSTS_FILE = (
    "placement-costs.json"  # beside CONFIG_FILE on the controller's node (placement_profile)
)
RESULT_FILE = "results/headsplit.json"
RESULT_NAME = "headsplit.json"  # collected as raw/<controller>/<controller>_headsplit.json
CONTROLLER_TAG = "hs-controller"
WORKER_TAG = "hs-worker{rank}"
STRATEGIES = ("layerwise", "roundrobin", "greedy")
DEFAULT_PORT = 29500
# Schema patterns end in `$(?!\n)`: JSON Schema's `pattern` is ECMA-262, where `$` is the end of the
# string, but jsonschema runs it with Python's re.search, where `$` also matches before a final newline
# ("device1\n" would pass validate and fail on the node); the lookahead refuses that under both.
NODE_NAME = r"^[A-Za-z][A-Za-z0-9_-]{0,62}$(?!\n)"
SHA256 = r"^[0-9a-f]{64}$(?!\n)"
ABSOLUTE_PATH = r"^/[^\u0000-\u001f\u007f]*$(?!\n)"
ABSOLUTE_PATH_TEXT = "is not an absolute path (a '/' first, no control characters)"
SHA256_TEXT = "is not a SHA-256 (64 lower-case hexadecimal digits)"
# Where the actions put files on a node (below its dit_remote_base) and where the launch finds them.
FILES_DIR = "headsplit/files"
SHARDS_DIR = "shards"  # below FILES_DIR/<pin>/: the per-worker shards of distribute-checkpoint
SHARDS_JSON = "shards.json"
PROFILES_DIR = "headsplit/profiles"
# The held-out paragraph of ``perplexity: true``: written for this project beside the speculation corpus
# (data/corpus.txt, all of which build-speculation-profile reads) and in no profile's input.
HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "heldout.txt"

# The readiness plays' and the actions' interpreter on a node: the block's ``python`` (passed as an
# extra var), else the node's headsplit venv (``dit_headsplit_python``, see launch._runtime_python),
# else the node's dit Python.
PY = (
    "{{ dit_headsplit_check_python | default(dit_headsplit_python) | default(dit_python)"
    " | default(ansible_python_interpreter) | default('/usr/bin/python3') }}"
)


class HeadSplitLaunchError(ValueError):
    """A runtime block the launch cannot turn into processes; the message names the field."""


class HeadSplitResultsError(AggregateError):
    """A results file that is not what the contract says; the message names the file and the field."""
