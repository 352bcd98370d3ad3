"""The scenario format: JSON Schema, strict YAML loading, semantic checks, sweeps and hashing.

One YAML file is one experiment (``scenarios/*.yaml``, schema ``scenarios/scenario.schema.json``)::

    from dit.scenario import load
    for scenario in load("scenarios/ch4_validation.yaml"):   # one per sweep point
        print(scenario.label, scenario.hash)

Hashing rules: :attr:`Scenario.hash` is the SHA-256 of the canonical JSON (sorted keys, no spaces,
UTF-8) of :attr:`Scenario.data`, the resolved document: every default applied, the model always an
object, ``optimisation.policy`` and ``model.input.seed`` filled in, partition points always explicit
vectors, the sweep applied and the ``sweep`` key removed, integral floats written as integers
(``5.0`` hashes like ``5``). So key order, YAML style and spelling out a default do not change the
hash; any value that changes the experiment (including ``name`` and ``description``) does.
"""

from __future__ import annotations

from dit.scenario.core import MAX_VARIANTS, expand, load, loads, resolve, validate
from dit.scenario.errors import FieldError, ScenarioError
from dit.scenario.frozen import FrozenDict, freeze, thaw
from dit.scenario.schema import device_blocks, load_schema, schema_path
from dit.scenario.spec import (
    EdgeSpec,
    InferenceSpec,
    InputSpec,
    ModelSpec,
    OptimisationSpec,
    Scenario,
    TimingSpec,
    canonical_json,
    content_hash,
)
from dit.scenario.yamlio import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES, dump_yaml, load_yaml

__all__ = [
    "MAX_VARIANTS",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "EdgeSpec",
    "FieldError",
    "FrozenDict",
    "InferenceSpec",
    "InputSpec",
    "ModelSpec",
    "OptimisationSpec",
    "Scenario",
    "ScenarioError",
    "TimingSpec",
    "canonical_json",
    "content_hash",
    "device_blocks",
    "dump_yaml",
    "expand",
    "freeze",
    "load",
    "load_schema",
    "load_yaml",
    "loads",
    "resolve",
    "schema_path",
    "thaw",
    "validate",
]
