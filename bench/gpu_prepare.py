"""Make what bench/gpu_check.py needs on a bare GPU machine that cannot download anything.

    python bench/gpu_prepare.py                  # writes .gpu/ (ignored by git), prints the command
    python bench/gpu_prepare.py --python-version 3.11 --out /tmp/gpu   # a rehearsal here

A lent GPU machine has PyTorch and the scientific stack but not MLflow or Optuna,
no Debian Fashion-MNIST, and no network. This writes, under ``--out``:

- ``whl/``: wheels of asolab's dependencies for the machine's Python
  (``--python-version``, manylinux x86-64) that its image does not hold
  (``DEVICE_HAS``, read from the machines' package list), resolved with their own
  dependencies at the versions installed here;
- ``fashion-mnist/``: Debian's Fashion-MNIST cut to its first ``--train-images``
  training images and the whole test split, in the same idx format, so that the
  working tree stays under the 64 MiB a call may carry.

It prints the one command to run there, which installs the wheels into a
folder on ``PYTHONPATH`` (no network, no dependency resolution) and runs the
check with the report written where the tool fetches it from. It downloads,
so it never runs in the test suite; ``--python-version`` of this machine's
Python rehearses the whole thing here (bench/README.md, "On a GPU").
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FASHION = Path("/usr/share/datasets/fashion-mnist")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
# What the lent machines' image holds (the device tool's KINDS.md, read 2026-11-17), in
# normalised names: their wheels are not carried. torch there is 2.11 (asolab needs >= 2.4).
DEVICE_HAS = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
    attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
    contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x
    cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
    fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader
    lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
    markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
    rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
    wrapt xarray xxhash yarl zipp""".split()
)
# asolab's run-time needs that the image lacks; their own dependencies come along
NEEDED = ("mlflow", "optuna")


def normalise(wheel: str) -> str:
    """A wheel file's distribution name, PEP 503-normalised (``Flask_Cors-6.0`` -> flask-cors)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def download_wheels(dest: Path, python_version: str) -> list[Path]:
    """The wheels of NEEDED (pinned to the versions here) and their dependencies that the
    image lacks, for ``python_version`` on manylinux x86-64."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    cmd += [x for p in PLATFORMS for x in ("--platform", p)]
    cmd += [f"{name}=={version(name)}" for name in NEEDED]
    subprocess.run(cmd, check=True)
    kept = []
    for wheel in sorted(dest.glob("*.whl")):
        if normalise(wheel.name) in DEVICE_HAS:
            wheel.unlink()  # the image's own copy is used
        else:
            kept.append(wheel)
    return kept


def cut_idx(src: Path, dst: Path, count: int | None) -> None:
    """Copy an idx(.gz) file keeping its first ``count`` items (all with None)."""
    with gzip.open(src, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    n = shape[0] if count is None else min(count, shape[0])
    item = math.prod(shape[1:])
    head = data[:4] + n.to_bytes(4, "big") + data[8 : 4 + 4 * dims]
    with gzip.open(dst, "wb", compresslevel=9) as f:
        f.write(head + data[4 + 4 * dims : 4 + 4 * dims + n * item])


def fashion_subset(dest: Path, train_images: int, test_images: int | None = None) -> None:
    """Fashion-MNIST's first ``train_images`` training images and ``test_images`` test
    images (all 10,000 with None, as the GPU check has them) in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        cut_idx(FASHION / f"{stem}.gz", dest / f"{stem}.gz", train_images)
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        if test_images is None:
            shutil.copyfile(FASHION / f"{stem}.gz", dest / f"{stem}.gz")
        else:
            cut_idx(FASHION / f"{stem}.gz", dest / f"{stem}.gz", test_images)


# sections the H100s measured by 2026-11-28 (bench/README.md, "On a GPU") whose figures
# no open question waits on: skipped, so that the 560 s reach what is still open (the
# default run's first sight, the layouts, CUDA graphs run after run, growth; and the device
# tests, for the run's own GPU busy meter, its memory figures and deterministic runs) by
# estimate
MEASURED = (
    "graphed",  # a graph pair per candidate op: 0.91x the eager step (2026-11-27), not shipped
    "steps",
    "op_costs",
    "digits_autotune_on",  # 45.3 s against 30.1 off (2026-11-28): the digits experiment's off
    "digits_autotune_all",
    "digits_autotune_limit3",
    # profiled on 2026-11-27: conv2d and the backward 29 of a fresh run's 41 s; first_sight
    # now asks what each convolution kind's first sight costs, cifar_shape_limit3 the rest
    "digits_profile",
    "fashion",
    "study",
    "variants",
    "workers",
    "compile_default",
    "compile_reduce_overhead",
)


def device_command(out: Path) -> str:
    """The command for the device tool (run from the repository root, ``out`` carried).

    The wheels go in uncompiled (quicker to install), and Python is let write each
    module's bytecode on its first import. On the H100 (2026-11-27) a default run
    profiled in a fresh process, after a whole ``gpu_check``, still compiled the source
    of 968 modules, 3.4 s of its 41 s: the bytecode had not been kept, a cost a user's
    ``pip install`` (which compiles) never pays. ``gpu_check``'s report says whether
    Python wrote bytecode (``bytecode_written``)."""
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    return (
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        f"--target /tmp/site {rel}/whl/*.whl || exit 3; unset PYTHONDONTWRITEBYTECODE; "
        "export PYTHONPATH=/tmp/site:$PWD/platform PYTHONUNBUFFERED=1; nvidia-smi -L; "
        f"python3 bench/gpu_check.py --fashion-dir {rel}/fashion-mnist --out $OUT "
        f"--skip {','.join(MEASURED)} "
        "2>&1 | tee $OUT/log.txt"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu"), help="folder to write (default .gpu/)")
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    ap.add_argument("--train-images", type=int, default=20000, help="Fashion-MNIST images kept")
    args = ap.parse_args(argv)
    out = Path(args.out)
    wheels = download_wheels(out / "whl", args.python_version)
    fashion_subset(out / "fashion-mnist", args.train_images)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{len(wheels)} wheels and Fashion-MNIST ({args.train_images} training images) in {out}")
    print(f"{size / 2**20:.1f} MiB to carry (a call carries 64 MiB with the working tree)")
    print("run there, from the repository root, carrying that folder:")
    print(device_command(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
