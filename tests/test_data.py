"""Data sets: registry, deterministic splits, batched augmentation, clear errors."""

from __future__ import annotations

import pytest
import torch

from asolab import config
from asolab.data import Augmentation, Batches, DataError, _translate, load_data


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
