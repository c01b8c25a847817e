"""What a newcomer meets first: the README's two commands (what CI runs), the distribution's name,
version, licence and changelog."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import packer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from readme_commands import readme_command  # noqa: E402


def test_the_readme_marks_one_install_and_one_test_command():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    install, test = readme_command("install", text), readme_command("test", text)
    assert install.startswith('pip install -e ".[test]"') and "packer convert sample_data/" in install
    assert test == "python -m pytest"
    for command in (install, test):  # and the quick start shows them as written
        assert f"```\n{command}\n```" in text


def test_readme_command_refuses_a_missing_or_repeated_marker():
    block = "<!-- ci: test -->\n```\npython -m pytest\n```\n"
    assert readme_command("test", block) == "python -m pytest"
    with pytest.raises(ValueError, match="found 0"):
        readme_command("install", block)
    with pytest.raises(ValueError, match="found 2"):
        readme_command("test", block + block)
    with pytest.raises(ValueError, match="one line"):
        readme_command("test", "<!-- ci: test -->\n```\npip install .\npython -m pytest\n```\n")


def test_the_script_prints_what_ci_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_commands.py"), "test"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "readme_commands.py install" in ci and "readme_commands.py test" in ci
    assert "python3 -m venv" in ci and "torch==2.13.0" in ci


def test_the_distribution_has_its_own_name_and_one_version():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # not tomllib: Python 3.10 has none
    assert re.search(r'^name = "packer-datasets"$', pyproject, flags=re.M)
    assert re.search(r'^dynamic = \["version"\]$', pyproject, flags=re.M)
    assert not re.search(r'^version = "', pyproject, flags=re.M)  # no literal: the one version is packer.__version__
    assert 'version = { attr = "packer.__version__" }' in pyproject
    installed = importlib.metadata.distribution("packer-datasets")
    assert installed.version == packer.__version__
    assert [(e.name, e.value) for e in installed.entry_points if e.group == "console_scripts"] == [
        ("packer", "packer.cli:main")
    ]


def test_the_changelog_describes_this_version_and_the_licence_exists():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", changelog, flags=re.M)
    assert versions and versions[0] == packer.__version__  # newest first: what manifests record
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")


def test_the_readme_is_a_product_page_that_links_its_docs():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    for doc in (
        "docs/BENCHMARKS.md",
        "docs/READERS.md",
        "docs/DISTRIBUTED.md",
        "docs/FORMATS.md",
        "LICENSE",
        "CHANGELOG.md",
    ):
        assert f"]({doc}" in text and (ROOT / doc).is_file()


@pytest.mark.long
def test_the_suites_xdist_groups_keep_their_tests_in_one_process(tmp_path):
    """The suite's addopts run ``--dist loadgroup``: the tests of one xdist group (one Ray instance, one
    slow fixture) go to one process. A pytest and pytest-xdist pair where that silently stops (pytest
    9.2 with xdist 3.8) would make them again in every process: this runs a group on two processes."""
    import subprocess
    import sys

    (tmp_path / "test_groups.py").write_text(
        "import os, pytest\n"
        "@pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_grouped(i):\n"
        "    pass\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_free(i):\n"
        "    pass\n"
    )
    out = subprocess.run(
        # without hypothesis's plugin, which imports hypothesis in each of the three processes
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
        + ["-n", "2", "--dist", "loadgroup", "-v"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith("[gw") and "PASSED" in line]
    grouped = [words[0] for words in lines if "test_grouped[" in words[-1]]
    assert len(grouped) == 8 and len(set(grouped)) == 1, out.stdout[-2000:]  # [gw0] or [gw1], not both
