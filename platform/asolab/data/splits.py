"""The carved splits (test, validation, search subset): drawn at random, or per class;
and the images a split shares with the training split.

A random carve of an imbalanced set can leave a rare class out of a split: out of the
validation split, alpha-training and the choice of the final network are blind to it;
out of the search subset, the search never trains on it; out of a carved test split,
the test accuracy says nothing of it. ``data.stratify`` carves each split per class
instead (:func:`stratified_order`), and without it :func:`missing_classes` lets the
run say which classes a split lacks.

An image in the test or validation split that is an exact copy of a training image
(a file copied into both folders, a set with duplicates) is one the network trained on:
:func:`copies` counts them, by fingerprint, so that the run can say so.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _quotas(
    counts: np.ndarray, n_first: int, rng: np.random.Generator, both_sides: bool
) -> np.ndarray:
    """How many of each class go first: ``n_first`` in all, each class in proportion to
    its count (largest remainders round up, ties drawn by ``rng``), and every class with
    two or more images on both sides where the sizes allow (``both_sides``; else every
    class first)."""
    quota = counts * n_first / counts.sum()
    take = np.floor(quota).astype(np.int64)
    splittable = counts >= (2 if both_sides else 1)
    # a class of a few images would round to none first: one, so both sides hold it
    take[splittable & (take == 0) & (n_first > 0)] = 1
    # and none is all first while the rest is not empty (the other side holds it too)
    keep = 1 if both_sides else 0  # of a class, left for the other side
    take = np.minimum(take, np.where(splittable, counts - keep, counts))
    tie = rng.random(len(counts))  # breaks ties between equal remainders
    # largest remainders first; a class's last image only where nothing else is left
    for cap in (np.where(splittable, counts - keep, counts), counts):
        while take.sum() < n_first and (take < cap).any():
            i = int(np.argmax(np.where(take < cap, quota - take + 1e-9 * tie, -np.inf)))
            take[i] += 1
    while take.sum() > n_first:
        # the one per class overshot: the class furthest above its share gives one back,
        # keeping its one while any class has more (a split smaller than the class count
        # leaves the rarest out)
        floor = 1 if (take > 1).any() else 0
        i = int(np.argmax(np.where(take > floor, take - quota + 1e-9 * tie, -np.inf)))
        take[i] -= 1
    return take


def stratified_order(
    y: np.ndarray, n_first: int, rng: np.random.Generator, both_sides: bool = True
) -> np.ndarray:
    """A permutation of ``range(len(y))`` whose first ``n_first`` indices hold each class
    of ``y`` in proportion (as scikit-learn's stratified splits do), each part in random
    order. ``both_sides``: a class of two or more images is on both sides wherever the
    sizes allow, and a class of one stays on the second, the split carved from (a test or
    validation carve); else every class is first wherever the size allows (a subset, whose
    rest goes unused)."""
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    take = _quotas(counts, n_first, rng, both_sides)
    # each class's indices: one sort, not a pass over y per class (many classes)
    groups = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    first, rest = [], []
    for members, n in zip(groups, take):
        members = rng.permutation(members)
        first.append(members[:n])
        rest.append(members[n:])
    return np.concatenate([rng.permutation(np.concatenate(part)) for part in (first, rest)])


def missing_classes(y: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The labels among ``classes`` that ``y`` holds none of."""
    return np.setdiff1d(classes, y)


# odd random weights of the fingerprints, one per pixel position (repeated past 65,536):
# fixed, so that a fingerprint is a function of the pixels alone
_WEIGHTS = np.random.default_rng(0).integers(0, 2**63, 1 << 16, dtype=np.uint64) | 1
# pixel values a chunk of fingerprinting widens to 64 bits at once (224x224 RGB: 111 images)
CHUNK_VALUES = 1 << 24


def fingerprints(x: np.ndarray) -> np.ndarray:
    """A 64-bit number per image of ``x``: its float32 pixels' bits weighted and summed in
    integer arithmetic (wrapping, so the same pixels give the same number whatever the
    order of summing), in chunks of ``CHUNK_VALUES`` (the set as 64-bit integers at once
    would be twice its size)."""
    flat = np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32).view(np.uint32)
    weights = np.resize(_WEIGHTS, flat.shape[1])
    out = np.empty(len(x), dtype=np.uint64)
    rows = max(1, CHUNK_VALUES // max(1, flat.shape[1]))  # 128 MB of 64-bit values a chunk
    for i in range(0, len(x), rows):
        out[i : i + rows] = flat[i : i + rows].astype(np.uint64) @ weights
    return out


class Rows(NamedTuple):
    """Images of a split as rows of an array: the array, its :func:`fingerprints`, and
    the rows of it the split holds (no copy of the images is made)."""

    x: np.ndarray
    prints: np.ndarray
    rows: np.ndarray


def copies(query: Rows, ref: Rows) -> int:
    """How many images of ``query`` are exact copies of an image of ``ref`` (the same
    pixel values): found by fingerprint, each confirmed pixel by pixel."""
    if not len(query.rows) or not len(ref.rows):
        return 0
    mine, theirs = query.prints[query.rows], ref.prints[ref.rows]
    order = np.argsort(theirs)
    at = order[np.minimum(np.searchsorted(theirs, mine, sorter=order), len(theirs) - 1)]
    found = np.flatnonzero(theirs[at] == mine)
    if not len(found):
        return 0
    a = query.x[query.rows[found]].reshape(len(found), -1)
    b = ref.x[ref.rows[at[found]]].reshape(len(found), -1)
    return int((a == b).all(axis=1).sum())
