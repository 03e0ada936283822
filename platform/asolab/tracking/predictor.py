"""A run's final network as files that hold no code, and the predictor built from them.

The logged MLflow model keeps, in its ``network/`` folder, ``network.json`` (the
architecture spec, the genotype and how raw images become the network's input:
size, channels, mean, std, class names) and the weights as plain tensors
(``weights.safetensors`` where the ``safetensors`` package is installed, else a
``torch.save`` of tensors that ``torch.load(weights_only=True)`` reads).
:func:`load` rebuilds the network from asolab's own modules, the spec and the
genotype, and loads the tensors into it: nothing stored is executed, and nothing
is unpickled beyond tensors.

:class:`Predictor` takes raw images only (PIL images, ``uint8`` arrays, image files,
a folder) and applies the run's preprocessing itself, so that a prediction can
never be made on input normalised wrongly, or not at all. ``mlflow.pyfunc``
loads the same files through :func:`_load_pyfunc` (the model's ``loader_module``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..config import ConfigError
from ..plugins import PluginError
from ..space.genotype import Genotype
from ..space.network import DerivedNetwork, derived_state, standalone
from ..space.spec import ArchSpec
from . import layout as L
from .store import TrackingError

if TYPE_CHECKING:
    import pandas as pd

FORMAT = "asolab-network/1"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}  # PIL mode by the run's channel count


def _safetensors() -> Any:
    try:
        import safetensors.torch as st
    except ImportError:
        return None
    return st


def save(folder: Path, supernet: Any, genotype: Genotype, preprocessing: dict[str, Any]) -> None:
    """Write the derived network of ``supernet`` along ``genotype`` into ``folder``:
    ``network.json`` and the weights file (see the module's docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = derived_state(supernet, genotype)
    st = _safetensors()
    if st is not None:
        weights = L.MODEL_WEIGHTS_SAFETENSORS
        st.save_file(tensors, str(folder / weights))
    else:
        weights = L.MODEL_WEIGHTS_TORCH
        torch.save(tensors, folder / weights)
    info = {
        "format": FORMAT,
        "spec": supernet.spec.to_dict(),
        "genotype": genotype.to_dict(),
        "weights": weights,
        "params": int(sum(p.numel() for p in supernet.derived_parameters(genotype))),
        "preprocessing": preprocessing,
    }
    (folder / L.MODEL_NETWORK_FILE).write_text(json.dumps(info, indent=2))


def files_needed(info: dict[str, Any]) -> list[str]:
    """The files of a saved network besides ``network.json``: its weights only."""
    return [str(info.get("weights", ""))]


def read_info(path: Path) -> dict[str, Any]:
    """``network.json``, checked to be this format."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrackingError(f"{path} is not a saved asolab network ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise TrackingError(
            f"{path} is not a saved asolab network of format {FORMAT} "
            f"(format {info.get('format') if isinstance(info, dict) else None!r})"
        )
    if info.get("weights") not in (L.MODEL_WEIGHTS_SAFETENSORS, L.MODEL_WEIGHTS_TORCH):
        raise TrackingError(f"{path} names no weights file asolab reads ({info.get('weights')!r})")
    return info


def load(folder: Path, info: dict[str, Any] | None = None) -> Predictor:
    """The predictor saved in ``folder`` by :func:`save`, on the CPU, in eval mode."""
    info = info or read_info(folder / L.MODEL_NETWORK_FILE)
    try:
        net = standalone(ArchSpec.from_dict(info["spec"]), Genotype.from_dict(info["genotype"]))
        preprocessing = dict(info["preprocessing"])
    except PluginError:  # an op of a plugin that is not installed here: it says which
        raise
    except Exception as exc:  # an edited or damaged file: say so, in one line
        raise TrackingError(
            f"{folder / L.MODEL_NETWORK_FILE} does not describe a network asolab can build "
            f"({type(exc).__name__}: {exc})"
        ) from None
    path = folder / info["weights"]
    try:
        if info["weights"] == L.MODEL_WEIGHTS_SAFETENSORS:
            st = _safetensors()
            if st is None:
                raise TrackingError(
                    f"{path} is in the safetensors format; install it (pip install safetensors)"
                )
            tensors = st.load_file(str(path), device="cpu")
        else:
            # Tensors only: a file holding anything else (code to run) is refused.
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        net.load_state_dict(tensors, strict=True)
    except TrackingError:
        raise
    except Exception as exc:  # a truncated file, a pickle with code, weights of another network
        raise TrackingError(
            f"the weights {path} do not load into the network their network.json describes "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    return Predictor(net, preprocessing)


class Predictor:
    """A run's final network with the run's preprocessing: ``predict`` takes raw images.

    ``network`` is the ``torch.nn.Module`` itself (it takes normalised ``(N, C, H, W)``
    tensors); ``params`` its parameter count (the run's ``final_params``); ``classes``
    the class names by label; ``genotype`` the architecture.
    """

    def __init__(self, network: DerivedNetwork, preprocessing: dict[str, Any]) -> None:
        self.network = network.eval()
        self.genotype: Genotype = network.genotype
        self.params = sum(p.numel() for p in network.parameters())
        self.classes: list[str] = [str(c) for c in preprocessing["classes"]]
        self.channels = int(preprocessing["in_channels"])
        self.height, self.width = int(preprocessing["height"]), int(preprocessing["width"])
        self.mean = torch.tensor(preprocessing["mean"], dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(preprocessing["std"], dtype=torch.float32).view(1, -1, 1, 1)
        self.data = str(preprocessing.get("data", ""))

    def __repr__(self) -> str:
        return (
            f"Predictor({self.data}: {self.height}x{self.width}x{self.channels} uint8 -> "
            f"{len(self.classes)} classes, {self.params} parameters, genotype {self.genotype})"
        )

    def preprocess(self, images: Any) -> torch.Tensor:
        """Raw images -> the normalised ``(N, C, H, W)`` tensor the network takes."""
        x = self._pixels(images)
        return (torch.tensor(x).permute(0, 3, 1, 2).float() / 255.0 - self.mean) / self.std

    @torch.no_grad()
    def probabilities(self, images: Any) -> np.ndarray:
        """``(N, classes)`` softmax probabilities of raw images."""
        x = self.preprocess(images)
        out = [self.network(x[i : i + 256]).softmax(1) for i in range(0, len(x), 256)]
        return torch.cat(out).numpy() if out else np.zeros((0, len(self.classes)), np.float32)

    def predict(self, images: Any) -> pd.DataFrame:
        """One row per image: ``class`` (its name) and ``probability``; ``file`` first
        where the images came from files. ``images``: a PIL image, a ``uint8`` array
        (``HWC``, ``HW``, or a batch ``NHWC``), an image file, a folder of images, or
        a list of these."""
        import pandas as pd

        files = _files(images)
        p = self.probabilities(files if files is not None else images)
        best = p.argmax(1) if len(p) else np.zeros(0, dtype=int)
        table = pd.DataFrame(
            {
                "class": [self.classes[i] for i in best],
                "probability": p[np.arange(len(p)), best].astype(float),
            }
        )
        if files is not None:
            table.insert(0, "file", [str(f) for f in files])
        return table

    # ------------------------------------------------------------------ raw images

    def _pixels(self, images: Any) -> np.ndarray:
        """``(N, H, W, C)`` uint8 at the run's size and channels; anything but raw
        images is refused (it would bypass or repeat the normalisation)."""
        from PIL import Image, ImageOps, UnidentifiedImageError

        if isinstance(images, (str, Path)):
            path = Path(images).expanduser()
            if not path.is_file():
                return self._pixels(_files(path))  # a folder: its images
            try:
                with Image.open(path) as img:
                    img.load()
                    return self._pixels(img)
            except (OSError, UnidentifiedImageError) as exc:
                raise TrackingError(f"{path} is not an image asolab can read ({exc})") from None
        if isinstance(images, (list, tuple)):
            parts = [self._pixels(i) for i in images]
            shape = (0, self.height, self.width, self.channels)
            return np.concatenate(parts) if parts else np.zeros(shape, np.uint8)
        if isinstance(images, Image.Image):
            mode = _MODES.get(self.channels)
            if mode is None:
                raise TrackingError(
                    f"this network takes {self.channels}-channel images, which PIL does not "
                    "hold; pass uint8 arrays (N, H, W, C)"
                )
            # upright, as the run read its folder's photos (data/folder.py)
            img = ImageOps.exif_transpose(images).convert(mode)
            if img.size != (self.width, self.height):
                img = img.resize((self.width, self.height), Image.Resampling.BILINEAR)
            a = np.asarray(img, dtype=np.uint8)
            return (a[:, :, None] if a.ndim == 2 else a)[None]
        return self._array(images)

    def _array(self, images: Any) -> np.ndarray:
        expected = f"uint8 images of {self.height}x{self.width}x{self.channels} (H, W, C)"
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
            what = (
                f"a {images.dtype} array"
                if isinstance(images, (np.ndarray, torch.Tensor))
                else f"a {type(images).__name__}"
            )
            raise TrackingError(
                f"predict takes raw images: PIL images, image files, a folder, or {expected} "
                f"0..255; got {what}. It applies the run's normalisation itself (network "
                "takes normalised tensors)"
            )
        a = images
        if a.ndim == 2:
            a = a[None, :, :, None]
        elif a.ndim == 3 and a.shape == (self.height, self.width, self.channels):
            a = a[None]
        elif a.ndim == 3 and self.channels == 1 and a.shape[1:] == (self.height, self.width):
            a = a[:, :, :, None]  # a batch of grey images
        elif a.ndim == 3:
            a = a[None]
        if a.ndim != 4 or a.shape[3] != self.channels:
            raise TrackingError(
                f"predict takes {expected} (or a batch N, H, W, C); got an array of shape "
                f"{images.shape}"
            )
        if a.shape[1:3] != (self.height, self.width):
            from PIL import Image

            a = np.concatenate(
                [self._pixels(Image.fromarray(i[:, :, 0] if self.channels == 1 else i)) for i in a]
            )
        return np.ascontiguousarray(a)


def _files(images: Any) -> list[Path] | None:
    """The image files ``images`` names (a file, a folder: its images, sorted; a list of
    paths), or None when it names none."""
    if isinstance(images, (str, Path)):
        path = Path(images).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise TrackingError(f"no images in {path} (looked for {', '.join(IMAGE_SUFFIXES)})")
            return found
        if not path.is_file():
            raise TrackingError(f"no image file or folder {path}")
        return [path]
    if (
        isinstance(images, (list, tuple))
        and images
        and all(isinstance(i, (str, Path)) for i in images)
    ):
        return [p for i in images for p in (_files(i) or [])]
    return None


class _PyfuncModel:
    """What ``mlflow.pyfunc.load_model`` returns the predictor as: raw ``uint8`` images
    ``(N, H, W, C)`` in, a table of ``class`` and ``probability`` out."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def get_raw_model(self) -> Predictor:
        """The :class:`Predictor` (``mlflow.pyfunc``'s ``get_raw_model()``)."""
        return self.predictor

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if isinstance(model_input, dict) and len(model_input) == 1:  # a named tensor input
            (model_input,) = model_input.values()
        return self.predictor.predict(model_input)


def _load_pyfunc(path: str) -> _PyfuncModel:
    """MLflow's entry (the model's ``loader_module``): ``path`` is its ``network/`` folder."""
    return _PyfuncModel(load(Path(path)))


def from_run(uri: str, run: Any) -> Predictor:
    """The predictor of ``run`` (an MLflow run) in the store at ``uri``, from its logged
    model's ``network/`` files only: the MLmodel file (which names the code that
    pyfunc runs) and any other file in the model are neither read nor downloaded."""
    import tempfile

    import mlflow.artifacts

    from .store import client

    run_id = run.info.run_id
    model_uri = run.data.tags.get(L.TAG_MODEL_URI)
    if not model_uri:
        raise ConfigError(
            f"run {run_id} has no model (it did not finish, or ran with "
            "tracking.log_models = false)"
        )
    logged = client(uri).get_logged_model(model_uri.removeprefix("models:/"))
    base = f"{logged.artifact_location.rstrip('/')}/{L.MODEL_NETWORK_DIR}"
    with tempfile.TemporaryDirectory(prefix="asolab-model-") as tmp, _no_progress_bars():

        def fetch(name: str) -> Path:
            try:
                return Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=f"{base}/{name}", dst_path=tmp, tracking_uri=uri
                    )
                )
            except Exception as exc:  # MlflowException, OSError: the file is not there
                raise TrackingError(
                    f"run {run_id}'s model has no {L.MODEL_NETWORK_DIR}/{name} ({_first(exc)}); "
                    "an earlier asolab logged it as a pickle, which load_model does not run "
                    "(mlflow.pytorch.load_model does, if you trust the store), or the store "
                    "lost it"
                ) from None

        info = read_info(fetch(L.MODEL_NETWORK_FILE))
        for name in files_needed(info):
            fetch(name)
        return load(Path(tmp), info)


def _first(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class _no_progress_bars:
    """MLflow's per-file download bars, off while a model loads (a notebook cell would
    fill with them), and back as they were."""

    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"

    def __enter__(self) -> None:
        import os

        self.before = os.environ.get(self.key)
        os.environ[self.key] = "false"

    def __exit__(self, *exc: object) -> None:
        import os

        if self.before is None:
            os.environ.pop(self.key, None)
        else:
            os.environ[self.key] = self.before
