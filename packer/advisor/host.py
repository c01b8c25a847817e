"""Which machine a measurement was made on: the CPU, the cores this process may use, the SIMD level
the CPU offers and the one each library actually dispatches to.

A speed ratio measured on one host is not a claim about another: the same command has given packer
very different ratios to FFCV on two 2-core hosts of one kind (docs/BENCHMARKS.md). Every benchmark prints
``Host.line()`` beside its table and stores ``Host.to_dict()`` with its figures. The libraries'
dispatch can be capped below what the CPU offers (``SIMD_CAPS``, ``scripts/as_simd.py``) to measure
on an AVX-512 host what AVX2 kernels give; the line then says so.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from packer.system import usable_cpus

AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile")
"""The AVX-512 (and AMX) flags of ``/proc/cpuinfo`` a host line names: F, BW, VL, DQ are what
compilers target as x86-64-v4; VNNI and BF16 speed integer and bfloat16 work."""

SIMD_CAPS: dict[str, dict[str, str]] = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",  # torch's kernels
        # numpy's dispatch targets above AVX2: numpy 2.4's names, then those of older releases
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL",
        "OPENCV_CPU_DISABLE": "AVX512-SKX,AVX512-CLX,AVX512-CNL,AVX512-ICL",  # OpenCV's
        # numba (FFCV's kernels): LLVM code for an AVX2 CPU. The name alone is not enough: numba's JIT
        # still takes the host's features (AVX-512 included) unless they are given too.
        "NUMBA_CPU_NAME": "haswell",
        "NUMBA_CPU_FEATURES": (
            "+64bit,+adx,+aes,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fsgsbase,+lzcnt,+mmx,+movbe,"
            "+pclmul,+popcnt,+rdrnd,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,+xsaveopt,"
            "-avx512f,-avx512bw,-avx512vl,-avx512dq,-avx512cd,-avx512vnni,-avx512bf16"
        ),
    },
}
"""Environment variables that cap each library's SIMD dispatch at a level, set before the libraries
are imported (``scripts/as_simd.py LEVEL COMMAND`` runs a command so). libjpeg-turbo (simplejpeg,
Pillow) and Pillow's own kernels use AVX2 at most whatever the CPU has."""


@dataclass(frozen=True)
class Host:
    """What a benchmark run records about its machine (``describe_host``)."""

    cpu: str
    """The CPU's model name as the kernel reports it (a VM may give only "AMD EPYC")."""
    family_model: str
    """vendor, family and model numbers (they tell the generation where the name does not)."""
    cores: int
    """Cores this process may use (affinity and cgroup quota)."""
    simd: str
    """The widest x86 vector extension the CPU offers: "AVX-512", "AVX2", or what it has."""
    avx512: tuple[str, ...] = ()
    """The AVX-512 (and AMX) flags the CPU offers, of ``AVX512_FLAGS``."""
    dispatch: dict[str, str] = field(default_factory=dict)
    """The level each library dispatches to here: torch, numpy, opencv (after any cap)."""
    capped: Optional[str] = None
    """The level ``SIMD_CAPS`` capped the libraries at, from the environment, or None."""

    def line(self) -> str:
        """One line for a benchmark's output: ``Host: AMD EPYC (AuthenticAMD family 25 model 1), 2
        cores, AVX-512 (F BW VL ...); kernels: torch AVX512, numpy X86_V4, opencv AVX512-SKX``."""
        simd = self.simd + (f" ({' '.join(_short(f) for f in self.avx512)})" if self.avx512 else "")
        kernels = ", ".join(f"{name} {level}" for name, level in self.dispatch.items())
        cap = f" (capped at {self.capped.upper()} by the environment)" if self.capped else ""
        return f"Host: {self.cpu} ({self.family_model}), {self.cores} cores, {simd}; kernels{cap}: {kernels}"

    def to_dict(self) -> dict:
        """The record as JSON-ready values."""
        out = asdict(self)
        out["avx512"] = list(self.avx512)
        return out

    @classmethod
    def from_dict(cls, record: dict) -> Host:
        """A Host from ``to_dict``'s values (other keys beside them, such as a run's versions, ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        values["avx512"] = tuple(values.get("avx512", ()))
        return cls(**values)


def describe_host(cpuinfo: Optional[str] = None) -> Host:
    """This machine, as a ``Host``; ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when None;
    off Linux only ``platform`` is asked)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    info: dict[str, str] = {}
    for row in cpuinfo.splitlines():
        if not row.strip():
            break  # the first processor's block describes them all
        key, _, value = row.partition(":")
        info[key.strip()] = value.strip()
    flags = set(info.get("flags", "").split())
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        simd = "AVX-512"
    elif {"avx2", "fma"} <= flags:
        simd = "AVX2"
    elif "sse4_2" in flags:
        simd = "SSE4.2"
    else:
        simd = platform.machine() or "unknown"
    family = " ".join(
        f"{label} {info[key]}" if label else info[key]
        for key, label in (("vendor_id", ""), ("cpu family", "family"), ("model", "model"))
        if key in info
    )
    return Host(
        cpu=info.get("model name") or platform.processor() or platform.machine() or "unknown",
        family_model=family or "not reported",
        cores=usable_cpus(),
        simd=simd,
        avx512=tuple(f for f in AVX512_FLAGS if f in flags),
        dispatch=(dispatch := library_dispatch()),
        capped=_capped(dispatch),
    )


def library_dispatch() -> dict[str, str]:
    """The SIMD level torch, numpy and OpenCV dispatch to in this process (those installed)."""
    out: dict[str, str] = {}
    try:
        import torch

        out["torch"] = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        pass
    try:  # numpy's own record of the features it found and may dispatch to (none public)
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

        usable = [t for t in __cpu_dispatch__ if __cpu_features__.get(t)]
        out["numpy"] = usable[-1] if usable else "baseline"
    except ImportError:
        pass
    try:
        import cv2

        # "*AVX2 *AVX512-SKX?": a star marks a dispatched level, a question mark one not available here
        levels = [w.strip("*") for w in cv2.getCPUFeaturesLine().split() if w.startswith("*") and "?" not in w]
        out["opencv"] = levels[-1] if levels else "baseline"
    except (ImportError, AttributeError):
        pass
    return out


def _capped(dispatch: dict[str, str]) -> Optional[str]:
    """The ``SIMD_CAPS`` level whose variables this process's environment carries, if the libraries'
    dispatch agrees (none of them on an AVX-512 level): a cap that did not take is not claimed."""
    for level, variables in SIMD_CAPS.items():
        if all(os.environ.get(k) == v for k, v in variables.items()):
            above = [name for name, got in dispatch.items() if "512" in got or got.endswith("V4")]
            return None if above else level
    return None


def _short(flag: str) -> str:
    """``avx512_vnni`` -> ``VNNI``, ``avx512f`` -> ``F``, ``amx_tile`` -> ``AMX``."""
    if flag == "amx_tile":
        return "AMX"
    return flag.removeprefix("avx512").lstrip("_").upper()


__all__ = ["Host", "describe_host", "library_dispatch", "SIMD_CAPS", "AVX512_FLAGS"]
