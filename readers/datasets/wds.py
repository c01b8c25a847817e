"""Reader of WebDataset tar outputs: an iterable dataset that streams shards sequentially.

Shards are split across DataLoader workers (worker ``w`` of ``n`` reads shards ``w, w+n, ...``);
with ``shuffle=N`` the shard order changes each epoch and samples pass through an N-sample shuffle
buffer. Tar members are read in memory only; a member with an absolute path or ``..`` is refused.
The root may be a URL: shards then stream from it (``readers.remote.urls``).
"""

from __future__ import annotations

import io
import os
import random
import warnings
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.spec.codecs import NpyDecoder
from packer.spec.errors import ManifestError
from packer.spec.manifest import ShardEntry
from packer.spec.shard_names import NPY_IMAGE_SHAPES, TAR_SUFFIX, wds_lengths_suffix
from packer.spec.tario import decode_tar_sample, iter_shard_samples, tar_fields
from readers.augment.crops import Placement
from readers.datasets.base import ReaderBase, decode_field
from readers.loading.collate import Numbered, PackedBatch
from readers.remote.urls import file_url, is_url, iter_remote_tar, read_remote_file

PASS_SLOTS = 64
"""DataLoader workers whose passes a tar-shard reader counts in shared memory (see ``set_epoch``)."""


