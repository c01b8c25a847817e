"""Every file of scripts/shard_hashes.py's conversions has the SHA-256 recorded in tests/data/shard_hashes.json:
moving code between modules changed no byte of any output."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "shard_hashes.py"
RECORD = Path(__file__).resolve().parent / "data" / "shard_hashes.json"


def load_script() -> ModuleType:
    """scripts/shard_hashes.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("shard_hashes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.long
def test_every_output_file_has_its_recorded_hash() -> None:
    """The conversions give the recorded bytes, unless the libraries that shape them are other versions."""
    script = load_script()
    saved = script.load_record(RECORD)
    versions = script.differing_versions(saved["versions"], script.installed_versions())
    if versions:
        pytest.skip(
            "library versions differ from those the hashes were recorded with, so bytes may legitimately "
            f"differ ({'; '.join(versions)}); re-record with: python scripts/shard_hashes.py record"
        )
    # The conversions run in a process of their own: they fork their workers (353 forks), and a fork
    # of this process, which has imported every test module's libraries, costs several times one of
    # a process that imported packer only. It imports this tree's packer (a script's own folder, not
    # the tree, would lead its sys.path), and a hung conversion fails the test.
    path = os.pathsep.join([str(SCRIPT.parent.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "check", "--record", str(RECORD)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=900,
    )
    assert done.returncode == 0, (
        f"output files differ from {RECORD.name}: compare against the commit that recorded them (git log -- "
        "tests/data/shard_hashes.json), e.g. by checking it out and converting with scripts/shard_hashes.py's "
        f"options; record again only for an intended change of the bytes\n{done.stdout}{done.stderr}"
    )
    assert f"all {len(saved['conversions'])} conversions as recorded" in done.stdout, done.stdout
