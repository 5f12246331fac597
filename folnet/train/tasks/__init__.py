"""Finetuning tasks: the registry, readers for the published file formats, encoding, metrics.

Every task belongs to a `TaskFamily` (GLUE, SQuAD 2.0, FOLIO, CLUTRR and the generated kinship
task) that reads, encodes and scores it; the families are registered here, in this order.
Typical use::

    data = read_split("glue/rte", "glue_data/RTE", "train")
    batch = encode_examples(data.task, data.examples, tokenizer)   # max_len = task.seq_len

`read_split` returns the task alongside the examples because one task (CLUTRR) only learns
its label set from its train file; always encode with ``data.task``. Each split is read from the
task's original files (GLUE TSVs, SQuAD json, FOLIO jsonl, CLUTRR csv) or, when those are not
there, from the same data in a Hugging Face datasets format (`hfdatasets`: a save_to_disk
folder, or parquet/arrow/jsonl/json/csv files with the published columns)::

    data = read_split("glue/rte", "glue", "validation")    # glue/rte/validation-*.parquet
"""

from __future__ import annotations

from folnet.train.tasks import clutrr, folio, glue, kinship, squad
from folnet.train.tasks.base import (
    EncodedSplit,
    Example,
    FinetuneDefaults,
    SplitData,
    TaskSpec,
    find_split_files,
)
from folnet.train.tasks.clutrr import clutrr_labels
from folnet.train.tasks.encode import (
    IGNORE_INDEX,
    SpecialIds,
    encode_examples,
    pack,
    special_ids,
    truncate_longest_first,
)
from folnet.train.tasks.registry import (
    TASKS,
    TaskFamily,
    family_of,
    get_task,
    read_split,
    register_family,
)
from folnet.train.tasks.squad import (
    SquadAnswer,
    SquadExample,
    SquadFeature,
    encode_squad,
    features_to_tensors,
    parse_squad,
    postprocess_predictions,
    read_squad,
)

for _family in (glue.FAMILY, squad.FAMILY, folio.FAMILY, clutrr.FAMILY, kinship.FAMILY):
    register_family(_family)

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "EncodedSplit",
    "Example",
    "FinetuneDefaults",
    "SpecialIds",
    "SplitData",
    "SquadAnswer",
    "SquadExample",
    "SquadFeature",
    "TaskFamily",
    "TaskSpec",
    "clutrr_labels",
    "encode_examples",
    "encode_squad",
    "family_of",
    "features_to_tensors",
    "find_split_files",
    "get_task",
    "pack",
    "parse_squad",
    "postprocess_predictions",
    "read_split",
    "read_squad",
    "register_family",
    "special_ids",
    "truncate_longest_first",
]
