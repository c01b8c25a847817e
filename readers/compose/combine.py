"""Several packer datasets read as one, only when their labels mean the same classes.

A label is an index into a dataset's class map, so datasets with other maps must never be
concatenated: ``a + b`` on packer readers, and ``concat``, check the maps first, and return a
concatenation that checks again when more datasets are added to it (``(a + b) + c``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from torch.utils.data import ChainDataset, ConcatDataset, IterableDataset

from packer.spec.class_map import differences


def check_same_classes(datasets: Sequence[Any]) -> None:
    """ValueError unless every dataset has the same class map (``classes``; all may be unlabelled) and,
    for detection outputs, the same categories (``categories``, what their boxes' labels index), naming
    the first pair that differs and how: combined, their labels would mean other classes."""
    if any(not hasattr(d, "classes") for d in datasets):
        odd = next(d for d in datasets if not hasattr(d, "classes"))
        raise ValueError(
            f"{type(odd).__name__} has no class map to compare: combine packer datasets with "
            "readers.concat, or torch's ConcatDataset yourself"
        )
    first = datasets[0]
    for other in datasets[1:]:
        if other.classes == first.classes:
            continue
        if first.classes is None or other.classes is None:
            labelled, unlabelled = (first, other) if first.classes is not None else (other, first)
            raise ValueError(f"{_name(labelled)} is labelled and {_name(unlabelled)} is not: they cannot be combined")
        how = differences(first.classes, other.classes)
        raise ValueError(
            f"{_name(first)} and {_name(other)} have different class maps ({how}), so one label means "
            f"another class in each; convert them with one class map (packer convert --classes "
            f"{_name(first)} ...)"
        )
    for other in datasets[1:]:  # detection outputs: their boxes' labels index the categories
        mine, theirs = getattr(first, "categories", None), getattr(other, "categories", None)
        if mine == theirs:
            continue
        if mine is None or theirs is None:
            boxed, plain = (first, other) if mine is not None else (other, first)
            raise ValueError(
                f"{_name(boxed)} holds detection targets and {_name(plain)} does not: they cannot be combined"
            )
        raise ValueError(
            f"{_name(first)} and {_name(other)} have different detection categories "
            f"({differences(mine, theirs)}), so one box label means another category in each; convert "
            f"them with one category list (packer convert ... --annotations ... --classes {_name(first)})"
        )
    for other in datasets[1:]:  # segmentation outputs: the mask value of padding, which a loss ignores
        mine, theirs = getattr(first, "ignore_index", None), getattr(other, "ignore_index", None)
        if mine != theirs:
            raise ValueError(
                f"{_name(first)} and {_name(other)} pad their masks with other values ({mine} and "
                f"{theirs}): one loss cannot ignore both; convert them with the same --mask-ignore"
            )


def _name(dataset: Any) -> str:
    return str(getattr(dataset, "root", type(dataset).__name__))


class _Checked:
    """What the checked concatenations share: the common class map, and ``+`` that checks it."""

    datasets: list

    @property
    def classes(self) -> Optional[list[str]]:
        """The class map every part has."""
        return self.datasets[0].classes

    @property
    def categories(self) -> Optional[list[str]]:
        """The detection categories every part has (None without detection targets)."""
        return getattr(self.datasets[0], "categories", None)

    @property
    def ignore_index(self) -> Optional[int]:
        """The mask value of padding every part has (None without masks)."""
        return getattr(self.datasets[0], "ignore_index", None)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as the parts have it."""
        return {name: i for i, name in enumerate(self.classes or [])}

    @property
    def root(self) -> str:
        """The parts' paths, for messages."""
        return " + ".join(_name(d) for d in self.datasets)

    def __add__(self, other: Any) -> Any:
        return concat([self, other])


class PackedConcat(_Checked, ConcatDataset):
    """torch's ConcatDataset of packer datasets with one class map (``concat``)."""


class PackedChain(_Checked, ChainDataset):
    """torch's ChainDataset of packer streams (wds) with one class map (``concat``)."""

    def __init__(self, datasets: Sequence[Any]) -> None:
        super().__init__(datasets)
        self.datasets = list(datasets)


def concat(datasets: Sequence[Any]) -> Any:
    """The datasets as one: a ``PackedConcat`` (a ConcatDataset), or a ``PackedChain`` for wds streams;
    ValueError when their class maps differ or when streams and map-style datasets are mixed."""
    datasets = list(datasets)
    if not datasets:
        raise ValueError("concat needs at least one dataset")
    check_same_classes(datasets)
    if all(isinstance(d, IterableDataset) for d in datasets):
        return PackedChain(datasets)
    if any(isinstance(d, IterableDataset) for d in datasets):
        raise ValueError("concat cannot mix wds streams with map-style datasets; convert them to one kind")
    return PackedConcat(datasets)
