"""mmreplay: a disk-backed, memory-mapped experience-replay store for reinforcement learning.

>>> import mmreplay as mr
>>> store = mr.ReplayStore.create("replay", capacity=1_000_000, obs_shape=(84, 84), stack=4, n_step=3)
"""

from .core.snapshot import prune_snapshots
from .datasets import DatasetError, DatasetNotFoundError, ExportResult, export, import_dataset
from .errors import (
    CorruptStoreError,
    EpisodeStateError,
    FormatVersionError,
    MMReplayError,
    NotAStoreError,
    NotSampleableError,
    RateLimitTimeout,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
    StoreNotFoundError,
)
from .options import Prioritized, RateLimit
from .reading.batch import Batch
from .reading.sequence_batch import SequenceBatch, sequence_priority
from .sampling.sumtree import SumTree
from .store import ReplayStore
from .verify import verify_store
from .version import __version__

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
    "RateLimit",
    "RateLimitTimeout",
    "ReadOnlyStoreError",
    "ReplayStore",
    "SequenceBatch",
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
    "sequence_priority",
]
