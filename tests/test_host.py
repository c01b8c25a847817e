"""packer.advisor.host: the machine a benchmark names beside its figures, and scripts/as_simd.py,
which caps the libraries' SIMD dispatch for a command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from packer.advisor.host import SIMD_CAPS, Host, describe_host

ROOT = Path(__file__).resolve().parent.parent

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 49
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 bmi2 sha_ni

processor\t: 1
model name\t: ignored: the first processor describes them all
"""

XEON_AVX512 = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: sse4_2 avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile
"""


def test_the_cpu_its_generation_and_its_widest_simd_come_from_cpuinfo():
    epyc = describe_host(EPYC_AVX2)
    assert (epyc.cpu, epyc.family_model, epyc.simd, epyc.avx512) == (
        "AMD EPYC 7B12",
        "AuthenticAMD family 23 model 49",
        "AVX2",
        (),
    )
    xeon = describe_host(XEON_AVX512)
    assert xeon.simd == "AVX-512"
    assert xeon.avx512 == ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile")
    line = xeon.line()
    assert line.startswith("Host: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz (GenuineIntel family 6 model 143), ")
    assert "AVX-512 (F BW VL DQ VNNI BF16 AMX)" in line
    assert describe_host("").simd and describe_host("").family_model == "not reported"  # no /proc/cpuinfo


def test_this_hosts_record_names_what_each_library_dispatches_to_and_survives_json():
    host = describe_host()
    assert host.cores >= 1 and {"torch", "numpy"} <= set(host.dispatch)
    again = Host.from_dict({**json.loads(json.dumps(host.to_dict())), "python": "3.11"})  # a run's extra keys
    assert again == host and again.line() == host.line()


def test_a_cap_is_claimed_only_when_the_environment_sets_it_and_the_libraries_took_it(monkeypatch):
    from packer.advisor.host import _capped

    below = {"torch": "AVX2", "numpy": "X86_V3", "opencv": "AVX2"}
    assert _capped(below) is None  # no cap asked
    for name, value in SIMD_CAPS["avx2"].items():
        monkeypatch.setenv(name, value)
    assert _capped(below) == "avx2"
    assert _capped({**below, "numpy": "X86_V4"}) is None  # imported before the variables were set
    assert _capped({**below, "torch": "AVX512"}) is None
    line = Host("X", "y", 2, "AVX-512", dispatch=below, capped="avx2").line()
    assert "kernels (capped at AVX2 by the environment): torch AVX2, numpy X86_V3, opencv AVX2" in line
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    assert _capped(below) is None  # a partial cap is not claimed


@pytest.mark.long
def test_as_simd_runs_a_command_with_torch_and_numpy_on_avx2_kernels():
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from packer.advisor.host import describe_host; "
        "h = describe_host(); print(json.dumps([h.capped, h.dispatch, h.simd]))"
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "as_simd.py"), "avx2", sys.executable, "-c", probe, str(ROOT)],
        capture_output=True,
        text=True,
        check=True,
    )
    capped, dispatch, simd = json.loads(out.stdout.splitlines()[-1])
    assert capped == "avx2"
    if simd in ("AVX2", "AVX-512"):  # x86 hosts of this project's kind: the kernels below AVX-512
        assert dispatch["torch"] == "AVX2" and "512" not in dispatch["numpy"] and "V4" not in dispatch["numpy"]
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "as_simd.py"), "sse9", "true"], capture_output=True)
    assert bad.returncode != 0 and b"LEVEL: avx2" in bad.stderr
