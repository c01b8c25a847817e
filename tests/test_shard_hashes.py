"""Every file of scripts/shard_hashes.py's conversions has the SHA-256 recorded in tests/data/shard_hashes.json:
moving code between modules changed no byte of any output."""

from __future__ import annotations

import importlib.util
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
    differences = script.compare(saved["conversions"], script.run_all())
    assert not differences, (
        f"{len(differences)} output file(s) differ from {RECORD.name}: compare against the commit that "
        "recorded them (git log -- tests/data/shard_hashes.json), e.g. by checking it out and converting "
        "with scripts/shard_hashes.py's options; record again only for an intended change of the bytes\n"
        + "\n".join(differences)
    )
