"""Data sets: registry, deterministic splits, batched augmentation, clear errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from asolab import config
from asolab.data import Augmentation, Batches, DataError, _translate, eval_pad, load_data
from asolab.data.splits import Rows, copies, fingerprints, stratified_order


def test_digits_splits_are_disjoint_deterministic_and_seeded():
    a = load_data(config.DataConfig(), seed=0)
    b = load_data(config.DataConfig(), seed=0)
    c = load_data(config.DataConfig(), seed=1)
    assert len(a.train) + len(a.val) + len(a.test) == 1797
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.train.y, b.train.y)
    assert not torch.equal(a.val.x, c.val.x)  # validation follows the seed
    assert torch.equal(a.test.x, c.test.x)  # the test carve-out does not
    rows = lambda s: {tuple(r.tolist()) for r in s.x.flatten(1)}  # noqa: E731
    assert not rows(a.test) & rows(a.val)
    assert a.in_channels == 1 and a.image_size == 8 and a.num_classes == 10


def test_digits_loaded_again_is_equal_and_its_own():
    """The digits CSV is parsed once per process; each load still gets tensors of its own,
    so a caller that changes its copy (in place) leaves the next load as it was."""
    a = load_data(config.DataConfig(), seed=0)
    before = a.test.x.clone()
    a.test.x.add_(1.0)
    a.train.y.zero_()
    b = load_data(config.DataConfig(), seed=0)
    assert torch.equal(b.test.x, before) and b.train.y.unique().numel() == 10


def test_train_subset_limits_search_data_only():
    d = load_data(config.DataConfig(train_subset=100), seed=0)
    assert len(d.train) == 100 and len(d.full_train) > 1000


def test_a_search_subset_smaller_than_the_classes_is_refused_and_one_below_a_batch_warned(
    caplog,
):
    """data.train_subset = 1 would search on one image without a word: fewer examples than
    classes is refused with the least that works; fewer than a batch is a warning."""
    for subset in (1, 9):
        with pytest.raises(DataError, match=rf"train_subset = {subset} keeps .* use .* >= 10"):
            load_data(config.DataConfig(train_subset=subset), seed=0)
    with caplog.at_level("WARNING", logger="asolab.data"):
        assert len(load_data(config.DataConfig(train_subset=10), seed=0).train) == 10
    assert "less than data.batch_size = 64" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="asolab.data"):
        load_data(config.DataConfig(train_subset=64), seed=0)
    assert "batch_size" not in caplog.text


def test_a_validation_split_smaller_than_the_classes_is_refused_with_the_least_fraction():
    """An empty split would make every val_acc 0 (and alpha-training a no-op): refused,
    and the fraction the message suggests gives one example per class at least."""
    refused = r"data\.val_fraction = 0\.0001 holds out 0 .* at least 10"
    with pytest.raises(DataError, match=refused) as info:
        load_data(config.DataConfig(val_fraction=0.0001), seed=0)
    least = float(str(info.value).rsplit(">= ", 1)[1])
    assert len(load_data(config.DataConfig(val_fraction=least), seed=0).val) >= 10
    with pytest.raises(DataError):
        load_data(config.DataConfig(val_fraction=least * 0.6), seed=0)


def test_translation_moves_pixels_and_zero_fills():
    x = torch.arange(1.0, 17.0).view(1, 1, 4, 4).repeat(2, 1, 1, 1)
    out = _translate(x, torch.tensor([[1, 0], [0, -1]]))
    # image 0 moved down one row, image 1 left one column; the gap is zero-filled
    assert torch.equal(out[0, 0, 1:], x[0, 0, :-1]) and torch.equal(out[0, 0, 0], torch.zeros(4))
    assert torch.equal(out[1, 0, :, :-1], x[1, 0, :, 1:]) and torch.equal(
        out[1, 0, :, -1], torch.zeros(4)
    )
    flipped = Augmentation(flip=True)(x, torch.Generator().manual_seed(0))
    for img, src in zip(flipped, x):
        assert torch.equal(img, src) or torch.equal(img, src.flip(2))


def test_batches_cover_the_split_once_per_epoch(digits):
    seen = torch.cat([y for _, y in Batches(digits.val, 50, torch.Generator().manual_seed(0))])
    assert len(seen) == len(digits.val)
    assert torch.equal(seen.sort().values, digits.val.y.sort().values)


def test_drop_last_gives_whole_batches_from_a_fresh_shuffle(digits):
    """``data.drop_last``: only whole batches, drawn from the same shuffle as without it
    (the generator advances alike, so runs and resumes stay in step); the images left
    out change from epoch to epoch."""
    n, b = len(digits.val), 50
    assert n % b  # the split ends in a smaller batch
    kept = list(Batches(digits.val, b, torch.Generator().manual_seed(0), drop_last=True))
    full = list(Batches(digits.val, b, torch.Generator().manual_seed(0)))
    assert [len(y) for _, y in kept] == [b] * (n // b) and len(kept) == len(full) - 1
    assert len(Batches(digits.val, b, drop_last=True)) == n // b
    assert torch.equal(torch.cat([x for x, _ in kept]), torch.cat([x for x, _ in full[:-1]]))
    gen = torch.Generator().manual_seed(0)
    epochs = [torch.cat([y for _, y in Batches(digits.val, b, gen, drop_last=True)]) for _ in "ab"]
    assert not torch.equal(epochs[0], epochs[1])


def test_eval_batches_pad_the_smaller_batch_on_cuda_only(digits):
    """Evaluation's batches on CUDA: a smaller batch, the split's last or its only one, gets
    zero images up to the run's largest evaluation batch (the evaluation batch size, or
    the larger split where both are smaller); its labels stay its own. The CPU pads
    nothing."""
    bundle = dataclasses.replace(digits, val=digits.val.head(100), test=digits.val.head(120))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert (eval_pad(bundle, 50, cuda), eval_pad(bundle, 512, cuda)) == (50, 120)
    assert eval_pad(bundle, 50, cpu) is None
    assert eval_pad(dataclasses.replace(bundle, test=None), 512, cuda) == 100  # val's alone
    batches = list(Batches(digits.val.head(130), 50, pad_to=eval_pad(bundle, 50, cuda)))
    assert [(len(x), len(y)) for x, y in batches] == [(50, 50), (50, 50), (50, 30)]
    (x, y), last = batches[-1], digits.val.head(130)
    assert torch.equal(x[:30], last.x[100:]) and not x[30:].any()
    assert torch.equal(y, last.y[100:])


def test_drop_last_keeps_a_split_smaller_than_one_batch(digits):
    """A split smaller than one batch (a small own data set) still trains a step."""
    small = digits.val.head(30)
    batches = Batches(small, 64, torch.Generator().manual_seed(0), drop_last=True)
    assert len(batches) == 1 and [len(y) for _, y in batches] == [30]


def test_drop_last_warns_when_it_would_leave_out_much_of_a_split(caplog):
    """A small own data set at a large batch: data.drop_last would train each epoch on
    two thirds of the search images; the run is told, with the fix. The default digits
    split at batch 64 leaves out 5% and 11%: no word."""
    cfg = config.DataConfig(drop_last=True, batch_size=200, train_subset=300)
    with caplog.at_level("WARNING", logger="asolab.data.load"):
        load_data(cfg, seed=0)
        load_data(config.DataConfig(drop_last=True), seed=0)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "data.drop_last leaves out 100 of the 300 search images each epoch (33%); a "
        "data.batch_size that divides 300, or a smaller one, keeps more",
        "data.drop_last leaves out 88 of the 288 validation (alpha-training) images each "
        "epoch (31%); a data.batch_size that divides 288, or a smaller one, keeps more",
    ]
    # the search trains on the whole training split, as the final stage does: one line
    caplog.clear()
    with caplog.at_level("WARNING", logger="asolab.data.load"):
        load_data(config.DataConfig(drop_last=True, batch_size=700), seed=0)
    assert [r.getMessage()[:60] for r in caplog.records] == [
        "data.drop_last leaves out 450 of the 1150 training images ea"
    ]


# an imbalanced set: three common classes, two rare ones and one of a single image
IMBALANCED = {"a": 400, "b": 300, "c": 200, "rare": 6, "rarer": 3, "single": 1}


def _imbalanced(tmp_path) -> str:
    counts = list(IMBALANCED.values())
    y = np.repeat(np.arange(len(counts)), counts)
    x = np.random.default_rng(0).integers(0, 256, (len(y), 8, 8), dtype=np.uint8)
    path = tmp_path / "imbalanced.npz"
    np.savez(path, x_train=x, y_train=y, classes=np.array(list(IMBALANCED)))
    return str(path)


def _classes_in(split) -> set[str]:
    return {list(IMBALANCED)[c] for c in split.y.unique().tolist()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stratified_order_carves_each_class_in_proportion(seed):
    """The first n of the order hold each class in proportion, rounded (a class of two
    or more images on both sides); the order is a permutation, drawn from the seed."""
    rng = np.random.default_rng(seed)
    y = rng.choice(7, size=500, p=[0.4, 0.3, 0.15, 0.1, 0.03, 0.015, 0.005])
    counts = np.bincount(y, minlength=7)
    for n_first in (7, 50, 123, 250):
        order = stratified_order(y, n_first, np.random.default_rng(seed))
        assert sorted(order.tolist()) == list(range(len(y)))
        first = np.bincount(y[order[:n_first]], minlength=7)
        assert first.sum() == n_first
        share = counts * n_first / len(y)
        # a class of two or more images on each side, however small its share: one here
        rare = (share < 1) & (counts >= 2)
        assert (first[rare] == 1).all() and (first < counts).all(), (first, share)
        # the rest in proportion, give or take the ones the rare classes were lent
        assert (np.abs(first - share)[~rare] < 1 + rare.sum()).all(), (first, share)
        again = stratified_order(y, n_first, np.random.default_rng(seed))
        assert np.array_equal(order, again)


def test_a_split_without_a_rare_class_is_named_and_data_stratify_carves_per_class(tmp_path):
    """A random carve of an imbalanced set leaves rare classes out of the validation split
    and the search subset: each split that lacks a class gets a note (printed under the
    run's banner, recorded as a tag), naming the classes, with the fix. data.stratify =
    true puts every class of two or more images in every split; only the class of one
    image is left out of the carved splits, and the note says why."""
    path = _imbalanced(tmp_path)
    d = load_data(config.DataConfig(name="arrays", path=path, train_subset=100), seed=0)
    lacking = {"rare", "rarer"} - _classes_in(d.val)
    assert lacking, "the random carve of seed 0 kept every rare class: pick another seed"
    note = d.notes["missing_validation"]
    assert note.startswith("the validation split (alpha-training, selection) holds no image")
    assert all(name in note for name in lacking)
    assert note.endswith("data.stratify = true carves each split per class")
    assert d.summary()["notes"] == d.notes  # what the run records and prints
    lacks_single = "single" not in _classes_in(d.full_train)
    assert ("missing_training" in d.notes) == lacks_single
    if lacks_single:
        assert "(single): the network is built for them but never" in d.notes["missing_training"]

    cfg = config.DataConfig(name="arrays", path=path, train_subset=100, stratify=True)
    s = load_data(cfg, seed=0)
    common = set(IMBALANCED) - {"single"}
    assert _classes_in(s.val) == _classes_in(s.test) == common
    assert _classes_in(s.train) == _classes_in(s.full_train) == set(IMBALANCED)
    # each class in proportion: the validation split holds a fifth of each common class
    val = np.bincount(s.val.y.numpy(), minlength=6)
    assert abs(val[0] / val[1] - 4 / 3) < 0.05 and abs(val[1] / val[2] - 3 / 2) < 0.05
    assert s.notes == {
        f"missing_{key}": f"the {split} holds no image of 1 of its 6 classes (single): too "
        "few images of them to carve into every split"
        for key, split in [
            ("test", "test split"),
            ("validation", "validation split (alpha-training, selection)"),
        ]
    }


def test_stratify_off_carves_as_before_and_a_balanced_set_gets_no_note():
    """Without data.stratify each carve is the seeded permutation every run drew before
    the setting (published runs and checkpoints keep their splits); digits, balanced,
    gets no note, and with the setting its splits still hold every class."""
    d = load_data(config.DataConfig(), seed=3)
    s = load_data(config.DataConfig(stratify=True), seed=3)
    assert not d.notes and not s.notes
    from sklearn.datasets import load_digits

    y = load_digits().target
    test = np.random.default_rng(0).permutation(len(y))[:359]
    assert np.array_equal(d.test.y.numpy(), y[test])
    rest = np.random.default_rng(0).permutation(len(y))[359:]  # in the carve's order
    val = rest[np.random.default_rng(3).permutation(len(rest))[:288]]
    assert np.array_equal(d.val.y.numpy(), y[val])
    assert not torch.equal(s.val.y, d.val.y) and s.val.y.unique().numel() == 10


def test_copies_counts_exact_copies_among_the_rows_meant_only():
    """Three of 100 images copied from a reference set; a fourth differs from its
    original by one pixel's last bit: three copies. Only the rows named count."""
    rng = np.random.default_rng(1)
    ref = rng.random((500, 3, 8, 8)).astype(np.float32)
    x = rng.random((100, 3, 8, 8)).astype(np.float32)
    x[[3, 50, 99, 60]] = ref[[7, 0, 499, 8]]
    x[60, 2, 7, 7] = np.nextafter(x[60, 2, 7, 7], np.float32(2))
    r = Rows(ref, fingerprints(ref), np.arange(len(ref)))
    q = Rows(x, fingerprints(x), np.arange(len(x)))
    assert copies(q, r) == 3
    assert copies(q._replace(rows=np.arange(10)), r) == 1  # only x[3] among the first ten
    assert copies(q, r._replace(rows=np.arange(1, 499))) == 1  # ref[0] and ref[499] left out
    assert (
        copies(q._replace(rows=np.arange(0)), r)
        == 0
        == copies(Rows(x, q.prints, np.arange(10, 20)), r)
    )


def test_fingerprints_do_not_depend_on_the_chunks(monkeypatch):
    """Large images are fingerprinted a few at a time (a bounded 64-bit copy): the same
    numbers as at once, and an image's number its own whatever its neighbours."""
    from asolab.data import splits

    x = np.random.default_rng(2).random((37, 3, 9, 9)).astype(np.float32)
    whole = fingerprints(x)
    monkeypatch.setattr(splits, "CHUNK_VALUES", 2 * x[0].size + 5)  # two images a chunk
    assert np.array_equal(fingerprints(x), whole)
    assert np.array_equal(fingerprints(x[5:6]), whole[5:6])


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist") as info:
        load_data(config.DataConfig(name="fashion_mnist", data_dir=str(tmp_path)), seed=0)
    assert str(tmp_path) in str(info.value)


def test_missing_torchvision_set_without_download_says_how(tmp_path):
    with pytest.raises(DataError, match="download = true"):
        load_data(config.DataConfig(name="cifar10", data_dir=str(tmp_path)), seed=0)


@pytest.mark.skipif(
    not __import__("pathlib").Path("/usr/share/datasets/fashion-mnist").exists(),
    reason="dataset-fashion-mnist not installed",
)
def test_fashion_mnist_reads_debian_idx_files():
    d = load_data(config.DataConfig(name="fashion_mnist", val_fraction=0.1), seed=0)
    assert len(d.test) == 10000 and len(d.train) + len(d.val) == 60000
    assert d.image_size == 28 and d.num_classes == 10
    assert abs(d.train.x.mean().item()) < 0.1  # normalised


def _write_idx(path, array):
    import numpy as np

    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


@pytest.mark.parametrize("damage", ["truncated", "not-idx", "bad-gzip"])
def test_corrupt_fashion_mnist_file_is_one_clear_error(tmp_path, damage):
    import numpy as np

    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    assert (
        len(load_data(config.DataConfig(name="fashion_mnist", data_dir=str(tmp_path)), seed=0).test)
        == 20
    )
    broken = tmp_path / "train-images-idx3-ubyte"
    if damage == "truncated":
        broken.write_bytes(broken.read_bytes()[:1000])
    elif damage == "not-idx":
        broken.write_bytes(b"<html>404 not found</html>")
    else:
        broken.unlink()
        broken = tmp_path / "train-images-idx3-ubyte.gz"
        broken.write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(DataError, match="unreadable or truncated") as info:
        load_data(config.DataConfig(name="fashion_mnist", data_dir=str(tmp_path)), seed=0)
    assert str(broken) in str(info.value) and "\n" not in str(info.value)
