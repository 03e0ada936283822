"""GPU busy: the share of each training epoch in which the GPU ran kernels.

A search step at small shapes is bound by the host launching small kernels, not by
the GPU's arithmetic: on an H100 the default digits run kept the GPU 3-9% busy in
W-training, and the CIFAR-like shape 18% (bench/README.md, "On a GPU"). A researcher
sees that only if the run says so. On CUDA every training epoch therefore records the
mean of the driver's own utilization samples over its training loop: NVML's GPU
utilization, the figure ``nvidia-smi`` prints as GPU-Util, the share of each sample
period (1/6 s to 1 s, by product) in which one kernel or more ran. The MLflow tracker
records it per epoch (``gpu_busy_pct``); the run's summary gives it per phase, and
what to do when it is low (:func:`advice`).

The figure is the device's: another process on the same GPU (a study's second
worker) counts too. Samples come from the driver's buffer
(``nvmlDeviceGetSamples``), pulled every few seconds by a thread so that a long
epoch loses none; where the driver keeps no such buffer the thread reads the
current utilization five times a second instead, as ``nvidia-smi`` would. Where
there is no NVML (nvidia-ml-py missing, a driver without the library) or the device
reports no utilization (a MIG slice), nothing is recorded and the run's log says why,
once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import torch

from .phases import PHASE_TITLES

log = logging.getLogger(__name__)

PULL_SECONDS = 2.0  # how often the driver's sample buffer is read (it holds seconds)
POLL_SECONDS = 0.2  # how often the utilization is read where there is no buffer
LOW = 50.0  # percent: under this, the summary says what would keep the GPU busier
ALL = "all"  # summary()'s key for every epoch together


def now_us() -> int:
    """The host's clock as NVML stamps its samples: microseconds since the epoch."""
    return time.time_ns() // 1000


def mean_after(samples: Iterable[tuple[int, float]], mark: int) -> float | None:
    """The mean of the samples stamped after ``mark`` (None: there are none). A sample
    covers the period that ends at its stamp, so the first one after ``mark`` may reach
    back before it by up to one period."""
    values = [value for stamp, value in samples if stamp > mark]
    return sum(values) / len(values) if values else None


def _nvml_handle(device: torch.device) -> object:
    """NVML's handle of the GPU that torch calls ``device``: matched by UUID, since
    ``CUDA_VISIBLE_DEVICES`` renumbers torch's devices but not NVML's."""
    import pynvml

    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid).lower()
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetUUID(handle)
        if uuid and uuid in (name.decode() if isinstance(name, bytes) else name).lower():
            return handle
    raise LookupError(f"no NVML device has the UUID of {device} ({uuid})")


class GpuBusy:
    """The GPU's utilization samples for one run, and their mean per epoch and phase.

    ``mark()`` before an epoch's loop, ``since(mark)`` after it (once the GPU has
    finished: the loss's ``.item()`` waits for it); :meth:`record` keeps the figure
    per phase for the run's summary. :meth:`open` returns None where there is nothing
    to measure."""

    def __init__(self, read, buffered: bool) -> None:
        self._read = read  # (last stamp) -> new samples [(stamp, percent)]
        self._interval = PULL_SECONDS if buffered else POLL_SECONDS
        self._samples: list[tuple[int, float]] = []
        self._last = 0  # the newest stamp read, by the source's own clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._epochs: list[tuple[str, float, float]] = []  # (phase, percent, seconds)
        self._thread = threading.Thread(target=self._loop, name="asolab-gpu-busy", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, device: torch.device) -> GpuBusy | None:
        """A meter of ``device``'s utilization, or None off CUDA and where NVML gives none."""
        if device.type != "cuda":
            return None
        try:
            handle, buffered = _source(device)
        except Exception as exc:  # no pynvml, no driver library, a MIG slice, ...
            log.info("GPU busy is not recorded on %s: %s", device, exc)
            return None
        if buffered:
            return cls(lambda last: _buffered(handle, last), buffered=True)
        return cls(lambda last: _polled(handle), buffered=False)

    def _pull(self) -> bool:
        """Read the samples since the last read; False where reading failed (the driver
        went away: the figures stop, training goes on)."""
        try:
            with self._lock:
                new = self._read(self._last)
                self._samples.extend(new)
                self._last = max([self._last, *(stamp for stamp, _ in new)])
            return True
        except Exception as exc:
            log.warning("GPU busy: reading the GPU's utilization failed: %s", exc)
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self._interval) and self._pull():
            pass

    def mark(self) -> int:
        """A stamp to measure from: the newest sample's, by the source's own clock (NVML
        stamps its samples itself; comparing them with this host's clock would assume
        the two agree)."""
        self._pull()
        with self._lock:
            self._samples.clear()  # what came before an epoch is never asked for
            return self._last

    def since(self, mark: int) -> float | None:
        """The mean utilization, in percent, of the samples after ``mark`` (None: no
        sample period ended after it, an epoch shorter than one)."""
        self._pull()
        with self._lock:
            return mean_after(self._samples, mark)

    def record(self, phase: str, percent: float, seconds: float) -> None:
        """Keep an epoch's figure for :meth:`summary`."""
        self._epochs.append((phase, percent, seconds))

    def summary(self) -> dict[str, float]:
        """GPU busy per phase over the epochs this process ran, weighted by their
        seconds, in the order the phases first ran, then ``"all"``: every epoch's (percent;
        empty when no epoch recorded one)."""
        phases = dict.fromkeys(phase for phase, _, _ in self._epochs)
        figures = {p: weighted([(b, s) for q, b, s in self._epochs if q == p]) for p in phases}
        if figures:
            figures[ALL] = weighted([(b, s) for _, b, s in self._epochs])
        return figures

    def close(self) -> None:
        """Stop reading the GPU's samples (the thread ends within one interval)."""
        self._stop.set()


