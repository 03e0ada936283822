"""A run's final network loaded back without executing anything stored: built from
asolab's code, the run's spec and genotype and plain-tensor weights, predicting raw
images with the run's preprocessing; the logged MLflow model does the same through
``mlflow.pyfunc``. One tiny tracked run serves every test here."""

from __future__ import annotations

import pickle
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pytest
import torch
from conftest import ONE_CYCLE
from mlflow import MlflowClient
from PIL import Image

import asolab
from asolab.data import load_data
from asolab.errors import ArgumentError
from asolab.tracking import layout as L
from asolab.tracking.store import TrackingError


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished digits run with its model logged: (result, store URI)."""
    store = f"sqlite:///{tmp_path_factory.mktemp('predict') / 'mlflow.db'}"
    overrides = {**ONE_CYCLE, "data.train_subset": 150, "tracking.log_models": True}
    return asolab.run("digits", overrides, tracking_uri=store), store


def _raw_test_images(result) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """The run's test split as raw uint8 HWC images, and its labels and normalised
    tensors as the run saw them."""
    data = load_data(result.config.data, seed=result.config.seed)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    pixels = ((data.test.x * std + mean) * 255).round().clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).numpy(), data.test.y, data.test.x


def test_load_model_predicts_raw_images_with_the_runs_preprocessing(finished, tmp_path):
    result, store = finished
    model = asolab.load_model(result.run_id[:8], tracking_uri=store)
    # the derived network only: the alphas do not ride along
    assert model.params == result.params == sum(p.numel() for p in model.network.parameters())
    assert model.classes == [str(i) for i in range(10)] and not model.network.training

    images, labels, normalised = _raw_test_images(result)
    table = model.predict(images)
    assert list(table.columns) == ["class", "probability"] and len(table) == len(labels)
    assert ((table["probability"] > 0) & (table["probability"] <= 1)).all()
    accuracy = (table["class"].astype(int).to_numpy() == labels.numpy()).mean()
    # uint8 rounding of the pixels moves few predictions, if any
    assert accuracy == pytest.approx(result.test_acc, abs=0.02)
    with torch.no_grad():
        expected = model.network(normalised).softmax(1).numpy()
    assert np.allclose(model.probabilities(images), expected, atol=0.02)

    # a PIL image, an HW array, an image file and a folder of them
    one = images[0, :, :, 0]
    first = model.predict(images[:1]).iloc[0]
    for given in (Image.fromarray(one), one):
        assert model.predict(given).iloc[0]["class"] == first["class"]
    folder = tmp_path / "new"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(images[i, :, :, 0]).save(folder / f"{i}.png")
    by_files = model.predict(folder)
    assert list(by_files["file"]) == [str(folder / f"{i}.png") for i in range(3)]
    assert list(by_files["class"]) == list(model.predict(images[:3])["class"])
    assert model.predict(folder / "0.png").iloc[0]["class"] == first["class"]
    # a photo stored on its side, its EXIF orientation 6 saying to turn it a quarter
    # clockwise: read upright, as the run reads its folder's photos
    sideways = Image.fromarray(np.ascontiguousarray(np.rot90(one)))
    exif = sideways.getexif()
    exif[0x0112] = 6
    sideways.save(tmp_path / "sideways.png", exif=exif)
    assert np.array_equal(
        model.probabilities(tmp_path / "sideways.png"), model.probabilities(images[:1])
    )


def test_unnormalised_or_normalised_input_cannot_reach_the_network(finished):
    """predict and pyfunc take uint8 only: a float array or a tensor, normalised or not,
    is refused instead of being normalised twice or not at all."""
    result, store = finished
    model = asolab.load_model(result.run_id, tracking_uri=store)
    images, _, normalised = _raw_test_images(result)
    for wrong in (
        normalised,
        normalised.numpy(),
        images.astype(np.float32),
        images.astype(np.float32) / 255,
    ):
        with pytest.raises(TrackingError, match="raw images"):
            model.predict(wrong)
    with pytest.raises(TrackingError, match="8x8x1"):
        model.predict(np.zeros((2, 8, 8, 3), np.uint8))

    uri = MlflowClient(store).get_run(result.run_id).data.tags[L.TAG_MODEL_URI]
    mlflow.set_tracking_uri(store)
    try:
        logged = mlflow.pyfunc.load_model(uri)
    finally:
        mlflow.set_tracking_uri(None)
    inputs = logged.metadata.get_input_schema().inputs
    assert [(s.type, s.shape) for s in inputs] == [(np.dtype("uint8"), (-1, 8, 8, 1))]
    table = logged.predict(images)
    assert list(table["class"]) == list(model.predict(images)["class"])
    with pytest.raises(Exception, match="uint8"):
        logged.predict(images.astype(np.float32) / 255)


class _Payload:
    """Pickled, it writes a file when unpickled (stands for ``os.system``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _model_folder(store: str, run_id: str) -> Path:
    client = MlflowClient(store)
    model_id = client.get_run(run_id).data.tags[L.TAG_MODEL_URI].removeprefix("models:/")
    return Path(client.get_logged_model(model_id).artifact_location.removeprefix("file://"))


def test_load_model_neither_runs_nor_needs_a_pickle_planted_in_the_store(finished, tmp_path):
    result, store = finished
    folder = _model_folder(store, result.run_id)
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    # the old pickle's place, and every file besides the network's own
    planted = ("data/model.pth", "python_model.pkl", "MLmodel")
    kept = {name: (folder / name).read_bytes() for name in planted if (folder / name).exists()}
    try:
        for name in planted:
            (folder / name).write_bytes(payload)
        model = asolab.load_model(result.run_id, tracking_uri=store)
        assert model.params == result.params and not marker.exists()
    finally:  # the module's other tests share this run
        for name in planted:
            (folder / name).unlink()
        for name, data in kept.items():
            (folder / name).write_bytes(data)

    # a payload in the weights file itself is refused, not run
    network = folder / L.MODEL_NETWORK_DIR  # safetensors where installed, else torch's file
    weights = next(
        network / name
        for name in (L.MODEL_WEIGHTS_SAFETENSORS, L.MODEL_WEIGHTS_TORCH)
        if (network / name).exists()
    )
    saved = weights.read_bytes()
    try:
        weights.write_bytes(payload)
        with pytest.raises(TrackingError, match="do not load"):
            asolab.load_model(result.run_id, tracking_uri=store)
        assert not marker.exists()
    finally:
        weights.write_bytes(saved)


def test_the_api_names_the_argument_and_what_it_takes(tmp_path):
    """NY02, NY18, NY19, NY11."""
    cases = [
        (lambda: asolab.run("digits", 42), "asolab.run: overrides takes a mapping"),
        (lambda: asolab.run(42), "asolab.run: experiment takes a shipped experiment name"),
        (lambda: asolab.load_model(42), "asolab.load_model: run_id takes a run's id"),
    ]
    for call, message in cases:
        with pytest.raises(ArgumentError, match=message):
            call()
    nowhere = tmp_path / "nostore" / "mlflow.db"
    with pytest.raises(ArgumentError, match="tracking_uri takes an existing MLflow store"):
        asolab.load_model("abc", tracking_uri=f"sqlite:///{nowhere}")
    assert not (tmp_path / "nostore").exists()
