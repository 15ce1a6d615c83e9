"""A ring of preallocated batch buffers that worker processes fill in place.

Workers write each chip straight into its batch slot, so only a few bytes of bookkeeping travel
through pipes instead of pickled megabyte arrays. The buffers live in one
multiprocessing.shared_memory block created before the workers are forked (they inherit the
mapping). The block's name is unlinked as soon as the workers exist: the memory stays mapped for as
long as any process uses it, and nothing is left in /dev/shm even if the main process is killed.
"""
import os
import shutil
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

_ALIGN = 64
_SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Field:
    """One array of a batch: name, per-chip shape, dtype, and whether it is a label (else data)."""

    name: str
    shape: tuple
    dtype: type = np.float32
    is_label: bool = False

    @property
    def chip_bytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _check_shm_space(size):
    """Fail clearly when /dev/shm cannot hold the ring: writing past its end kills a worker with SIGBUS.
    (Docker gives containers 64 MB unless run with --shm-size.)"""
    if os.path.isdir(_SHM_DIR):
        free = shutil.disk_usage(_SHM_DIR).free
        if free < size:
            raise MemoryError(f"the data loader needs {size / 2**20:.0f} MB of shared memory but {_SHM_DIR} has "
                              f"{free / 2**20:.0f} MB free: enlarge it (docker run --shm-size) or lower "
                              f"TRAIN.BATCH_IMAGES or the loader's prefetch")


class BatchRing:
    """``num_slots`` batches of ``batch_size`` chips; ``slot(i)[name]`` is a (batch_size, *shape) array."""

    def __init__(self, fields, batch_size, num_slots, shared=True):
        self.fields = tuple(fields)
        self.batch_size = batch_size
        self.num_slots = num_slots
        offsets, total = [], 0
        for field in self.fields:
            offsets.append(total)
            total += -(-field.chip_bytes * batch_size // _ALIGN) * _ALIGN
        self.slot_bytes = total
        if shared:
            _check_shm_space(total * num_slots)
        self._memory = shared_memory.SharedMemory(create=True, size=total * num_slots) if shared else None
        self._unlinked = False
        self._buffer = self._memory.buf if shared else bytearray(total * num_slots)
        self._offsets = offsets
        self._slots = [self.new_views(index) for index in range(num_slots)]

    @property
    def nbytes(self):
        return self.slot_bytes * self.num_slots

    def slot(self, index):
        return self._slots[index]

    def new_views(self, index):
        """Fresh arrays ``{name: (batch_size, *shape)}`` over slot ``index`` (flags of their own)."""
        return {field.name: np.ndarray((self.batch_size,) + tuple(field.shape), field.dtype, self._buffer,
                                       offset=index * self.slot_bytes + offset)
                for field, offset in zip(self.fields, self._offsets)}

    def unlink(self):
        """Remove the block's name (mappings stay valid); called once the workers hold the mapping."""
        if self._memory is not None and not self._unlinked:
            self._unlinked = True
            self._memory.unlink()

    def close(self):
        """Drop the arrays and unmap the block (after unlink, this frees the memory)."""
        self._slots = []
        self._buffer = None
        if self._memory is not None:
            self.unlink()
            try:
                self._memory.close()
            except BufferError:
                pass  # a caller still holds a view: the mapping goes with it, the name is already gone
            self._memory = None