def weighted(epochs: list[tuple[float, float]]) -> float:
    """The seconds-weighted mean of ``(percent, seconds)`` pairs."""
    total = sum(seconds for _, seconds in epochs)
    if total <= 0:
        return sum(p for p, _ in epochs) / max(1, len(epochs))
    return sum(p * seconds for p, seconds in epochs) / total


def _source(device: torch.device) -> tuple[object, bool]:
    """``device``'s NVML handle, and whether the driver keeps a buffer of its samples
    (else they are read as they come); raises where NVML gives no utilization."""
    import pynvml

    handle = _nvml_handle(device)
    try:
        pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError_NotFound:  # a buffer, empty so far
        pass
    except pynvml.NVMLError:
        pynvml.nvmlDeviceGetUtilizationRates(handle)  # raises where there is none
        return handle, False
    return handle, True


def source_text(device: torch.device) -> str:
    """Where ``device``'s GPU busy figures come from, in words, or why there are none
    (bench/gpu_check.py's report)."""
    if device.type != "cuda":
        return f"none on {device}"
    try:
        _, buffered = _source(device)
    except Exception as exc:
        return f"none: {type(exc).__name__}: {exc}"
    return "NVML's sample buffer" if buffered else f"NVML, read every {POLL_SECONDS:g} s"


def _buffered(handle: object, last: int) -> list[tuple[int, float]]:
    """The driver's utilization samples stamped after ``last``."""
    import pynvml

    try:
        kind, samples = pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last
        )
    except pynvml.NVMLError_NotFound:  # none since ``last``
        return []
    field = "dVal" if kind == pynvml.NVML_VALUE_TYPE_DOUBLE else "uiVal"
    return [(int(s.timeStamp), float(getattr(s.sampleValue, field))) for s in samples]


def _polled(handle: object) -> list[tuple[int, float]]:
    """The utilization of the last sample period, stamped now."""
    import pynvml

    return [(now_us(), float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))]


def in_words(summary: dict[str, float]) -> str:
    """:meth:`GpuBusy.summary` in words: "14% (W-training 12%, alpha-training 9%, ...)"."""
    phases = ", ".join(f"{PHASE_TITLES.get(p, p)} {v:.0f}%" for p, v in summary.items() if p != ALL)
    return f"{summary[ALL]:.0f}% ({phases})"


def advice(summary: dict[str, float]) -> str:
    """What to do when the GPU sat mostly idle in training ("" when it did not, or
    nothing was measured): the host launching small kernels is then the limit, and more
    work per launch or more runs per GPU is what helps."""
    mean = summary.get(ALL)
    if mean is None or mean >= LOW:
        return ""
    return (
        f"GPU busy {mean:.0f}% of the training loops: the host launching small kernels is "
        "the limit. More runs per GPU (asolab study --gpus 0,0) or a larger "
        "data.batch_size use the rest: docs/scaling-out.md"
    )
