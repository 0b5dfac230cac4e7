"""mmreplay: a disk-backed, memory-mapped experience-replay store for reinforcement learning.

>>> import mmreplay as mr
>>> store = mr.ReplayStore.create("replay", capacity=1_000_000, obs_shape=(84, 84), stack=4, n_step=3)
"""

from .batch import Batch
from .datasets import DatasetError, DatasetNotFoundError, ExportResult, export, import_dataset
from .errors import (
    CorruptStoreError,
    EpisodeStateError,
    FormatVersionError,
    MMReplayError,
    NotAStoreError,
    NotSampleableError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
)
from .options import Prioritized
from .sampling.sumtree import SumTree
from .snapshot import prune_snapshots
from .store import ReplayStore
from .verify import verify_store

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "DatasetError",
    "DatasetNotFoundError",
    "ExportResult",
    "CorruptStoreError",
    "EpisodeStateError",
    "FormatVersionError",
    "MMReplayError",
    "NotAStoreError",
    "NotSampleableError",
    "Prioritized",
    "ReadOnlyStoreError",
    "ReplayStore",
    "prune_snapshots",
    "verify_store",
    "StoreClosedError",
    "StoreIOError",
    "StoreLockedError",
    "StoreNotFoundError",
    "SumTree",
    "__version__",
    "export",
    "import_dataset",
]
