"""A researcher's own data, no code: an ImageFolder of images and an ``.npz`` of arrays.

The images and arrays are written by the tests; runs use tiny sizes. Every bad
input is one line ``asolab: error: ...`` and exit status 2, before any training.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ONE_CYCLE
from mlflow import MlflowClient
from PIL import Image

import asolab
from asolab import config
from asolab.cli import main
from asolab.data import DataError, load_data
from asolab.data.core import NOTE_RESIZE

CLASSES = ("cat", "dog", "owl")
TINY = ONE_CYCLE


def _image(rng, label: int, size: tuple[int, int], mode: str) -> Image.Image:
    """A class-dependent brightness, so the classes can be told apart."""
    w, h = size
    base = rng.random((h, w)) * 60 + 80 * label
    if mode == "L":
        return Image.fromarray(base.astype(np.uint8), "L")
    rgb = np.stack([base, base * 0.5, 255 - base], axis=2).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def write_folder(
    root: Path,
    per_class: int = 10,
    test_per_class: int = 0,
    mode: str = "L",
    size: tuple[int, int] = (10, 10),
    classes: tuple[str, ...] = CLASSES,
) -> Path:
    """``root/train/<class>/*.png`` (and ``root/test/...`` when test_per_class)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", test_per_class)):
        for label, name in enumerate(classes):
            if not n:
                continue
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                _image(rng, label, size, mode).save(folder / f"{i:03d}.png")
    return root


def write_npz(path: Path, n: int = 60, channels: int = 1, **extra) -> Path:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 3
    x = (rng.random((n, channels, 8, 8)) * 80 + 60 * y[:, None, None, None]).astype(np.uint8)
    if channels == 1:
        x = x[:, 0]  # (N, H, W) is accepted too
    arrays = {"x_train": x, "y_train": y, **extra}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def _sets(overrides: dict) -> list[str]:
    """``--set key=value`` arguments, values in TOML (json.dumps writes TOML's scalars)."""
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def _cfg(**data) -> config.DataConfig:
    return config.DataConfig(**data)


# ------------------------------------------------------------------ loading


def test_a_folder_loads_with_its_class_names_test_split_and_training_statistics(tmp_path):
    root = write_folder(tmp_path / "imgs", per_class=10, test_per_class=3)
    d = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert d.num_classes == 3 and d.in_channels == 1 and d.image_size == 10
    assert len(d.test) == 9  # test/ is the test split, not a carve-out
    assert len(d.train) + len(d.val) == 30
    assert d.classes == CLASSES and d.source == str(root.resolve())
    # normalised by the training split's statistics: its pixels have mean ~0, std ~1
    train = torch.cat([d.full_train.x, d.val.x])
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1) < 1e-2
    summary = d.summary()
    assert summary["source"] == str(root.resolve()) and len(summary["mean"]) == 1


def test_a_folder_without_test_images_gets_the_fixed_carve_out(tmp_path):
    root = write_folder(tmp_path / "imgs", per_class=10)
    a = load_data(_cfg(name="folder", data_dir=str(root), test_fraction=0.2), seed=0)
    b = load_data(_cfg(name="folder", data_dir=str(root), test_fraction=0.2), seed=1)
    assert len(a.test) == 6 and torch.equal(a.test.x, b.test.x)  # split_seed, not the seed
    c = load_data(_cfg(name="folder", data_dir=str(root), split_seed=3), seed=0)
    assert not torch.equal(a.test.y, c.test.y) or not torch.equal(a.test.x, c.test.x)


def test_mixed_grey_and_colour_images_become_rgb_at_the_most_common_size(tmp_path):
    root = write_folder(tmp_path / "imgs", per_class=6, mode="L", size=(10, 10))
    # a few colour images of another size: reconciled, not refused
    write_folder(tmp_path / "other", per_class=2, mode="RGB", size=(14, 12))
    for name in CLASSES:
        for p in (tmp_path / "other" / "train" / name).iterdir():
            p.rename(root / "train" / name / f"rgb_{p.name}")
    d = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert d.in_channels == 3 and tuple(d.train.x.shape[2:]) == (10, 10)
    sized = load_data(_cfg(name="folder", data_dir=str(root), image_size=6), seed=0)
    assert tuple(sized.train.x.shape[1:]) == (3, 6, 6) and sized.image_size == 6


def test_arrays_load_uint8_and_float_with_or_without_a_test_split(tmp_path):
    path = write_npz(tmp_path / "a.npz", n=60)
    d = load_data(_cfg(name="arrays", path=str(path)), seed=0)
    assert d.num_classes == 3 and d.in_channels == 1 and len(d.test) == 12
    rng = np.random.default_rng(1)
    path = tmp_path / "f.npz"
    np.savez(
        path,
        x_train=rng.random((40, 3, 6, 6), dtype=np.float32),
        y_train=np.arange(40) % 4,
        x_test=rng.random((8, 3, 6, 6), dtype=np.float32),
        y_test=np.arange(8) % 4,
        classes=np.array(["a", "b", "c", "d", "e"]),
    )
    d = load_data(_cfg(name="arrays", path=str(path), image_size=8), seed=0)
    assert d.num_classes == 5 and d.classes == ("a", "b", "c", "d", "e")  # classes fixes k
    assert tuple(d.test.x.shape) == (8, 3, 8, 8) and len(d.mean) == 3


def test_channels_last_arrays_are_read_as_such_and_the_reading_is_said(tmp_path):
    """numpy's and PIL's (N, H, W, C) is the usual layout of an .npz: read as channels
    last, not as 32 channels of 32x3 images, with a note; data.layout settles a shape
    that could be either."""
    rng = np.random.default_rng(0)
    nchw = rng.integers(0, 255, (30, 3, 6, 5), dtype=np.uint8)
    y = np.arange(30) % 3
    np.savez(tmp_path / "nchw.npz", x_train=nchw, y_train=y)
    np.savez(tmp_path / "nhwc.npz", x_train=nchw.transpose(0, 2, 3, 1), y_train=y)
    a = load_data(_cfg(name="arrays", path=str(tmp_path / "nchw.npz")), seed=0)
    b = load_data(_cfg(name="arrays", path=str(tmp_path / "nhwc.npz")), seed=0)
    assert b.in_channels == 3 and (b.height, b.width) == (6, 5)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.x, b.test.x)
    assert "layout" not in a.notes and "read as (N, H, W, C)" in b.notes["layout"]
    assert "(30, 6, 5, 3)" in b.summary()["notes"]["layout"]
    # the same pixels, declared: no guess, and the shape that auto refuses is read
    cube = rng.integers(0, 255, (30, 4, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "cube.npz", x_train=cube, y_train=y)
    with pytest.raises(DataError, match="data.layout"):
        load_data(_cfg(name="arrays", path=str(tmp_path / "cube.npz")), seed=0)
    c = load_data(_cfg(name="arrays", path=str(tmp_path / "cube.npz"), layout="nhwc"), seed=0)
    assert c.in_channels == 4 and c.notes["layout"] == "read as NHWC (data.layout)"


def test_a_resize_is_one_line_how_many_images_from_which_sizes_to_which(tmp_path):
    root = write_folder(tmp_path / "imgs", per_class=6, size=(10, 10))
    write_folder(tmp_path / "other", per_class=2, size=(14, 12))  # width 14, height 12
    for name in CLASSES:
        for p in (tmp_path / "other" / "train" / name).iterdir():
            p.rename(root / "train" / name / f"big_{p.name}")
    d = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert d.notes["resize"] == (
        "resized 6 of 24 images from 12x14 (6) to 10x10 (the most common size; "
        "data.image_size sets another)"
    )
    d = load_data(_cfg(name="folder", data_dir=str(root), image_size=8), seed=0)
    assert d.notes["resize"].startswith("resized 24 of 24 images from 10x10 (18), 12x14 (6) to 8x8")
    path = write_npz(tmp_path / "a.npz", n=60)
    assert "resize" not in load_data(_cfg(name="arrays", path=str(path)), seed=0).notes
    sized = load_data(_cfg(name="arrays", path=str(path), image_size=6), seed=0)
    assert sized.notes["resize"] == "resized 60 of 60 images from 8x8 (60) to 6x6 (data.image_size)"


def test_test_images_copied_from_training_are_counted_and_named_with_the_fix(tmp_path):
    """A file copied from train/ into test/ is an image the network trained on: the test
    accuracy would count it. The run's notes say how many test images are such copies,
    and where to remove them; a validation image that duplicates a training image (the
    data set holds it twice) is counted too. A set without copies gets no such note."""
    root = write_folder(tmp_path / "imgs", per_class=12, test_per_class=4)
    clean = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert not [k for k in clean.notes if k.startswith("copies_")]
    for name in CLASSES[:2]:  # two of the 12 test images, copied from training
        shutil.copy(root / "train" / name / "000.png", root / "test" / name / "000.png")
    d = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert d.notes["copies_test"] == (
        "2 of the 12 test images (17%) are exact copies of training or validation images: "
        "the test accuracy counts images the run has seen; remove the copies from the test "
        "split (test/, x_test)"
    )
    # every training image twice: each validation image has its twin among the training
    # images, but where the twin went to validation too
    path = write_npz(tmp_path / "twice.npz", n=60)
    with np.load(path) as npz:
        np.savez(
            path, x_train=np.tile(npz["x_train"], (2, 1, 1)), y_train=np.tile(npz["y_train"], 2)
        )
    a = load_data(_cfg(name="arrays", path=str(path)), seed=0)
    n_val = len(a.val)
    rows = lambda s: {r.numpy().tobytes() for r in s.x}  # noqa: E731
    twins = sum(r in rows(a.full_train) for r in (v.numpy().tobytes() for v in a.val.x))
    assert 0 < twins <= n_val
    assert a.notes["copies_validation"].startswith(f"{twins} of the {n_val} validation images")
    assert a.notes["copies_validation"].endswith("remove the copies from the data set")


# ------------------------------------------------------------------ bad input


def _truncated_png(path: Path) -> None:
    """A PNG cut inside its pixel data: the header reads, the pixels do not."""
    noise = np.random.default_rng(0).integers(0, 255, (10, 10), dtype=np.uint8)
    Image.fromarray(noise).save(path)
    path.write_bytes(path.read_bytes()[:-40])


def _bad_folder(tmp_path: Path, case: str) -> dict:
    root = tmp_path / "imgs"
    if case == "one class":
        write_folder(root, classes=("cat",))
    elif case == "no images":
        for name in CLASSES:
            (root / "train" / name).mkdir(parents=True)
            (root / "train" / name / "notes.txt").write_text("not an image")
    elif case == "not an image":
        write_folder(root)
        (root / "train" / "dog" / "broken.png").write_text("this is text, not a PNG")
    elif case == "corrupt image":
        write_folder(root)
        _truncated_png(root / "train" / "owl" / "cut.png")
    elif case == "transparency mixed":
        write_folder(root)
        rgba = np.full((10, 10, 4), 200, np.uint8)
        rgba[..., 3] = 10  # real transparency, which the other images lack
        Image.fromarray(rgba, "RGBA").save(root / "train" / "cat" / "clear.png")
    elif case == "empty class folder":
        write_folder(root)
        (root / "train" / "hexagon").mkdir()
    elif case == "no folder":
        root = tmp_path / "missing"
    return {"data.name": "folder", "data.data_dir": str(root)}


def _bad_arrays(tmp_path: Path, case: str) -> dict:
    path = tmp_path / "a.npz"
    y = np.arange(60) % 3
    if case == "missing keys":
        np.savez(path, images=np.zeros((60, 8, 8), np.uint8), y_train=y)
    elif case == "mismatched lengths":
        np.savez(path, x_train=np.zeros((60, 8, 8), np.uint8), y_train=y[:50])
    elif case == "labels out of range":
        np.savez(path, x_train=np.zeros((60, 8, 8), np.uint8), y_train=y - 1)
    elif case == "test labels out of range":
        np.savez(
            path,
            x_train=np.zeros((60, 8, 8), np.uint8),
            y_train=y,
            x_test=np.zeros((6, 8, 8), np.uint8),
            y_test=np.full(6, 7),
        )
    elif case == "channels differ":
        np.savez(
            path,
            x_train=np.zeros((60, 1, 8, 8), np.uint8),
            y_train=y,
            x_test=np.zeros((6, 3, 8, 8), np.uint8),
            y_test=y[:6],
        )
    elif case == "ambiguous layout":  # 8 channels of 8x8, or 8x8 images of 8 channels?
        np.savez(path, x_train=np.zeros((60, 8, 8, 8), np.uint8), y_train=y)
    elif case == "zero-pixel images":  # NA22
        np.savez(path, x_train=np.zeros((60, 4, 0, 0), np.uint8), y_train=y)
    elif case == "one label of a million":  # NA14
        np.savez(path, x_train=np.zeros((60, 8, 8), np.uint8), y_train=np.where(y == 2, 10**6, y))
    elif case == "object labels":  # pandas' text column, saved as is
        names = np.array(["cat", "dog", "owl"], dtype=object)[y]
        np.savez(path, x_train=np.zeros((60, 8, 8), np.uint8), y_train=names)
    elif case == "test label not a class":
        names = np.array(["cat", "dog", "owl"])
        np.savez(
            path,
            x_train=np.zeros((60, 8, 8), np.uint8),
            y_train=names[y],
            x_test=np.zeros((3, 8, 8), np.uint8),
            y_test=np.array(["cat", "emu", "owl"]),
        )
    elif case == "names and numbers":
        np.savez(
            path,
            x_train=np.zeros((60, 8, 8), np.uint8),
            y_train=np.array(["cat", "dog", "owl"])[y],
            x_test=np.zeros((3, 8, 8), np.uint8),
            y_test=np.arange(3),
        )
    elif case == "not an npz":
        path.write_text("x_train,y_train\n1,2\n")
    elif case == "no path":
        return {"data.name": "arrays"}
    return {"data.name": "arrays", "data.path": str(path)}


BAD = {
    "one class": (_bad_folder, ["holds 1 class folder", "cat", "two or more"]),
    "no images": (_bad_folder, ["no images", ".png"]),
    "not an image": (_bad_folder, ["broken.png", "not an image"]),
    "corrupt image": (_bad_folder, ["cut.png", "corrupt"]),
    "transparency mixed": (_bad_folder, ["cannot be reconciled", "clear.png", "transparency"]),
    "no folder": (_bad_folder, ["missing", "not a folder"]),
    "empty class folder": (_bad_folder, ["class folder", "hexagon holds no images"]),
    "ambiguous layout": (_bad_arrays, ["(60, 8, 8, 8)", 'data.layout = "nchw" or "nhwc"']),
    "missing keys": (_bad_arrays, ["missing key(s) x_train", "it has: images, y_train"]),
    "mismatched lengths": (_bad_arrays, ["60 images", "50 labels"]),
    "labels out of range": (_bad_arrays, ["y_train[0] = -1", "out of range"]),
    "test labels out of range": (_bad_arrays, ["y_test[0] = 7", "0..2"]),
    "channels differ": (_bad_arrays, ["3 channel(s)", "cannot be reconciled"]),
    "not an npz": (_bad_arrays, ["not a readable .npz"]),
    "zero-pixel images": (_bad_arrays, ["0x0 pixels", "at least 1x1"]),
    "one label of a million": (_bad_arrays, ["up to 1000000", "only 3", "0..K-1"]),
    "no path": (_bad_arrays, ["needs data.path"]),
    "object labels": (_bad_arrays, ["y_train holds Python objects", "dtype=str"]),
    "test label not a class": (_bad_arrays, ["y_test[1] = 'emu'", "cat, dog, owl"]),
    "names and numbers": (_bad_arrays, ["must both be class numbers or both class names"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_own_data_is_one_error_line_and_status_2(case, tmp_path, capsys):
    make, words = BAD[case]
    overrides = make(tmp_path, case)
    rc = main(["run", "--quiet", "--no-track", "--set", "threads=1", *_sets(overrides)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("asolab: error: ") and "\n" not in err, err
    for word in words:
        assert word in err, (word, err)


def test_a_folder_unzipped_from_macos_loads_without_its_hidden_twins(tmp_path):
    """A zip made on macOS unpacks a ``__MACOSX`` folder beside the classes and may put a
    ``._`` twin (metadata, no image) beside each image; a notebook leaves
    ``.ipynb_checkpoints``. None is an image of the set: they are left out, with a note,
    where they had made a class of their own or refused the set as unreadable."""
    root = write_folder(tmp_path / "imgs", per_class=6)
    clean = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    junk = b"\x00\x05\x16\x07Mac OS X        " + bytes(64)  # an AppleDouble header
    (root / "train" / "cat" / "._000.png").write_bytes(junk)
    macos = root / "train" / "__MACOSX" / "dog"
    macos.mkdir(parents=True)
    (macos / "._000.png").write_bytes(junk)
    checkpoints = root / "train" / "owl" / ".ipynb_checkpoints"
    checkpoints.mkdir()
    shutil.copy(root / "train" / "owl" / "000.png", checkpoints / "000-checkpoint.png")
    d = load_data(_cfg(name="folder", data_dir=str(root)), seed=0)
    assert d.classes == clean.classes == CLASSES
    assert len(d.full_train) + len(d.val) + len(d.test) == 18
    assert d.notes["hidden"] == (
        "left out 2 hidden file(s) named as images (._000.png, 000-checkpoint.png): names "
        "starting with '.' or under __MACOSX, an archive's or a tool's, not images"
    )


def test_a_photo_stored_on_its_side_is_read_upright_as_viewers_show_it(tmp_path):
    """A camera stores a photo as its sensor read it and an EXIF orientation saying how
    to turn it; viewers (and the researcher looking at the folder) see it turned. It is
    read turned too, its size the upright one, with a note: a 12-wide, 10-high image of
    orientation 6 (turn a quarter clockwise) whose top row is white is read 10 wide,
    12 high, its right column white."""
    from asolab.data.folder import load_folder

    root = write_folder(tmp_path / "imgs", per_class=6, size=(10, 12))  # 10 wide, 12 high
    stored = np.zeros((10, 12), np.uint8)  # 10 high, 12 wide, as the sensor read it
    stored[0, :] = 255
    photo = Image.fromarray(stored, "L")
    exif = photo.getexif()
    exif[0x0112] = 6
    photo.save(root / "train" / "cat" / "zzz.png", exif=exif)
    a = load_folder(_cfg(name="folder", data_dir=str(root)))
    upright = a.x_train[6, 0]  # the cat folder's seventh file, sorted: the photo
    assert a.x_train.shape[2:] == (12, 10) and NOTE_RESIZE not in a.notes
    assert upright[:, -1].min() == 255 and upright[:, :-1].max() == 0
    assert a.notes["orientation"] == (
        "turned 1 of 19 images upright as their EXIF orientation says (a camera's photo "
        "stored on its side), as image viewers show them"
    )


def test_the_folder_scan_decodes_no_pixels(tmp_path, monkeypatch):
    """The scan that sizes a folder (and so refuses one too large for memory) reads
    headers only, the orientation of a JPEG photo included: PIL decodes a PNG whole when
    asked for an EXIF its header lacks, which would decode every image twice."""
    from PIL import ImageFile

    from asolab.data.folder import _scan

    root = write_folder(tmp_path / "imgs", per_class=4)
    photo = Image.fromarray(np.zeros((10, 12), np.uint8), "L")
    exif = photo.getexif()
    exif[0x0112] = 6
    photo.save(root / "train" / "dog" / "photo.jpg", exif=exif)
    decoded = []
    load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: decoded.append(im) or load(im))
    headers = _scan(root / "train", list(CLASSES), "train", [])
    assert len(headers) == 13 and not decoded
    assert [h.turned for h in headers].count(True) == 1


def test_labels_given_as_class_names_are_numbered_as_the_names_sort(tmp_path):
    """Text labels (as a CSV or a pandas column gives them): class k is the k-th name in
    sorted order, as a folder's classes are, and the names are the set's classes; a
    ``classes`` array fixes another order, and the test split's names map alike."""
    x = write_npz(tmp_path / "a.npz", n=60)
    with np.load(x) as npz:
        images, numbers = npz["x_train"], npz["y_train"]
    names = np.array(["owl", "cat", "dog"])[numbers]  # number 0 is "owl"
    np.savez(
        tmp_path / "named.npz", x_train=images, y_train=names, x_test=images[:9], y_test=names[:9]
    )
    d = load_data(_cfg(name="arrays", path=str(tmp_path / "named.npz")), seed=0)
    assert d.classes == ("cat", "dog", "owl") and d.num_classes == 3
    assert [d.classes[k] for k in d.test.y.tolist()] == names[:9].tolist()
    # the order a classes array gives, and names as bytes as well as str
    order = np.array(["owl", "cat", "dog"])
    np.savez(tmp_path / "ordered.npz", x_train=images, y_train=names.astype("S"), classes=order)
    o = load_data(_cfg(name="arrays", path=str(tmp_path / "ordered.npz")), seed=0)
    assert o.classes == ("owl", "cat", "dog")
    numbered = load_data(_cfg(name="arrays", path=str(x)), seed=0)
    assert torch.equal(o.full_train.y, numbered.full_train.y)  # "owl" is 0 in both


def test_a_set_too_large_for_memory_is_refused_before_loading_with_the_estimate(tmp_path):
    """The .npz's header claims a million 3x1024x1024 images (12 TB as float32): refused
    from the header alone; its data was never written, so loading would have failed."""
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for key, shape, dtype in (
            ("x_train", (10**6, 3, 1024, 1024), "|u1"),
            ("y_train", (10**6,), "<i8"),
        ):
            with zf.open(f"{key}.npy", "w") as fh:
                header = {"descr": dtype, "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(fh, header)
    with pytest.raises(DataError, match=r"needs about \d+\.\d GB .* GB are free") as info:
        load_data(_cfg(name="arrays", path=str(path)), seed=0)
    assert "11718.75 GB as float32" in str(info.value)
    # the same for a folder, sized from its images' headers before any is decoded
    root = write_folder(tmp_path / "imgs", per_class=10)
    with pytest.raises(DataError, match=r"data set 'folder' .* needs about"):
        load_data(_cfg(name="folder", data_dir=str(root), image_size=60000), seed=0)


# ------------------------------------------------------------------ runs


def test_runs_on_other_data_than_the_files_own_are_named_after_that_data(tmp_path):
    assert config.load("digits", {"search.cycles": 2}).name == "digits"
    own = {"data.name": "folder", "data.data_dir": str(tmp_path / "shapes") + "/"}
    assert config.load("digits", own).name == "folder-shapes"
    npz = {"data.name": "arrays", "data.path": "sets/my_set.npz"}
    assert config.load("digits", npz).name == "my_set"
    assert config.load("digits", {**npz, "name": "mine"}).name == "mine"  # a name given wins
    assert config.load("digits", {"data.name": "fashion_mnist"}).name == "fashion_mnist"
    # a file whose own data it is keeps the file's name
    exp = tmp_path / "shapes_run.toml"
    exp.write_text(f'[data]\nname = "folder"\ndata_dir = "{tmp_path / "shapes"}"\n')
    assert config.load(exp, {"seed": 3}).name == "shapes_run"


def test_a_folder_run_records_the_data_set_source_sizes_and_normalisation(tmp_path, capsys):
    """Through ``asolab run``: the run's dataset input in MLflow names the folder and
    holds the split sizes and the training split's mean and std."""
    root = write_folder(tmp_path / "imgs", per_class=12, test_per_class=3)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {**TINY, "data.name": "folder", "data.data_dir": str(root)}
    rc = main(["run", "--quiet", *_sets({**overrides, "tracking.tracking_uri": store})])
    assert rc == 0, capsys.readouterr().err
    client = MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["data.name"] == "folder"
    assert run.data.params["data.data_dir"] == str(root)
    # filed under its data, not under the experiment file's name (digits)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "folder-imgs" and run.data.params["name"] == "folder-imgs"
    assert "**folder-imgs**" in experiment.tags["mlflow.note.content"]
    (inp,) = run.inputs.dataset_inputs
    ds = inp.dataset
    assert ds.name == "folder" and ds.source_type == "local"
    assert json.loads(ds.source) == {"uri": str(root.resolve())}
    profile = json.loads(ds.profile)
    assert profile["train"] + profile["val"] == 36 and profile["test"] == 9
    assert profile["num_classes"] == 3 and profile["image_size"] == 10
    assert profile["classes"] == list(CLASSES)
    assert len(profile["mean"]) == len(profile["std"]) == 1 and 0 < profile["std"][0] < 1


def test_own_data_through_the_python_api_rgb_folder_and_arrays(tmp_path):
    root = write_folder(tmp_path / "rgb", per_class=12, mode="RGB", size=(9, 9))
    result = asolab.run(
        "digits", {**TINY, "data.name": "folder", "data.data_dir": str(root)}, track=False
    )
    assert result.run_id is None and 0.0 <= result.val_acc <= 1.0 and result.params > 0
    assert result.config.data.name == "folder"
    path = write_npz(tmp_path / "a.npz", n=60, channels=3)
    with np.load(path) as npz:  # channels last, as numpy and PIL write images
        np.savez(path, x_train=npz["x_train"].transpose(0, 2, 3, 1), y_train=npz["y_train"])
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = {**TINY, "data.name": "arrays", "data.path": str(path), "data.image_size": 6}
    result = asolab.run("digits", overrides, store, progress=False)
    run = MlflowClient(store).get_run(result.run_id)
    profile = json.loads(run.inputs.dataset_inputs[0].dataset.profile)
    assert profile["in_channels"] == 3 and len(profile["mean"]) == 3
    # what was done to the images, recorded with the run
    tags = run.data.tags
    assert "read as (N, H, W, C)" in tags["asolab.data_note.layout"]
    assert tags["asolab.data_note.resize"] == (
        "resized 60 of 60 images from 8x8 (60) to 6x6 (data.image_size)"
    )
    # and whole in the run's description (the UI cuts a tag's value to a few words)
    description = tags["mlflow.note.content"]
    for key in ("layout", "resize"):
        assert f"- data note ({key}): {tags['asolab.data_note.' + key]}\n" in description
    assert run.data.metrics["test_acc"] == pytest.approx(result.test_acc)


def test_an_arrays_run_through_asolab_run(tmp_path, capsys):
    path = write_npz(tmp_path / "a.npz", n=60)
    overrides = {**TINY, "data.name": "arrays", "data.path": str(path)}
    rc = main(["run", "--quiet", "--no-track", *_sets(overrides)])
    out = capsys.readouterr().out
    assert rc == 0 and "test accuracy" in out
