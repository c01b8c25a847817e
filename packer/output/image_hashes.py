"""An output's ``image_hashes.npy`` and its near-duplicates: the perceptual hashes the workers took
of every stored image (``packer.pixels.looks``), gathered in sample order, written beside the
shards, and searched for images that nearly repeat one another (``near_duplicates``).

``image_hashes.npy`` is a plain ``numpy.save`` array, samples x ``LOOKS`` uint64 (the image's own
hash, then its five windows'), row ``i`` for the output's sample ``i``; the manifest's
``image_hashes`` entry gives its size, SHA-256 and how it was hashed, ``near_duplicates`` the groups
found and the distance they were found at (docs/FORMATS.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from packer.config import DUP_DISTANCE
from packer.output.held_files import HeldFiles
from packer.output.near_duplicates import cross_matches, near_groups
from packer.pixels.looks import HASH_KIND, LOOKS
from packer.recorded_columns import in_memory
from packer.records import ShardResult
from packer.spec.errors import ManifestError
from packer.spec.listed_files import file_entry, sha256_of
from packer.spec.manifest import Manifest, read_manifest
from packer.spec.sample_layout import SampleLayout

HASHES_NAME = "image_hashes.npy"


def gathered_looks(results: Sequence[ShardResult]) -> Optional[np.ndarray]:
    """Every written sample's hashes, in the shards' order (samples x LOOKS), or None where a shard
    with samples has none (hashing was off, or a record of an older packer kept by --resume)."""
    parts = []
    for r in results:
        if not r.samples:
            continue
        if r.looks is None:
            return None
        part = np.asarray(in_memory(r.looks), dtype=np.uint64)
        if part.shape != (r.samples, LOOKS):
            return None
        parts.append(part)
    return np.concatenate(parts) if parts else None


def write_hashes(folder: Path, looks: np.ndarray, name: str = HASHES_NAME) -> dict:
    """Write ``looks`` as ``folder/name`` (``folder``: the staging folder, published whole or not at
    all; ``name``: ``HASHES_NAME``, or an appended version's ``appended_name``); the manifest's
    ``image_hashes`` entry of it."""
    np.save(folder / name, np.ascontiguousarray(looks, dtype="<u8"), allow_pickle=False)
    entry = file_entry(folder, name)
    return {"path": name, "bytes": entry.bytes, "sha256": entry.sha256, "kind": HASH_KIND, "looks": LOOKS}


def appended_name(tag: str) -> str:
    """The name of the hashes of an output appended to (``tag``: the content tag of the shards the
    append added): a file of its own for each version, so that the version before keeps its file
    until the new manifest is in place (in a bucket, where no folder is renamed into place)."""
    return f"image_hashes-{tag}.npy"


KeysAt = Callable[[Sequence[int]], dict[int, str]]
"""The keys of the samples at some positions of an output (``keys_in_results``, ``keys_in_output``)."""


def _keys_by_shard(counts: Sequence[int], keys_of: Callable[[int], Sequence[str]], first: int = 0) -> KeysAt:
    """Keys by position, the shards holding ``counts`` samples each from position ``first`` on;
    ``keys_of(n)``: shard ``n``'s keys, read only for the shards that hold a position asked for."""
    starts = np.cumsum([0, *counts])

    def keys_at(indices: Sequence[int]) -> dict[int, str]:
        wanted = np.unique(np.asarray(indices, dtype=np.int64)) - first
        found: dict[int, str] = {}
        for n, (start, stop) in enumerate(zip(starts[:-1], starts[1:])):
            mine = wanted[(wanted >= start) & (wanted < stop)]
            if len(mine):
                keys = keys_of(n)
                found.update((int(i) + first, keys[int(i - start)]) for i in mine)
        return found

    return keys_at


def keys_in_results(results: Sequence[ShardResult], first: int = 0) -> KeysAt:
    """The keys of samples by position, read from the shards' results (whose first sample is at ``first``)."""
    return _keys_by_shard([r.samples for r in results], lambda n: in_memory(results[n].keys), first)


def keys_in_output(root: Path | HeldFiles, manifest: Manifest, layout: SampleLayout) -> KeysAt:
    """The keys of samples by position, read from an output's shards' own indexes: in its folder
    ``root`` or, where a conversion into a bucket uploaded them, in the bucket (``HeldFiles.of``)."""
    files = root if isinstance(root, HeldFiles) else HeldFiles.of(root)
    shards = manifest.shards
    return _keys_by_shard([s.samples for s in shards], lambda n: files.index(manifest, shards[n], layout)[0])


def near_duplicates(looks: np.ndarray, distance: int, identical: Sequence[Sequence[str]], keys_at: KeysAt) -> dict:
    """The manifest's ``near_duplicates`` entry of the images ``looks`` hashes: the hash compared, the
    distance, and the groups of keys found (each in stored order, the groups by their first sample),
    less the groups whose images all have identical source bytes (``identical``, groups of keys:
    reported as duplicates already)."""
    groups = near_groups(looks, distance)
    key_of = keys_at([i for g in groups for i in g]) if groups else {}
    same = {key: n for n, group in enumerate(identical) for key in group}
    kept = [g for g in groups if len({same.get(key_of[i], ("alone", i)) for i in g}) > 1]
    return {"kind": HASH_KIND, "distance": distance, "groups": [[key_of[i] for i in g] for g in kept]}


def read_hashes(root: Path, manifest: Manifest, check: bool = True, comparable: bool = True) -> np.ndarray:
    """An output's image hashes (samples x LOOKS uint64); ManifestError where it has none, (``check``)
    where the file is not the one its manifest lists, or (``comparable``) where they were hashed by
    another rule than this packer's (``HASH_KIND``)."""
    entry = manifest.image_hashes
    if entry is None:
        raise ManifestError(
            f"{root} has no image hashes (converted with --no-image-hashes, by a packer before them, or "
            "changed by combine or repack): convert it again to compare its images"
        )
    if comparable and entry.get("kind") != HASH_KIND:
        # hashes of another rule are other numbers: compared with these they would match nothing
        raise ManifestError(
            f"{root}'s image hashes are of another kind ({entry.get('kind')!r}, this packer's: {HASH_KIND!r}): "
            "convert it again to compare its images"
        )
    path = root / entry["path"]
    try:
        if check and (path.stat().st_size != entry["bytes"] or sha256_of(path) != entry["sha256"]):
            raise ManifestError(f"{path} is not the file the manifest lists (changed since it was written)")
        looks = np.load(path, allow_pickle=False)
    except OSError as e:
        raise ManifestError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ManifestError(f"{path} is not a numpy array file: {e}") from None
    if looks.dtype != np.uint64 or looks.shape != (manifest.samples, entry.get("looks", LOOKS)):
        raise ManifestError(
            f"{path} holds {looks.dtype} {looks.shape}, not uint64 ({manifest.samples}, {LOOKS}): not this output's"
        )
    return looks


def leaks_between(first: Path, second: Path, distance: Optional[int] = None) -> list[tuple[str, str]]:
    """For each image of ``first`` that nearly duplicates an image of ``second`` (the same photo in
    ``val`` and ``train``), its key and the first such image's: ``(key in first, key in second)``, in
    ``first``'s order; ``distance``: bits, by default the larger of the two outputs' own.
    ManifestError where one has no image hashes, or the two were hashed by different rules (whose
    numbers mean different things: compared, they would match nothing, or by chance)."""
    manifests = [read_manifest(first), read_manifest(second)]
    if distance is None:
        distance = max(int((m.near_duplicates or {}).get("distance", DUP_DISTANCE)) for m in manifests)
    kinds = [(m.image_hashes or {}).get("kind") for m in manifests]
    if all(m.image_hashes is not None for m in manifests) and kinds[0] != kinds[1]:  # before reading either file
        raise ManifestError(
            f"{first} and {second} hold image hashes of different kinds ({kinds[0]!r}, {kinds[1]!r}): "
            "convert the older one again to compare their images"
        )
    looks = [read_hashes(root, m, comparable=False) for root, m in zip((first, second), manifests)]
    pairs = cross_matches(looks[0], looks[1], distance)
    if not len(pairs):
        return []
    keys = [
        keys_in_output(root, m, SampleLayout.from_manifest(m))(pairs[:, side].tolist())
        for side, (root, m) in enumerate(zip((first, second), manifests))
    ]
    return [(keys[0][int(i)], keys[1][int(j)]) for i, j in pairs]


__all__ = [
    "HASHES_NAME",
    "appended_name",
    "gathered_looks",
    "keys_in_output",
    "leaks_between",
    "keys_in_results",
    "near_duplicates",
    "read_hashes",
    "write_hashes",
]
