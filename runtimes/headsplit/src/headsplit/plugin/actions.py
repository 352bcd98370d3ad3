"""HeadSplit's maintenance actions (``dit runtimes action``): distribute a checkpoint (whole or as
per-worker shards) and build the speculation profile, every copy SHA-256 verified on its node."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dit.runtimes import (
    NODE_BASE,
    ActionPlan,
)
from dit.runtimes.helpers import EDGE
from headsplit import checkpoint as ckpt
from headsplit.config import DEFAULT_TAU, PRESETS
from headsplit.plugin.common import (
    FILES_DIR,
    NODE_NAME,
    PROFILES_DIR,
    PY,
    SHA256,
    SHA256_TEXT,
    SHARDS_DIR,
    SHARDS_JSON,
    STRATEGIES,
    HeadSplitLaunchError,
)
from headsplit.plugin.launch import TRAINED, model_tokens

# headsplit's own corpus (headsplit.speculation.DEFAULT_CORPUS, without importing torch here)
DEFAULT_CORPUS = Path(ckpt.__file__).parent / "data" / "corpus.txt"

CHECKPOINT_INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path", "sha256"],
    "properties": {
        "path": {"description": "The checkpoint file or Hugging Face directory on this machine.",
                 "type": "string", "minLength": 1},
        "sha256": {"description": "Its pin (a file's SHA-256, a directory's manifest hash).",
                   "type": "string", "pattern": SHA256, "x-pattern-text": SHA256_TEXT},
        "mode": {"description": "`whole`: every node receives the whole checkpoint; `placement`: each worker "
                 "receives a safetensors file with the tensors of the units placed on it, the controller "
                 "its own (embedding, LM head).", "enum": ["whole", "placement"], "default": "whole"},
        "workers": {"description": "mode placement: the scenario's workers (runtime.workers), rank order.",
                    "type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"type": "string", "pattern": NODE_NAME}},
        "controller": {"description": "mode placement: the controller's node (`edge`: the edge server).",
                       "type": "string", "pattern": NODE_NAME, "default": EDGE},
        "strategy": {"description": "mode placement: the placement the shards are cut for (greedy assumes "
                     "equal workers: the run's measured RTTs are not known yet).",
                     "enum": list(STRATEGIES), "default": "layerwise"},
        "model": {"description": "mode placement, a single file: its preset (a directory has config.json).",
                  "enum": sorted(PRESETS)},
        "memory_mb": {"description": "mode placement: the memory per worker the placement must fit.",
                      "type": "integer", "minimum": 1, "default": 1 << 20},
        "out": {"description": "mode placement: the directory on this machine the shards are written to "
                "(give it as the scenario's runtime.checkpoint.shards).", "type": "string", "minLength": 1,
                "default": "headsplit-shards"},
    },
}  # fmt: skip

PROFILE_INPUTS: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "model": {"description": "The model preset.", "enum": sorted(PRESETS), "default": "gpt2-tiny"},
        "tau": {"description": "The tolerance the profile is built for.", "type": "number", "minimum": 0,
                "default": DEFAULT_TAU},
        "corpus": {"description": "A text corpus on the edge server (default: headsplit's own); for a trained "
                   "model (smollm2-135m) a file on this machine, tokenized here with the model's own tokenizer.",
                   "type": "string", "minLength": 1},
        "checkpoint": {"description": "The checkpoint the profile measures, as given to distribute-checkpoint "
                       "(its path on this machine; the edge server reads its distributed copy); without it the "
                       "preset's seeded weights. A trained model needs it.", "type": "string", "minLength": 1},
        "sha256": {"description": "The checkpoint's pin (with checkpoint).", "type": "string", "pattern": SHA256,
                   "x-pattern-text": SHA256_TEXT},
        "out": {"description": "Directory on this machine the profile is fetched into.", "type": "string",
                "minLength": 1, "default": "headsplit-profiles"},
    },
}  # fmt: skip


# What the actions put on a node is the owner's alone (a checkpoint may be one only its author could
# read on this machine); the processes that read it run as the same user. Symbolic: a directory copied
# whole keeps its subdirectories searchable (X) while its files become 0600.
FILE_MODE = "u=rwX,go="


def _verified_copy_tasks(
    src: str, dest_dir: str, name: str, sha_expr: str, what: str
) -> list[dict[str, Any]]:
    """Copy ``src`` to ``dest_dir/name`` on the node and check its SHA-256 there (both hashes on failure)."""
    dest = f"{dest_dir}/{name}"
    return [
        {
            "name": f"The {what}'s directory",
            "dit_trusted_dir": {"path": dest_dir},
        },
        {
            "name": f"Copy the {what}",
            "ansible.builtin.copy": {"src": src, "dest": dest, "mode": FILE_MODE},
        },
        {
            "name": f"SHA-256 of the {what} on the node",
            "ansible.builtin.stat": {"path": dest, "get_checksum": True, "checksum_algorithm": "sha256"},
            "register": "hs_copied",
        },
        {
            "name": f"The {what}'s SHA-256 on the node is the expected one",
            "ansible.builtin.assert": {
                "that": [f"hs_copied.stat.checksum == {sha_expr}"],
                "fail_msg": (
                    f"{{{{ inventory_hostname }}}}: {dest}: SHA-256 {{{{ hs_copied.stat.checksum }}}}, "
                    f"expected {{{{ {sha_expr} }}}}"
                ),
                "quiet": True,
            },
        },
    ]


BASE = NODE_BASE


LOCAL_PY = "{{ ansible_playbook_python }}"  # this machine's dit interpreter (headsplit is installed in it)


def _local(task: dict[str, Any]) -> dict[str, Any]:
    return {**task, "delegate_to": "localhost", "run_once": True}


def _node_verify(dest: str, sha: str, what: str) -> dict[str, Any]:
    """Verify a checkpoint file or directory on the node with headsplit's own check (names the file and
    both hashes; a directory is checked file by file against the SHA256SUMS sent with it)."""
    return {
        "name": f"The {what} on the node is the pinned one",
        "ansible.builtin.command": {"argv": [PY, "-m", "headsplit.checkpoint", dest, "--sha256", sha]},
        "changed_when": False,
    }


# An action's inputs, and what is derived from them here (an absolute path, a file name), reach the plays
# only as these variables: the plays' own text is a template, and a path such as "x{{ lookup(...) }}" pasted
# into it would run on this machine. Extra variables are written unsafe (data, never a template).
CK_PATH = "{{ hs_checkpoint_path }}"
CK_NAME = "{{ hs_checkpoint_name }}"
OUT = "{{ hs_out }}"


def _whole_file_play() -> dict[str, Any]:
    """One safetensors file: checked here and on every node with Ansible's own SHA-256 (no headsplit
    needed on this machine)."""
    path, name = CK_PATH, CK_NAME
    local = [
        _local({
            "name": "SHA-256 of the checkpoint on this machine",
            "ansible.builtin.stat": {"path": path, "get_checksum": True, "checksum_algorithm": "sha256"},
            "register": "hs_local",
        }),
        _local({
            "name": "The checkpoint on this machine is the pinned one",
            "ansible.builtin.assert": {
                "that": ["hs_local.stat.exists", "hs_local.stat.checksum == dit_action_inputs.sha256"],
                "fail_msg": (
                    f"{path}: SHA-256 {{{{ hs_local.stat.checksum | default('(no such file)') }}}}, "
                    "expected {{ dit_action_inputs.sha256 }}"
                ),
                "quiet": True,
            },
        }),
    ]  # fmt: skip
    return {
        "name": "HeadSplit: distribute the checkpoint",
        "hosts": "all",
        "gather_facts": False,
        "tasks": local + _verified_copy_tasks(
            path, f"{BASE}/{FILES_DIR}/{{{{ dit_action_inputs.sha256 }}}}", name,
            "dit_action_inputs.sha256", "checkpoint",
        ),
    }  # fmt: skip


def distribute_checkpoint(inputs: Mapping[str, Any]) -> ActionPlan:
    """Verify the checkpoint here; copy it whole to every node, or cut it into per-worker shards here
    and copy each worker its own; verify every copy on its node."""
    local_path = os.path.abspath(str(inputs["path"]))
    extravars: dict[str, Any] = {
        "hs_checkpoint_path": local_path,
        "hs_checkpoint_name": posixpath.basename(local_path.rstrip("/")),
    }
    path, name = CK_PATH, CK_NAME
    sha = "{{ dit_action_inputs.sha256 }}"
    here = _local({
        "name": "The checkpoint on this machine is the pinned one",
        "ansible.builtin.command": {"argv": [LOCAL_PY, "-m", "headsplit.checkpoint", path, "--sha256", sha]},
        "changed_when": False,
    })  # fmt: skip
    dest_dir = f"{BASE}/{FILES_DIR}/{sha}"
    if inputs.get("mode", "whole") == "whole" and not os.path.isdir(local_path):
        return ActionPlan(plays=[_whole_file_play()], extravars=extravars)
    if inputs.get("mode", "whole") == "whole":
        is_dir = True
        tasks: list[dict[str, Any]] = [
            here,
            {"name": "The checkpoint's directory", "dit_trusted_dir": {"path": dest_dir}},
            {"name": "Copy the checkpoint", "ansible.builtin.copy": {"src": path, "dest": f"{dest_dir}/",
                                                                     "mode": FILE_MODE}},
        ]  # fmt: skip
        if is_dir:  # the manifest taken here goes with it: the node names a changed file
            extravars["hs_checkpoint_manifest"] = ckpt.manifest_text(ckpt.manifest(Path(local_path)))
            tasks.append(
                {
                    "name": "The manifest of the checkpoint (SHA256SUMS)",
                    "ansible.builtin.copy": {
                        "content": "{{ hs_checkpoint_manifest }}",
                        "dest": f"{dest_dir}/{name}/{ckpt.SUMS}",
                        "mode": FILE_MODE,
                    },
                }
            )
        tasks.append(_node_verify(f"{dest_dir}/{name}", sha, "checkpoint"))
        play = {"name": "HeadSplit: distribute the checkpoint", "hosts": "all", "gather_facts": False,
                "tasks": tasks}  # fmt: skip
        return ActionPlan(plays=[play], extravars=extravars)
    workers = [str(w) for w in inputs.get("workers") or []]
    if not workers:
        raise HeadSplitLaunchError("workers: mode placement needs the scenario's workers (runtime.workers)")
    extravars |= {
        "hs_out": os.path.abspath(str(inputs.get("out", "headsplit-shards"))),
        "hs_workers": workers,
        "hs_controller": str(inputs.get("controller", EDGE)),
    }
    out = OUT
    argv = [LOCAL_PY, "-m", "headsplit.shard", "--checkpoint", path, "--sha256", sha, "--workers",
            str(len(workers)), "--strategy", str(inputs.get("strategy", "layerwise")), "--memory-mb",
            str(int(inputs.get("memory_mb", 1 << 20))), "--out", out]  # fmt: skip
    if inputs.get("model"):
        argv += ["--model", "{{ dit_action_inputs.model }}"]
    is_controller = (
        "'edge' in group_names"
        if extravars["hs_controller"] == EDGE
        else "inventory_hostname == hs_controller"
    )
    owner = f"('controller' if {is_controller} else 'worker' ~ (hs_workers.index(inventory_hostname) + 1))"
    record = f"(lookup('file', hs_out ~ '/{SHARDS_JSON}') | from_json).files[{owner}]"
    shard_dir = f"{dest_dir}/{SHARDS_DIR}"
    when = f"({is_controller}) or inventory_hostname in hs_workers"
    tasks = [
        here,
        _local({"name": "Cut the checkpoint into per-worker shards here", "ansible.builtin.command": {"argv": argv},
                "changed_when": True}),
        {"name": "The shards' directory", "dit_trusted_dir": {"path": shard_dir}, "when": when},
        {"name": "Copy this node's shard", "ansible.builtin.copy": {
            "src": f"{out}/{{{{ {record}.file }}}}", "dest": f"{shard_dir}/{{{{ {record}.file }}}}",
            "mode": FILE_MODE}, "when": when},
        {**_node_verify(f"{shard_dir}/{{{{ {record}.file }}}}", f"{{{{ {record}.sha256 }}}}", "shard"),
         "when": when},
    ]  # fmt: skip
    play = {"name": "HeadSplit: distribute per-worker checkpoint shards", "hosts": "all", "gather_facts": False,
            "tasks": tasks}  # fmt: skip
    return ActionPlan(plays=[play], extravars=extravars)


def profile_name(model: str, tau: float) -> str:
    return f"speculation-{model}-tau{tau:g}.json"


def build_speculation_profile(inputs: Mapping[str, Any]) -> ActionPlan:
    """Run ``python -m headsplit.speculation`` on the edge server, fetch the profile, distribute it."""
    model, tau = str(inputs.get("model", "gpt2-tiny")), float(inputs.get("tau", DEFAULT_TAU))
    extravars: dict[str, Any] = {
        "hs_profile_name": profile_name(model, tau),
        "hs_profile_model": model,
        "hs_out_dir": os.path.abspath(str(inputs.get("out", "headsplit-profiles"))),
    }
    name, out_dir = "{{ hs_profile_name }}", "{{ hs_out_dir }}"
    on_edge = f"{BASE}/{PROFILES_DIR}/{name}"
    argv = [PY, "-m", "headsplit.speculation", "--model", "{{ hs_profile_model }}", "--tau", f"{tau:g}",
            "--out", on_edge]  # fmt: skip
    ids_task: list[dict[str, Any]] = []
    if bool(inputs.get("checkpoint")) != bool(inputs.get("sha256")):
        missing = "sha256" if inputs.get("checkpoint") else "checkpoint"
        raise HeadSplitLaunchError(
            f"{missing}: checkpoint and sha256 go together (the checkpoint and its pin)"
        )
    if inputs.get("checkpoint"):
        local = os.path.abspath(str(inputs["checkpoint"]))
        extravars |= {
            "hs_ck_sha256": str(inputs["sha256"]),
            "hs_ck_name": posixpath.basename(local.rstrip("/")),
        }
        # where distribute-checkpoint put it on the edge server
        argv += ["--checkpoint", f"{BASE}/{FILES_DIR}/{{{{ hs_ck_sha256 }}}}/{{{{ hs_ck_name }}}}",
                 "--sha256", "{{ hs_ck_sha256 }}"]  # fmt: skip
    if model in TRAINED:
        if not inputs.get("checkpoint"):
            raise HeadSplitLaunchError(
                f"checkpoint: model {model} is measured on its trained weights: give the directory "
                f"`python -m dit.models.convert {model} DIR` wrote (distributed by distribute-checkpoint) "
                "and its pin as sha256"
            )
        # the nodes' HeadSplit venvs have no tokenizer: the corpus goes to the edge in the model's tokens
        corpus = Path(str(inputs.get("corpus") or DEFAULT_CORPUS))
        try:
            text = corpus.read_text(encoding="utf-8")
        except OSError as exc:
            raise HeadSplitLaunchError(f"corpus: {corpus}: {exc.strerror}") from None
        extravars |= {"hs_corpus_ids": list(model_tokens(model, text)), "hs_corpus": str(corpus)}
        on_edge_ids = f"{BASE}/{PROFILES_DIR}/{name}.ids.json"
        ids_task = [{"name": "The corpus in the model's own tokens",
                     "ansible.builtin.copy": {"content": "{{ hs_corpus_ids | to_json }}", "dest": on_edge_ids,
                                              "mode": FILE_MODE}}]  # fmt: skip
        # --corpus names the text the ids came from (its SHA-256 goes in the profile); a path here, so
        # the edge reads the installed copy of the default and only an explicit corpus must be there too
        argv += ["--ids", on_edge_ids]
        if inputs.get("corpus"):
            argv += ["--corpus", "{{ hs_corpus }}"]
    elif inputs.get("corpus"):
        extravars["hs_corpus"] = str(inputs["corpus"])
        argv += ["--corpus", "{{ hs_corpus }}"]
    build = {
        "name": "HeadSplit: build the speculation profile on the edge server",
        "hosts": "edge",
        "gather_facts": False,
        "tasks": [
            {
                "name": "The profiles directory",
                "dit_trusted_dir": {"path": f"{BASE}/{PROFILES_DIR}"},
            },
            *ids_task,
            {"name": "Build the profile", "ansible.builtin.command": {"argv": argv}, "changed_when": True},
            {
                "name": "SHA-256 of the profile",
                "ansible.builtin.stat": {"path": on_edge, "get_checksum": True, "checksum_algorithm": "sha256"},
                "register": "hs_profile",
            },
            {
                "name": "Fetch the profile",
                "ansible.builtin.fetch": {"src": on_edge, "dest": f"{out_dir}/{name}", "flat": True},
            },
            {
                "name": "The profile's SHA-256",
                "ansible.builtin.set_fact": {"hs_profile_sha256": "{{ hs_profile.stat.checksum }}"},
            },
            {"name": "Say where it is", "ansible.builtin.debug": {
                "msg": f"{out_dir}/{name} sha256 {{{{ hs_profile_sha256 }}}}"}},
        ],
    }  # fmt: skip
    sha = "hostvars[groups['edge'][0]].hs_profile_sha256"
    distribute = {
        "name": "HeadSplit: distribute the speculation profile",
        "hosts": "devices",
        "gather_facts": False,
        "tasks": _verified_copy_tasks(f"{out_dir}/{name}", f"{BASE}/{PROFILES_DIR}", name, sha, "profile"),
    }
    return ActionPlan(plays=[build, distribute], extravars=extravars)