class WdsDataset(ReaderBase, IterableDataset):
    """Iterable dataset over a wds output.

    Yields ``(image, label)`` (``(image, label, meta)`` with ``return_meta=True``) as the map-style
    readers do; ``meta["index"]`` is the sample's position in the output, the index the map-style
    readers use. ``len()`` is the number of samples in the output. ``shuffle=N`` shuffles the shard
    order and passes samples through an N-sample buffer; call ``set_epoch(e)`` before each epoch.
    ``root`` may be a URL (``readers.remote.urls``): shards then stream from it, each checked against the
    manifest's SHA-256; ``cache_dir`` keeps verified copies for later passes.
    """

    format_name = "wds"
    reads_urls = True

    def __init__(
        self, root: str | os.PathLike, *, shuffle: int = 0, cache_dir: Optional[str | os.PathLike] = None, **options
    ) -> None:
        super().__init__(root, **options)
        self.cache_dir = cache_dir  # for URL roots: where streamed shards are kept (readers.remote.urls)
        self.shuffle = int(shuffle)
        self.epoch = 0
        # [the epoch set_epoch chose, then the passes each DataLoader worker (by id) began since], in
        # shared memory: workers, persistent or made anew each epoch, see set_epoch and count their passes
        self._epochs = torch.zeros(1 + PASS_SLOTS, dtype=torch.int64).share_memory_()
        self._local_passes = -1  # a worker beyond PASS_SLOTS counts its own
        self._batching: Optional[dict] = None  # set by configure_batches
        self._npy = NpyDecoder()  # the images of an output share one npy header: parsed once

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle, crops and flips of epoch ``epoch`` (same seed and epoch give the same
        order), in this process and in the DataLoader workers reading this dataset.

        Each further pass without a call moves to the next epoch: every worker counts its passes
        (up to PASS_SLOTS workers; beyond, each copy counts its own).
        """
        self.epoch = int(epoch)
        self._epochs[0] = self.epoch
        self._epochs[1:] = 0
        self._local_passes = -1

    def _pass_epoch(self, worker: int) -> int:
        """The epoch of the pass worker ``worker`` (0 without workers) begins now: set_epoch's, plus
        the passes it began since."""
        if worker >= PASS_SLOTS:
            self._local_passes += 1
            return int(self._epochs[0]) + self._local_passes
        done = int(self._epochs[1 + worker])
        self._epochs[1 + worker] = done + 1
        return int(self._epochs[0]) + done

    def shard_order(self, epoch: Optional[int] = None) -> list[int]:
        """All shard numbers in an epoch's order (shuffled when ``shuffle`` is on)."""
        order = list(range(len(self.manifest.shards)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + (self.epoch if epoch is None else epoch)).shuffle(order)
        return order

    def __len__(self) -> int:
        """Samples in the output; with ``configure_batches``, this rank's batches per epoch."""
        return self._batch_count() if self._batching is not None else self.manifest.samples

    def __iter__(self) -> Iterator:
        if self._batching is not None:
            yield from self._iter_batches()
            return
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self._pass_epoch(worker)
        shards = self.shard_order(epoch)
        if workers > len(shards) and worker == 0:
            warnings.warn(
                f"{len(shards)} shard(s) for {workers} DataLoader workers: some workers stay idle; "
                "convert with a smaller --shard-size for more shards",
                stacklevel=2,
            )
        samples = (s for shard in shards[worker::workers] for s in self.iter_shard(shard, epoch))
        if self.shuffle:
            rng = random.Random((self.seed * 1_000_003 + epoch) * 4099 + worker)
            samples = shuffle_buffer(samples, self.shuffle, rng)
        for sample in samples:
            yield self._sample(*sample)

    def _sample(
        self,
        index: int,
        array: Optional[np.ndarray],
        label: int,
        key: str,
        texts: tuple,
        placement: Optional[Placement] = None,
    ):
        """The tuple yielded for one decoded sample (see ``ReaderBase.sample_of``)."""
        image = (self.convert(array),) if array is not None else ()
        return self.sample_of(index, key, label, image + texts, placement)

    def iter_shard(self, shard: int, epoch: int = 0) -> Iterator[tuple]:
        """``(index, image array or None, label, key, text field values, Placement or None)`` of each
        sample of one shard, in stored order, cropped and flipped for ``epoch``."""
        for index, fields, path in self.iter_shard_raw(shard):
            yield (index, *self.decode(fields, path, index, epoch))

    def lengths(self, field: Optional[str] = None) -> np.ndarray:
        """Every sample's length of a text field in stored order, int64 (see ``ReaderBase.lengths``),
        read from the shards' ``.lengths.npy`` side files, not from the tars."""
        f = self.length_field(field)
        parts = [
            np.load(self._side_file(s, wds_lengths_suffix(f.name)), allow_pickle=False) for s in self.manifest.shards
        ]
        self.check_unchanged()  # after the reads: the side files read were the opened output's
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @property
    def image_sizes(self) -> np.ndarray:
        """``(N, 2)`` int64 (height, width) of every image in stored order, from the shards' side files
        alone (see ``PackedDataset.image_sizes``)."""
        if not self.layout.has_image:
            raise ValueError(f"{self.root} stores no images")
        if self.layout.shape is not None:
            return np.tile(np.array(self.layout.shape[:2], np.int64), (len(self), 1))
        parts = []
        for entry in self.manifest.shards:
            if not any(f.path.endswith(NPY_IMAGE_SHAPES) for f in entry.files):
                raise ValueError(
                    f"{self.root}: shard {entry.name} has no index of its images' sizes (written by "
                    f"packer {self.manifest.packer_version}); convert it again with this packer"
                )
            parts.append(np.load(self._side_file(entry, NPY_IMAGE_SHAPES), allow_pickle=False)[:, :2])
        self.check_unchanged()
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, 2), np.int64)

    def iter_shard_raw(self, shard: int) -> Iterator[tuple[int, dict, str]]:
        """``(index, tar fields, shard path)`` of each sample of one shard, not decoded (cheap to skip)."""
        entry = self.manifest.shards[shard]
        relpath = entry.file(TAR_SUFFIX)
        if is_url(self.root):
            path = file_url(self.root, relpath)
            samples = iter_remote_tar(self.root, next(f for f in entry.files if f.path == relpath), self.cache_dir)
        else:
            path = self.path(relpath)
            samples = self._local_tar(path)
        local = 0
        for fields in samples:
            yield self._offsets[shard] + local, fields, str(path)
            local += 1
        if local != entry.samples:
            raise ManifestError(f"{path} holds {local} samples but the manifest says {entry.samples}; it is damaged")

    def _local_tar(self, path: Path) -> Iterator[dict]:
        """The samples of a local tar shard; the output is checked to be the one this dataset
        opened once the file is open (before its first sample is used), so no sample of a newer
        output written in its place is ever passed on. Each sample is passed on once the next one has
        begun (or the tar ended cleanly): the sample in progress where a damaged tar breaks may lack
        members, and is never passed on."""
        checked = False
        pending = None
        for fields in iter_shard_samples(path):  # headers walked here, not by tarfile (see packer.spec.tario)
            if not checked:
                self.check_unchanged()
                checked = True
            if pending is not None:
                yield pending
            pending = fields
        if pending is not None:
            yield pending

    def _side_file(self, shard: ShardEntry, suffix: str):
        """A small file of a shard, to read: local (size checked), or fetched whole from the URL root
        and checked against the manifest's SHA-256."""
        relpath = shard.file(suffix)
        if not is_url(self.root):
            return self.path(relpath)
        return io.BytesIO(read_remote_file(self.root, next(f for f in shard.files if f.path == relpath)))

    def decode(self, fields: dict, path: str, index: int = 0, epoch: int = 0) -> tuple:
        """``(image array or None, label, key, text field values, Placement or None)`` of one sample's
        tar fields; the image cropped and flipped for sample ``index`` in ``epoch`` (``crop=``, ``flip=``)."""
        codec = self.layout.codec.name
        array, label, meta = decode_tar_sample(fields, path, codec if self.layout.has_image else None, self._npy)
        stored = tar_fields(fields, self.text_fields, path)
        texts = tuple(decode_field(f, stored[f.name]) for f in self.text_fields)
        placement = None
        if array is not None and (codec != "raw" or self.augment is not None):
            try:
                array, placement = self.stored_out(array, index, epoch)
            except Exception as e:  # noqa: BLE001 - Pillow reports bad data with many types
                raise ManifestError(
                    f"{path}: sample {fields['__key__']} is damaged ({type(e).__name__}: {e}); "
                    f"run packer verify {self.root}"
                ) from None
        if self.has_target and placement is not None:  # the boxes or mask follow the pixels
            texts = (self.place_target(texts[0], placement), *texts[1:])
        return array, label, meta.get("key", fields["__key__"]), texts, placement

    # Whole batches, for make_loader ---------------------------------------------------------------
    def configure_batches(
        self,
        batch_size: int,
        *,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        workers: int = 0,
        control: Optional[torch.Tensor] = None,
    ) -> None:
        """Yield whole batches (``PackedBatch``) instead of samples, an equal number on every rank.

        Policy (documented in the README): shards are assigned once, rank ``r`` of ``world_size``
        reading shards ``r, r + world_size, ...`` and, within a rank, DataLoader worker ``k`` of
        ``workers`` every ``workers``-th of those; each epoch a worker reads its shards in a shuffled
        order through the shuffle buffer, in batches of ``batch_size`` with one partial batch at
        its end (none with ``drop_last``); a worker left without a shard reads none. So with one
        rank every sample comes exactly once per epoch, whatever the worker count. Ranks must yield
        equal batch counts (DDP waits for the slowest): a rank with fewer batches than the largest
        adds full batches drawn from another pass over its shards (a few samples repeat); with
        ``drop_last`` the ranks with more drop some instead. ``control`` is a shared ``[epoch,
        batches to skip]`` tensor that the loader sets before each pass, also for persistent workers.
        """
        self._batching = {
            "batch_size": int(batch_size),
            "drop_last": drop_last,
            "rank": rank,
            "world": world_size,
            "workers": max(1, workers),
            "control": control if control is not None else torch.zeros(2, dtype=torch.int64),
        }
        shards = len(self.manifest.shards)
        if shards < world_size:
            warnings.warn(
                f"{shards} shard(s) for {world_size} rank(s): some ranks read the same shards, so samples "
                "repeat within an epoch; convert with a smaller --shard-size for more shards",
                stacklevel=2,
            )
        elif shards < world_size * max(1, workers):
            warnings.warn(
                f"{shards} shard(s) for {world_size} rank(s) x {max(1, workers)} worker(s): some workers "
                "have no shard of their own and stay idle; convert with a smaller --shard-size for more "
                "shards",
                stacklevel=2,
            )

    def start_pass(self, epoch: int, skip: int) -> None:
        """Make the next pass of ``configure_batches``'s batches epoch ``epoch``'s, from its batch ``skip``
        on: written into the shared control tensor, so that the DataLoader's workers, persistent ones
        too, see it when the pass starts (``make_loader``'s loader calls it before each pass)."""
        if self._batching is None:
            raise RuntimeError("start_pass is for batches made by the reader: call configure_batches first")
        self._batching["control"].copy_(torch.tensor([int(epoch), int(skip)]))

    def _shares(self, rank: int, workers: int) -> list[list[int]]:
        """Shard numbers read by each DataLoader worker of ``rank``: every ``workers``-th of the rank's.
        A worker left without one reads none (another's would repeat samples within the epoch); a
        rank without one (fewer shards than ranks) borrows one, as DDP needs batches from every rank."""
        b = self._batching
        everything = list(range(len(self.manifest.shards)))
        mine = everything[rank :: b["world"]] or everything[rank % len(everything) :][:1]
        return [mine[k::workers] for k in range(workers)]

    def _natural_counts(self, rank: int, workers: int) -> list[int]:
        b = self._batching
        held = [sum(self.manifest.shards[s].samples for s in shards) for shards in self._shares(rank, workers)]
        size = b["batch_size"]
        return [h // size if b["drop_last"] else -(-h // size) for h in held]

    def _batch_count(self) -> int:
        b = self._batching
        totals = [sum(self._natural_counts(r, b["workers"])) for r in range(b["world"])]
        return min(totals) if b["drop_last"] else max(totals)

    def batch_plan(self, workers: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """For this rank: each worker's shards, each worker's batch sizes in order, and which worker
        makes each batch of the epoch in the order the DataLoader hands them out (one from each
        worker still going, in turn)."""
        b = self._batching
        size, count = b["batch_size"], self._batch_count()
        shares = self._shares(b["rank"], workers)
        held = [sum(self.manifest.shards[s].samples for s in shards) for shards in shares]
        counts = self._natural_counts(b["rank"], workers)
        sizes = [[size] * c for c in counts]
        if not b["drop_last"]:
            for k, c in enumerate(counts):
                if c:
                    sizes[k][-1] = held[k] - size * (c - 1)  # the partial batch at the end of a worker's data
        k, reading = 0, [w for w in range(workers) if shares[w]]  # never an idle worker: it has nothing to read
        while sum(len(x) for x in sizes) < count:  # fewer than the largest rank: resampled full batches
            sizes[reading[k % len(reading)]].append(size)
            k += 1
        while sum(len(x) for x in sizes) > count:  # drop_last: more than the smallest rank
            max(sizes, key=len).pop()
        seq: list[int] = []
        left = [len(x) for x in sizes]
        while any(left):
            for k in range(workers):
                if left[k]:
                    seq.append(k)
                    left[k] -= 1
        return shares, sizes, seq

    def _iter_batches(self) -> Iterator:
        b = self._batching
        epoch, skip = (int(v) for v in b["control"].tolist())
        info = get_worker_info()
        worker, workers = (info.id, b["workers"]) if info is not None else (0, 1)
        shares, sizes, seq = self.batch_plan(workers)
        rng = random.Random(((self.seed * 1_000_003 + epoch) * 4099 + worker) * 8191 + b["rank"])
        shards = list(shares[worker])

        def endless() -> Iterator:  # passes over this worker's shards, each in a new order, through the buffer
            while True:
                if self.shuffle:
                    rng.shuffle(shards)
                one_pass = (item for shard in shards for item in self.iter_shard_raw(shard))
                yield from shuffle_buffer(one_pass, self.shuffle, rng) if self.shuffle else one_pass

        stream = endless()
        mine = [g for g, k in enumerate(seq) if k == worker]  # the epoch's batches this worker makes
        for g, n in zip(mine, sizes[worker]):
            items = [next(stream) for _ in range(n)]
            if g < skip:
                continue  # consumed before a resume: read, not decoded
            yield Numbered(g, self._make_batch(items, epoch))  # make_loader puts them in order

    def _make_batch(self, items: list, epoch: int) -> PackedBatch:
        n = len(items)
        labels = np.empty(n, dtype=np.int64)
        decoded = [(index, *self.decode(fields, path, index, epoch)) for index, fields, path in items]
        if not self.fixed_images or self.one_by_one:  # one by one (transforms, meta), then collated
            return [self._sample(*d) for d in decoded]  # type: ignore[return-value]
        slot, images = self.batch_tensor(n)
        hwc = images.numpy().transpose(0, 2, 3, 1) if self.convert.normalize is None else None
        for j, (_, array, label, _, _, _) in enumerate(decoded):
            if hwc is not None and array.dtype == hwc.dtype:
                hwc[j] = array
            else:
                self.convert.into(array, images[j])
            labels[j] = label
        return PackedBatch(images, torch.from_numpy(labels), slot)


def shuffle_buffer(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Yield ``items`` in a random order drawn through a buffer of ``size`` items."""
    buf: list = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        buf[j], item = item, buf[j]
        yield item
    rng.shuffle(buf)
    yield from buf
